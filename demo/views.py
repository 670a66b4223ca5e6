"""The adapter from a session's run to the page's main outputs (live runs and replays alike), keyed by component."""

from __future__ import annotations

from dataclasses import dataclass, fields

import gradio as gr

from demo.captions import caption_html, round_caption, status_text
from demo.bandit_html import bandit_html
from demo.live import WAYS
from demo.charts import memory_chart, speed_chart
from demo.session import Session
from demo.tokens_html import conversation_html
from demo.tree_svg import tree_html

TREE_FONT = {False: 15, True: 21}  # node label size in px: normal, and the presenter's large type


@dataclass(frozen=True, eq=False)
class Stage:
    """The page's main outputs, which every run and replay fills."""

    conversation: gr.HTML
    caption: gr.HTML
    tree: gr.HTML
    round_slider: gr.Slider
    bandit: gr.HTML
    speed: gr.HTML
    memory: gr.HTML

    @property
    def outputs(self) -> list:
        """The components in a fixed order: the order the API returns their values in."""
        return [getattr(self, f.name) for f in fields(self)]


def tree_view(session: Session, index: int | None = None) -> str:
    """The tree of round `index` (the latest when None), at the session's type size; "of N" counts a replay's
    whole run."""
    total = len(session.replay.rounds) if session.replay else len(session.rounds)
    return tree_html(session.round_at(index), total, TREE_FONT[session.large])


BANDIT_WAITING = f"The bandit's arms show here when Drafting is “{WAYS['ucb']}”."


def bandit_view(record) -> str:
    """The bandit as it chose in `record`'s round (a placeholder without one)."""
    if record is None or record.bandit is None:
        return bandit_html(None, waiting=BANDIT_WAITING)
    return bandit_html(record.bandit, record.index)


def main_views(stage: Stage, session: Session, live: bool, plots: bool = True, status: str | None = None) -> dict:
    """One session's run on the stage: the answer, the caption, the tree and the bandit of one round; without
    `plots` the speed and memory plots keep what they show."""
    latest = session.round_at(None)
    n = len(session.rounds)
    text = status_text(session, live) if status is None else status
    views = {
        stage.conversation: conversation_html(session.prompt, session.rounds, live, text),
        stage.caption: caption_html(round_caption(latest)) if latest else "",
        stage.tree: tree_view(session),
        stage.round_slider: gr.Slider(minimum=1, maximum=max(n, 2), value=max(n, 1), step=1,
                                      interactive=n > 1),  # max > min always
    }
    views[stage.bandit] = bandit_view(latest)
    if plots:
        views[stage.speed] = speed_chart(session.rounds)
        views[stage.memory] = memory_chart(session.rounds)
    return views


def round_views(stage: Stage, number: float, session: Session | None) -> dict:
    """Caption, tree and bandit of round `number` (1-based), for the round slider."""
    record = session.round_at(int(number) - 1) if session else None
    if record is None:
        return gr.skip()
    return {stage.caption: caption_html(round_caption(record)), stage.tree: tree_view(session, record.index),
            stage.bandit: bandit_view(record)}


def round_outputs(stage: Stage) -> list:
    """What `round_views` writes."""
    return [stage.caption, stage.tree, stage.bandit]
