"""The Replay tab: pick a recorded run (or load an exported JSON) and play it back round by round, at a chosen
speed or one round per click, into the page's own answer, tree, bandit and plots. No model is loaded."""

from __future__ import annotations

import html
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from demo.replay import Replay, load_replay, recorded_on
from demo.session import Session
from demo.views import Stage, main_views


@dataclass
class ReplayPanel:
    """The tab's controls, for `wire_replay`."""

    run: gr.Dropdown
    upload: gr.File
    play: gr.Button
    step: gr.Button
    pause: gr.Button
    speed: gr.Slider
    info: gr.HTML


def replay_panel(runs: dict[str, Path], notice: str = "") -> ReplayPanel:
    """The controls (inside the caller's Tab). `notice`: why only replay is possible here, if it is."""
    if notice:
        gr.HTML(f'<div class="sd-replay-only" style="font-size:16px;padding:8px 12px;background:#fff4e0;'
                f'border-left:4px solid #e69f00;color:#111">{html.escape(notice)}</div>')
    run = gr.Dropdown(list(runs), value=None, label="Recorded runs", elem_id="replay-run",
                      info="Recorded from the real models; nothing is computed while they play.")
    upload = gr.File(label="…or load an exported run (Export JSON)", file_types=[".json"], type="filepath",
                     elem_id="replay-file", height=130)
    with gr.Row():
        play = gr.Button("▶ Play", variant="primary", elem_id="replay-play-btn")
        step = gr.Button("Next round", elem_id="replay-step-btn")
        pause = gr.Button("❚❚ Pause", elem_id="replay-pause-btn")
    speed = gr.Slider(0.5, 10, value=2, step=0.5, label="Speed (rounds per second)", elem_id="replay-speed")
    info = gr.HTML("", elem_id="replay-info")
    return ReplayPanel(run, upload, play, step, pause, speed, info)


def describe(replay: Replay) -> str:
    """Where the run came from: the prompt's size, method, settings; then its speed as recorded and the machine
    and dtype it was recorded on, since a replay's speed is that machine's, not this one's."""
    s, rec = replay.settings, replay.recorded
    parts = [f"{len(replay.rounds)} rounds", f"method {s.get('method', '?')}",
             f"temperature {s.get('temperature', '?')}"]
    if s.get("lookup_branch"):
        parts.append(f"lookup branch {s['lookup_branch']}")
    parts += [f"{k} {rec[k]}" for k in ("target_dtype", "drafter_dtype", "drafter") if k in rec]
    speed = f"{replay.summary.tokens_per_s:.1f} tokens/s" if replay.summary else "speed not recorded"
    return (f'<div style="font-size:15px;color:#333"><b>{html.escape(replay.name)}</b>: '
            f"{html.escape(', '.join(str(p) for p in parts))}<br>"
            f'<span class="sd-recorded-on">{html.escape(f"{speed}, {recorded_on(rec)}")}</span></div>')


def loaded(replay: Replay, session: Session | None) -> Session:
    """Start `replay` in the session (forgetting its previous run): the prompt, no rounds yet."""
    session = session or Session()
    session.start(replay.prompt, replay.settings)
    session.replay = replay
    return session


def finished(session: Session) -> bool:
    return len(session.rounds) >= len(session.replay.rounds)


def advance(session: Session) -> None:
    """Add the replay's next round; with the last one, its summary."""
    if not finished(session):
        session.add(session.replay.rounds[len(session.rounds)])
    if finished(session):
        session.summary = session.replay.summary


def wire_replay(panel: ReplayPanel, runs: dict[str, Path], session: gr.State, stage: Stage) -> None:
    """Events of the panel: each handler shows the session's replay on `stage` and keeps the session."""
    outputs = [*stage.outputs, panel.info, session]

    def shown(state: Session, live: bool = False) -> dict:
        return {**main_views(stage, state, live), session: state}

    def start(replay: Replay, state: Session | None) -> dict:
        return {**shown(loaded(replay, state)), panel.info: describe(replay)}

    def pick(title: str | None, state: Session | None) -> dict:
        return start(load_replay(runs[title]), state) if title else gr.skip()

    def upload(path: str | None, state: Session | None) -> dict:
        if not path:
            return gr.skip()
        try:
            replay = load_replay(Path(path))
        except ValueError as err:
            raise gr.Error(f"Cannot replay this file: {err}") from err
        return start(replay, state)

    def ready(state: Session | None) -> Session:
        if state is None or state.replay is None:
            raise gr.Error("Pick a recorded run or load an exported JSON first.")
        return state

    def play(speed: float, state: Session | None) -> Iterator[dict]:
        state = ready(state)
        if finished(state):  # played to the end: from the start again
            state.rounds, state.summary = [], None
        state.stop.clear()
        while not state.stop.is_set() and not finished(state):
            advance(state)
            yield shown(state, live=not finished(state))
            time.sleep(0 if finished(state) else 1.0 / max(float(speed), 0.1))
        yield shown(state)  # paused or done: no cursor

    def step(state: Session | None) -> dict:
        state = ready(state)
        advance(state)
        return shown(state)

    def pause(state: Session | None) -> None:
        if state is not None:
            state.stop.set()

    quick = dict(api_name=False, show_progress="hidden")
    panel.run.change(pick, [panel.run, session], outputs, **quick)
    panel.upload.upload(upload, [panel.upload, session], outputs, **quick)
    panel.play.click(play, [panel.speed, session], outputs, concurrency_limit=None, api_name="replay_play",
                     api_visibility="private", show_progress="hidden")
    panel.step.click(step, session, outputs, concurrency_limit=None, api_name="replay_step",
                     api_visibility="private", show_progress="hidden")
    panel.pause.click(pause, session, None, queue=False, api_name=False)
