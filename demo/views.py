"""The adapter from a session's run to the values of the page's main outputs (live runs and replays alike)."""

from __future__ import annotations

import gradio as gr

from demo.captions import caption_html, round_caption, status_text
from demo.plots import bandit_figure, memory_figure, speed_figure
from demo.session import Session
from demo.tokens_html import conversation_html
from demo.tree_svg import tree_html

TREE_FONT = {False: 15, True: 21}  # node label size in px: normal, and the presenter's large type


def tree_view(session: Session, index: int | None = None) -> str:
    """The tree of round `index` (the latest when None), at the session's type size; "of N" counts a replay's
    whole run."""
    total = len(session.replay.rounds) if session.replay else len(session.rounds)
    return tree_html(session.round_at(index), total, TREE_FONT[session.large])


def main_views(session: Session, live: bool, plots: bool = True, status: str | None = None) -> list:
    """One session's run as values for conversation, caption, tree, round slider and the 3 plots."""
    latest = session.round_at(None)
    n = len(session.rounds)
    text = status_text(session, live) if status is None else status
    html = [
        conversation_html(session.prompt, session.rounds, live, text),
        caption_html(round_caption(latest)) if latest else "",
        tree_view(session),
        gr.Slider(minimum=1, maximum=max(n, 2), value=max(n, 1), step=1, interactive=n > 1),  # max > min always
    ]
    if not plots:
        return html + [gr.skip()] * 3
    bandit = bandit_figure(latest.bandit if latest else None, latest.index if latest else None)
    return html + [bandit, speed_figure(session.rounds), memory_figure(session.rounds)]


def round_views(number: float, session: Session | None) -> tuple:
    """Caption, tree and bandit of round `number` (1-based), for the round slider."""
    record = session.round_at(int(number) - 1) if session else None
    if record is None:
        return gr.skip(), gr.skip(), gr.skip()
    return caption_html(round_caption(record)), tree_view(session, record.index), bandit_figure(record.bandit,
                                                                                                record.index)
