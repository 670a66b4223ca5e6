"""Compare mode: the same prompt decoded by the target alone, then by the chosen method, side by side."""

from __future__ import annotations

import html

from demo.plots import running_rate
from demo.tokens_html import stream_html
from specdec.records import RoundRecord, Summary


def speed(rounds: list[RoundRecord], summary: Summary | None) -> float:
    """Tokens per second: the summary's when the run is over, else the running rate so far."""
    if summary is not None:
        return summary.tokens_per_s
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


def headline(base: Summary | None, run: Summary | None, label: str) -> str:
    if base is None:
        return "Step 1 of 2: the target alone writes the answer, one token per pass…"
    if run is None:
        return f"Step 2 of 2: now “{label}” writes the same answer…"
    ratio = run.tokens_per_s / base.tokens_per_s if base.tokens_per_s > 0 else 0.0
    same = "identical text" if run.token_ids == base.token_ids else "the texts differ (a different sample or rounding)"
    return (f"Speed-up: {ratio:.2f}× ({run.tokens_per_s:.1f} vs {base.tokens_per_s:.1f} tokens/s), "
            f"{run.rounds} instead of {base.rounds} target passes, {same}.")


def compare_html(base_rounds: list[RoundRecord], base: Summary | None, rounds: list[RoundRecord],
                 run: Summary | None, label: str) -> str:
    """Both texts, both speeds and the speed-up (when both runs are done)."""
    head = (f'<div class="sd-compare-head" style="font-size:18px;font-weight:600;margin-bottom:8px;color:#111">'
            f"{html.escape(headline(base, run, label))}</div>")
    cols = (_column("Target alone", base_rounds, base, "waiting…")
            + _column(label, rounds, run, "waits for the target-only run…"))
    row = f'<div style="display:flex;gap:12px;flex-wrap:wrap">{cols}</div>'
    return f'<div class="sd-compare" style="color:#111">{head}{row}</div>'
