"""One plain-language sentence per round (step mode) and per finished run."""

from __future__ import annotations

import html

from demo.charts import running_rate
from demo.session import Session
from demo.tree_svg import target_token
from specdec.records import RoundRecord, Summary

STOP_REASONS = {
    "max_new_tokens": "it reached the token limit",
    "eos": "the model ended its answer",
    "stopped": "you pressed Stop",
}


def quoted(text: str) -> str:
    return "“" + text.replace("\n", "↵") + "”"


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def round_caption(record: RoundRecord) -> str:
    """E.g. 'Round 4: the drafter proposed 9 tokens in a (3,2,1) tree; the target accepted 3 and added 1 (bonus).'"""
    head = f"Round {record.index + 1}: "
    added = target_token(record)
    own = f"{quoted(added[0])}, {'a bonus token' if added[1] == 'bonus' else 'a correction'}" if added else ""
    drafted = len(record.nodes) - 1
    if drafted <= 0:
        return head + f"nothing was drafted; the target produced 1 token on its own ({own})."
    where = "a chain" if all(n == 1 for n in record.shape) else f"a {record.shape_name} tree"
    accepted = "".join(t.text for t in record.emitted if t.source == "draft")
    took = f"accepted {record.accepted_len} ({quoted(accepted)})" if record.accepted_len else "accepted none of them"
    tail = f" and added 1 of its own ({own})" if added else ""
    copied = sum(n.copied for n in record.nodes)
    proposed = f"the drafter proposed {_count(drafted - copied, 'token')} in {where}"
    if record.drafter_read_target:
        proposed += " (it read the target's hidden state at the last accepted token, its own guesses below the root)"
    if copied:
        proposed += f" and prompt lookup {_count(copied, 'token')} copied from the text"
    return head + f"{proposed}; the target {took}{tail}."


def summary_caption(summary: Summary) -> str:
    """E.g. 'Done: 64 tokens in 18 rounds (3.6 per round) at 41.2 tokens/s; stopped because it reached the limit.'"""
    why = STOP_REASONS.get(summary.stop_reason, summary.stop_reason)
    rate = f"; {summary.acceptance_rate:.0%} of checked drafts accepted" if summary.acceptance_rate is not None else ""
    return (f"Done: {_count(summary.new_tokens, 'token')} in {_count(summary.rounds, 'round')} "
            f"({summary.mean_accepted_len:.1f} per round) at {summary.engine_tokens_per_s:.1f} tokens/s{rate}; "
            f"stopped because {why}.")


def replay_status(session: Session, live: bool) -> str:
    """The line under a replayed answer: what to press, how far it has played, or the recorded summary."""
    replay = session.replay
    n, total = len(session.rounds), len(replay.rounds)
    if session.summary and not live:
        where = replay.recorded.get("device")
        return summary_caption(session.summary) + f" (Replayed{f'; recorded on {where}' if where else ''}.)"
    if not n:
        return (f"Replay loaded: {_count(total, 'round')}, no model needed. Press ▶ Play, or “Next round” "
                "(or the N key) to go one round at a time.")
    rate = running_rate(session.rounds)[-1]
    return (f"Replay · round {n} of {total} · {session.rounds[-1].new_tokens_total} tokens · "
            f"{rate:.1f} tokens/s as recorded")


def status_text(session: Session, live: bool) -> str:
    """The line under the answer: loading, progress while generating, or the summary when done."""
    if session.replay is not None:
        return replay_status(session, live)
    if session.summary and not live:
        drafter = str(session.summary.extra.get("drafter", ""))
        note = (" Note: the trained drafter is not installed, so an untrained one stands in and few drafts are "
                "accepted." if drafter.startswith("random") else "")
        dtype = session.summary.extra.get("dtype")
        return summary_caption(session.summary) + (f" Target in {dtype}." if dtype else "") + note
    if not session.rounds:
        return "Loading the models (first run only) and reading the prompt…" if live else ""
    last = session.rounds[-1]
    rate = running_rate(session.rounds)[-1]
    return f"Generating… round {last.index + 1} · {last.new_tokens_total} tokens · {rate:.1f} tokens/s"


def caption_html(text: str) -> str:
    """A sentence in a highlighted box, large enough to read on a projector."""
    style = ("font-size:17px;line-height:1.5;padding:8px 12px;border-left:4px solid #0072b2;background:#f4f8fb;"
             "color:#111")
    return f'<div class="sd-caption" style="{style}">{html.escape(text)}</div>' if text else ""
