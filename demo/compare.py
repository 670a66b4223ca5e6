"""The verdict above the answer, and Compare mode: the same prompt decoded by the target alone, then by the chosen
method, side by side.

Every speed shown here is the engine's own: tokens over the seconds of the prompt's pass, the drafter's start and
the rounds (`Summary.engine_seconds`), the ratio `bench` reports; the time the page spent drawing is not in it.
"""

from __future__ import annotations

import html

from demo.live import METHODS
from demo.charts import running_rate
from demo.session import Session
from demo.tokens_html import stream_html
from specdec.records import RoundRecord, Summary


def speed(rounds: list[RoundRecord], summary: Summary | None) -> float:
    """Tokens per second: the engine's whole-run rate when the run is over, else the rounds' running rate."""
    if summary is not None:
        return summary.engine_tokens_per_s
    return running_rate(rounds)[-1] if rounds else 0.0


def _column(title: str, rounds: list[RoundRecord], summary: Summary | None, waiting: str) -> str:
    if not rounds and summary is None:
        body, line = f'<div style="color:#666">{html.escape(waiting)}</div>', ""
    else:
        tokens = summary.new_tokens if summary else rounds[-1].new_tokens_total
        n = summary.rounds if summary else len(rounds)
        state = "" if summary else " (running)"
        body = stream_html(rounds, live=summary is None)
        line = f"{speed(rounds, summary):.1f} tokens/s · {tokens} tokens in {n} target passes{state}"
    return (
        f'<div class="sd-compare-col" style="flex:1;min-width:240px;border:1px solid #d0d0d0;border-radius:10px;'
        f'padding:10px 12px;background:#fff">'
        f'<div style="font-weight:600;font-size:16px;margin-bottom:6px">{html.escape(title)}</div>'
        f'<div style="font-size:16px;line-height:1.8">{body}</div>'
        f'<div class="sd-compare-speed" style="margin-top:8px;font-size:15px;color:#333">{html.escape(line)}</div>'
        "</div>"
    )


def speedup(run: Summary, base: Summary) -> float:
    """How many times faster `run` went than `base`, in the engine's own seconds (0 when either has none)."""
    if base.engine_tokens_per_s <= 0:
        return 0.0
    return run.engine_tokens_per_s / base.engine_tokens_per_s


def headline(base: Summary | None, run: Summary | None, label: str) -> str:
    if base is None:
        return "Step 1 of 2: the target alone writes the answer, one token per pass…"
    if run is None:
        return f"Step 2 of 2: now “{label}” writes the same answer…"
    same = "identical text" if run.token_ids == base.token_ids else "the texts differ (a different sample or rounding)"
    return (f"Speed-up: {speedup(run, base):.2f}× ({run.engine_tokens_per_s:.1f} vs {base.engine_tokens_per_s:.1f} "
            f"tokens/s), {run.rounds} instead of {base.rounds} target passes, {same}.")


def compare_html(base_rounds: list[RoundRecord], base: Summary | None, rounds: list[RoundRecord],
                 run: Summary | None, label: str) -> str:
    """Both texts and both speeds, side by side (the verdict stands above the answer)."""
    cols = (_column("Target alone", base_rounds, base, "waiting…")
            + _column(label, rounds, run, "waits for the target-only run…"))
    return f'<div class="sd-compare" style="color:#111;display:flex;gap:12px;flex-wrap:wrap">{cols}</div>'


def pass_seconds(rounds: list[RoundRecord]) -> float | None:
    """The measured cost of one target pass in a run: its cheapest verification (a tree's pass costs at least a
    plain step, so an estimate built on it errs low)."""
    timed = [r.verify_ms for r in rounds if r.verify_ms > 0]
    return min(timed) / 1e3 if timed else None


def estimated_speedup(rounds: list[RoundRecord], run: Summary) -> float | None:
    """The target alone's time estimated from this run (its prompt pass, plus one measured target pass per new
    token) over the run's own: the target passes saved times the cost of a pass."""
    step = pass_seconds(rounds)
    if step is None or run.engine_seconds <= 0:
        return None
    return (run.prefill_ms / 1e3 + run.new_tokens * step) / run.engine_seconds


def verdict(rounds: list[RoundRecord], run: Summary | None, base: Summary | None, label: str,
            comparing: bool) -> str:
    """One sentence above the answer: how fast this run went against the target alone."""
    if comparing:
        return headline(base, run, label)
    if run is None:
        return ""
    if run.method == "ar":
        return (f"The target alone: {run.new_tokens} tokens at {run.engine_tokens_per_s:.1f} tokens/s, one pass a "
                "token. Generate with a drafter to see how much faster it goes.")
    head = f"{run.new_tokens} tokens at {run.engine_tokens_per_s:.1f} tokens/s in {run.rounds} target passes · "
    if base is not None:
        return head + (f"{speedup(run, base):.2f}× the target alone (its run of this prompt in this tab, "
                       f"{base.engine_tokens_per_s:.1f} tokens/s).")
    estimate = estimated_speedup(rounds, run)
    if estimate is None:
        return head.rstrip(" ·") + "."
    return head + (f"about {estimate:.2f}× the target alone (estimated: {run.new_tokens - run.rounds} target passes "
                   "saved at this run's cost of a pass; Compare measures it).")


def verdict_block(text: str) -> str:
    if not text:
        return ""
    style = "font-size:17px;font-weight:600;line-height:1.45;color:#111;padding:8px 12px;border-radius:8px;" \
            "background:#eef5ee;border:1px solid #b9d6b9"
    return f'<div class="sd-verdict" style="{style}">{html.escape(text)}</div>'


def verdict_html(session: Session, live: bool) -> str:
    """The verdict on the session's run (none for a replay, whose speeds are another machine's)."""
    if session.replay is not None:
        return ""
    label = METHODS.get(session.settings.get("method", ""), session.settings.get("method", ""))
    base = session.baseline if session.comparing else session.target_alone()
    if live and not session.comparing:
        return ""
    return verdict_block(verdict(session.rounds, session.summary, base, label, session.comparing))
