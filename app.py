"""The app: type a prompt and watch a Mamba drafter's token tree being checked by the target, round by round.

`python app.py` (or `make demo`) serves it on http://127.0.0.1:7860. The page is built from the pure render
functions in `demo/`; this file only lays out the Blocks, wires the events and launches. Models load in a
background thread as the server starts (once per process), never at import. `python app.py --replay-only` (or a
machine without torch) serves the Replay tab alone: recorded runs played back without any model.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import functools
import importlib.util
import math
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from demo import presenter
from demo.compare import compare_html, verdict_html
from demo.explainer import explainer_html
from demo.live import DEFAULTS, LOOKUP_BRANCH, METHODS, SETTINGS, live_panel
from demo.long_context import long_context_tab
from demo.charts import memory_chart, speed_chart
from demo.prompts import LONG_DOCUMENT, load_prompts, long_documents
from demo.replay import recorded_runs
from demo.replay_ui import replay_panel, wire_replay
from demo.runner import EngineThread
from demo.session import Session, write_export
from demo.tokens_html import conversation_html
from demo.tree_svg import tree_html
from demo.views import Stage, bandit_view, main_views, round_outputs, round_views
from specdec.config import MAX_SEED
from specdec.records import Summary
from specdec.registry import KINDS

ROOT = Path(__file__).resolve().parent
EXPORTS = Path(tempfile.gettempdir()) / "specdec-exports"
RUNS = ROOT / "assets" / "runs"  # recorded runs offered in the Replay tab (scripts/record_runs.py)
LONG_CONTEXT = ROOT / "assets" / "bench" / "long-context.json"  # `bench --long` result for the Long documents tab
PLOT_EVERY_S = 1.0  # the speed and memory plots are redrawn at most this often while streaming; the answer, the
# tree and the bandit every frame (demo.runner.FRAME_S)
CANCEL_WAIT_S = 2.0  # a cancelled `complete` waits this long for its engine run to end (a round takes far less)


@dataclass(frozen=True)
class Engine:
    """The three engine calls the app makes; `real_engine` wires `specdec`, tests pass a stand-in."""

    make_config: Callable[..., object]  # keyword settings -> validated config, ValueError when bad
    prepare: Callable[[object, Callable[[str], None]], object]  # (config, progress) -> models, loaded for it
    generate: Callable[..., Iterator]  # (models, prompt, config, stop, memory) -> RoundRecord..., Summary
    # `memory` is a dict that lives as long as the browser session: the bandit keeps learning there across runs


def real_engine(target: str, drafters: dict[str, str], device: str, dtype: str,
                drafter_dtype: str = "auto") -> Engine:
    """`specdec` behind the `Engine` calls (`drafters`: model spec by drafter kind); imported on first use so the
    page comes up at once."""

    @functools.cache
    def models():
        from specdec.models import Models

        return Models(target, drafters, device, dtype, drafter_dtype)

    def make_config(**settings):
        from specdec.config import GenerationConfig

        return GenerationConfig(**settings).validate()

    first_load = threading.Lock()  # the warm-up thread and a first request build one `Models`, not two

    def prepare(config, progress):
        from specdec.models import ModelLoadError

        try:
            with first_load:
                loaded = models()
            loaded.load(progress)
            if config.spec.has_model:
                loaded.drafter(config.spec.drafter, progress)
            return loaded
        except ModelLoadError as err:
            raise gr.Error(f"Could not load the models: {err}. The Replay tab still plays recorded runs.") from err

    def generate(models, prompt, config, stop, memory):
        from specdec.bandit import UCBBandit
        from specdec.engine import generate as run

        bandit = None
        if config.spec.policy == "ucb":  # one bandit per browser session, renewed when its settings change
            bandit = memory.get("bandit")
            new_prompt = prompt != memory.get("prompt")
            if bandit is None or not bandit.matches(config) or (new_prompt and settled_on_no_drafting(bandit)):
                bandit = memory["bandit"] = UCBBandit.for_config(config)
            memory["prompt"] = prompt
        return run(models, prompt, config, stop, bandit=bandit)

    return Engine(make_config, prepare, generate)


def settled_on_no_drafting(bandit) -> bool:
    """Whether the bandit's next choice is the arm that drafts nothing: after a run on text the drafter could not
    guess (or a run stopped early), a new prompt starts from the priors again rather than never drafting."""
    return bandit.arms[bandit.select()].depth == 0


@dataclass(frozen=True)
class Limits:
    """Per-request caps for a public deployment, from environment variables with safe defaults."""

    max_new_tokens: int = 512  # SPECDEC_MAX_NEW_TOKENS
    max_prompt_chars: int = 32000  # SPECDEC_MAX_PROMPT_CHARS: about the target's 8,192 tokens; the Space sets 9000
    queue_size: int = 32  # SPECDEC_QUEUE_SIZE: requests waiting beyond this are refused by the queue

    @classmethod
    def from_env(cls) -> Limits:
        env = os.environ.get
        return cls(int(env("SPECDEC_MAX_NEW_TOKENS", cls.max_new_tokens)),
                   int(env("SPECDEC_MAX_PROMPT_CHARS", cls.max_prompt_chars)),
                   int(env("SPECDEC_QUEUE_SIZE", cls.queue_size)))


def finite(name: str, value) -> float:
    """`value` as a float, or one sentence saying it is not a finite number."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        raise refused(f"Invalid settings: {name} must be a finite number, got {value!r}.")
    return number


def whole(name: str, value) -> int:
    """`value` as an int (ints stay exact beyond 2**53), or one sentence saying it is not a whole number."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    number = finite(name, value)
    if number != int(number):
        raise refused(f"Invalid settings: {name} must be a whole number, got {value!r}.")
    return int(number)


def settings_of(values: Mapping[str, object], limits: Limits = Limits()) -> dict:
    """The engine's keyword settings from the page's values by name (`SETTINGS`; a missing one takes its `DEFAULTS`
    value), as types: ranges are `GenerationConfig.validate`'s to check (once, when the run is set up); only this
    deployment's cap on new tokens is checked here."""
    if unknown := sorted(set(values) - set(SETTINGS)):
        raise refused(f"Unknown settings {', '.join(unknown)}; the settings are {', '.join(SETTINGS)}.")
    v = {**DEFAULTS, **values}
    tokens = whole("max_new_tokens", v["max_new_tokens"])
    if tokens > limits.max_new_tokens:
        raise refused(f"Invalid settings: at most {limits.max_new_tokens} new tokens per request here, got {tokens}.")
    return dict(method=v["method"], tree=(v["tree"] or "").strip() or None, arms=(v["arms"] or "").strip() or None,
                temperature=finite("temperature", v["temperature"]), max_new_tokens=tokens,
                seed=whole("the seed", 0 if v["seed"] is None else v["seed"]),
                lambda_ucb=finite("lambda_ucb", v["lambda_ucb"]), reward=v["reward"],
                lookup_branch=LOOKUP_BRANCH if v["lookup"] else 0,
                min_branch_q=finite("min_branch_q", v["min_branch_q"]),
                min_expand_q=finite("min_expand_q", v["min_expand_q"]))


def page_handler(handler, panel: dict, session: gr.State, limits: Limits):
    """`handler(prompt, settings, session, progress)` as a Gradio handler of the page's inputs, which Gradio hands
    over as one dict by component: the prompt, the settings (`panel`'s components named by `SETTINGS`) and the tab's
    session. Returns the handler and its inputs."""
    names = {panel[name]: name for name in SETTINGS}

    def on_page(values: dict, progress=gr.Progress()):
        settings = settings_of({names[c]: value for c, value in values.items() if c in names}, limits)
        yield from handler(checked_prompt(values[panel["prompt"]], limits), settings, values[session] or Session(),
                           progress)

    return on_page, {panel["prompt"], session, *names}


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # control characters other than tab and newline
SURROGATE = re.compile(r"[\ud800-\udfff]")  # halves of UTF-16 pairs that arrived unpaired


def checked_prompt(prompt: str | None, limits: Limits = Limits()) -> str:
    """The prompt without control characters (unpaired surrogates become U+FFFD), or one sentence saying why not."""
    text = SURROGATE.sub("\ufffd", CONTROL.sub("", str(prompt or "").replace("\r\n", "\n"))).strip()
    if not text:
        raise refused("Type a prompt first, or click one of the examples.")
    if len(text) > limits.max_prompt_chars:
        raise refused(f"The prompt has {len(text):,} characters; at most {limits.max_prompt_chars:,} are taken here.")
    return text


class OpenRuns:
    """How many engine runs are open (started and not yet ended, failed or closed): 0 whenever the app is idle."""

    def __init__(self) -> None:
        self.count, self._lock = 0, threading.Lock()

    def __enter__(self) -> None:
        with self._lock:
            self.count += 1

    def __exit__(self, *exc) -> None:
        with self._lock:
            self.count -= 1

    def track(self, events: Iterator) -> Iterator:
        """`events`, counted from its first step until it ends, fails or is closed."""
        with self:
            yield from events


STEP_STATUS = "Step mode: press “Step” (or the N key) again for the next round."


@dataclass(frozen=True, eq=False)
class Live:
    """The Live tab's runs over one engine: each handler is a generator of `{component: value}` updates that show
    one browser session's `Session` on the stage, the verdict, the comparison panel and the export button. Every
    model call runs on `worker`, the app's one engine thread; the handlers only draw what it produced."""

    engine: Engine
    worker: EngineThread
    stage: Stage
    comparison: gr.HTML
    verdict: gr.HTML
    export: gr.DownloadButton
    session: gr.State
    runs: OpenRuns = field(default_factory=OpenRuns)

    @property
    def outputs(self) -> list:
        """Every component the handlers write, in the order the API returns them."""
        return [*self.stage.outputs, self.comparison, self.verdict, self.export, self.session]

    def views(self, session: Session, live: bool, **options) -> dict:
        """`session` on the stage (`options` as `main_views` takes them) with its verdict, and as the tab's state."""
        return {**main_views(self.stage, session, live, **options), self.verdict: verdict_html(session, live),
                self.session: session}

    def generate(self, models, prompt: str, config, stop: threading.Event, memory: dict) -> Iterator:
        return self.runs.track(self.engine.generate(models, prompt, config, stop, memory))

    def setup(self, settings: dict, progress) -> tuple:
        """Validate the settings and load the models they need (on the engine thread); return (config, models)."""
        try:
            config = self.engine.make_config(**settings)
        except ValueError as err:
            raise refused(f"Invalid settings: {err}.") from err
        report = lambda message: progress(0.5, desc=message)  # noqa: E731 - the loader's progress, on the page
        return config, self.worker.call(lambda: self.engine.prepare(config, report))

    def opening(self, prompt: str, settings: dict, session: Session, progress) -> Iterator[dict]:
        """Show the fresh run at once, then validate and load: `config, models = yield from opening(...)`."""
        self.close_stepper(session)
        session.start(prompt, settings)
        yield {**self.views(session, live=True), self.comparison: gr.HTML(visible=False),
               self.export: gr.DownloadButton(interactive=False)}
        return self.setup(settings, progress)

    def stream(self, session: Session, events: Iterator, panel: Callable[[], dict] = dict) -> Iterator[dict]:
        """Run `events` on the engine thread into `session`, drawing its latest state once a frame (the speed and
        memory plots at most every PLOT_EVERY_S)."""
        last_plot = 0.0
        try:
            for batch in self.worker.frames(events, session.stop):
                for event in batch:
                    session.add(event)
                plots = time.monotonic() - last_plot >= PLOT_EVERY_S
                last_plot = time.monotonic() if plots else last_plot
                yield {**self.views(session, live=True, plots=plots), **panel()}
        except ValueError as err:
            raise refused(sentence(err)) from err

    def finish(self, session: Session, panel: Callable[[], dict] = dict) -> dict:
        if session.summary is not None and session.settings.get("method") == "ar":
            session.remember_target_alone()
        path = write_export(session, EXPORTS)
        return {**self.views(session, live=False), **panel(),
                self.export: gr.DownloadButton(value=str(path), interactive=True)}

    def run(self, prompt: str, settings: dict, session: Session, progress) -> Iterator[dict]:
        config, models = yield from self.opening(prompt, settings, session, progress)
        yield from self.stream(session, self.generate(models, session.prompt, config, session.stop, session.memory))
        yield self.finish(session)

    def compare(self, prompt: str, settings: dict, session: Session, progress) -> Iterator[dict]:
        """The target alone, then the chosen method, on the same prompt and the same engine thread; the
        comparison panel follows both."""
        config, models = yield from self.opening(prompt, settings, session, progress)
        session.comparing = True
        base = Session(session.prompt, {**settings, "method": "ar"}, stop=session.stop)
        base_config = self.engine.make_config(**base.settings)
        label = METHODS.get(settings["method"], settings["method"])

        def panel() -> dict:
            html = compare_html(base.rounds, base.summary, session.rounds, session.summary, label)
            return {self.comparison: gr.HTML(html, visible=True)}

        baseline_run = self.generate(models, base.prompt, base_config, session.stop, session.memory)
        yield from self.stream(base, baseline_run, panel)
        session.baseline = base.summary
        session.remember_target_alone(base.summary)
        if not session.stop.is_set():
            method_run = self.generate(models, session.prompt, config, session.stop, session.memory)
            yield from self.stream(session, method_run, panel)
        yield self.finish(session, panel)

    def step(self, prompt: str, settings: dict, session: Session, progress) -> Iterator[dict]:
        """One round of the session's paused run (a fresh one when the prompt or the settings changed)."""
        if session.stepper is None or session.settings != settings or session.prompt != (prompt or "").strip():
            config, models = yield from self.opening(prompt, settings, session, progress)
            session.stepper = self.generate(models, session.prompt, config, session.stop, session.memory)
        try:
            session.add(self.worker.call(lambda: next(session.stepper)))
        except ValueError as err:
            session.stepper = None
            raise refused(sentence(err)) from err
        if session.summary is not None:
            session.stepper = None
            yield self.finish(session)
            return
        yield {**self.views(session, live=False, status=STEP_STATUS), self.export: gr.DownloadButton(interactive=False)}

    def events(self, prompt: str, settings: dict, stop: threading.Event) -> Iterator:
        """Load, then decode on the engine thread: the run's events as they are made. Counted open from the start
        (a cancel during the models' load leaves it open until the load ends); a consumer that leaves early stops
        the run at its next round."""
        with self.runs:
            config, models = self.setup(settings, lambda fraction, desc=None: None)
            try:
                for batch in self.worker.frames(self.engine.generate(models, prompt, config, stop, {}), stop,
                                                interval=0):
                    yield from batch
            except ValueError as err:
                raise refused(sentence(err)) from err

    def answer(self, prompt: str, settings: dict, stop: threading.Event) -> dict:
        """Decode to the end (or to `stop`) and return `plain_answer`."""
        summary = None
        for event in self.events(prompt, settings, stop):
            summary = event if isinstance(event, Summary) else summary
        return plain_answer(summary)

    def records(self, prompt: str, settings: dict) -> Iterator[dict]:
        """The run as JSON, each round's record as soon as it is made, then the summary: `{"round": ...}`, ...,
        `{"summary": ...}`."""
        for event in self.events(prompt, settings, threading.Event()):
            yield {"summary" if isinstance(event, Summary) else "round": event.to_dict()}

    def close_stepper(self, session: Session) -> None:
        """Close the session's paused step run on the engine thread, where it runs; the session forgets it now, so
        a step run started after this is not the one closed."""
        stepper, session.stepper = session.stepper, None
        if stepper is not None:
            self.worker.submit(stepper.close)

    def close(self, session: Session | None) -> None:
        """The tab closed: its paused step run (and the target's cache it holds) is freed on the engine thread."""
        if session is not None:
            session.stop.set()
            self.close_stepper(session)


def stop_run(session: Session | None) -> None:
    """Stop: the session's run ends at its next round."""
    if session:
        session.stop.set()


def sentence(err: Exception) -> str:
    """An engine's error message as a sentence of its own."""
    text = str(err).strip()
    return f"{text[:1].upper()}{text[1:]}" + ("" if text.endswith(".") else ".")


def refused(message: str) -> gr.Error:
    """An expected user error: one sentence on the page and one line in the log, no traceback."""
    print(f"Refused a request: {message}", flush=True)
    return gr.Error(message, print_exception=False)


def wire_buttons(live: Live, panel: dict, limits: Limits) -> None:
    """Generate (the button and Enter in the prompt), Step, Compare and Stop: one model run at a time, page events
    only (the API is `wire_api`'s). Stop is enabled while one of them runs."""
    model_work = dict(concurrency_limit=1, concurrency_id="model", show_progress="minimal", api_visibility="private",
                      show_progress_on=live.stage.conversation)  # one indicator, where the answer appears
    stop = panel["stop"]
    for triggers, handler, name in (([panel["run"].click, panel["prompt"].submit], live.run, "generate"),
                                    ([panel["step"].click], live.step, "step"),
                                    ([panel["compare"].click], live.compare, "compare")):
        on_page, inputs = page_handler(handler, panel, live.session, limits)
        gr.on(triggers, lambda: gr.Button(interactive=True), None, stop, queue=False, api_visibility="private") \
            .then(on_page, inputs, live.outputs, api_name=name, **model_work) \
            .then(lambda: gr.Button(interactive=False), None, stop, queue=False, api_visibility="private")
    stop.click(stop_run, live.session, None, api_name="stop", queue=False, api_visibility="private")


def wire_api(live: Live, limits: Limits) -> None:
    """The API: `complete` (the answer as JSON), `rounds` (the run's round records streamed as JSON) and `status`.
    The page's own events are not part of it."""

    async def complete(prompt: str, method: str = DEFAULTS["method"], temperature: float = DEFAULTS["temperature"],
                       max_new_tokens: int = DEFAULTS["max_new_tokens"], seed: int = DEFAULTS["seed"],
                       tree: str | None = DEFAULTS["tree"], arms: str | None = DEFAULTS["arms"],
                       lambda_ucb: float = DEFAULTS["lambda_ucb"], reward: str = DEFAULTS["reward"],
                       lookup: bool = DEFAULTS["lookup"], min_branch_q: float = DEFAULTS["min_branch_q"],
                       min_expand_q: float = DEFAULTS["min_expand_q"]) -> dict:
        """Decode `prompt` to the end and return the answer as JSON: text, token ids and the run's figures."""
        given = dict(locals())  # the prompt and the settings, by name
        settings = settings_of({name: value for name, value in given.items() if name in SETTINGS}, limits)
        stop = threading.Event()
        worker = asyncio.ensure_future(asyncio.to_thread(live.answer, checked_prompt(prompt, limits), settings, stop))
        try:
            return await asyncio.shield(worker)
        except asyncio.CancelledError:  # the client cancelled: the engine ends at its next round; let it
            stop.set()
            await asyncio.wait({worker}, timeout=CANCEL_WAIT_S)
            raise

    def rounds(prompt: str, settings: dict | None = None) -> Iterator[dict]:
        """Decode `prompt` and stream the run as JSON: each round's record (`{"round": ...}`: its tree, the tokens
        it emitted, its timings and the bandit) as it is made, then `{"summary": ...}`. `settings`: any of
        `complete`'s keyword parameters by name; the others keep their defaults."""
        yield from live.records(checked_prompt(prompt, limits), settings_of(settings or {}, limits))

    def status() -> dict:
        """Engine runs open in this process: 0 when idle; a cancelled or stopped run closes within one round."""
        return {"engine_runs": live.runs.count}

    gr.api(complete, api_name="complete", concurrency_limit=1, concurrency_id="model")
    gr.api(rounds, api_name="rounds", concurrency_limit=1, concurrency_id="model")
    gr.api(status, api_name="status", queue=False)


def wire_live(engine: Engine, worker: EngineThread, panel: dict, stage: Stage, comparison: gr.HTML,
              verdict: gr.HTML, session: gr.State, limits: Limits) -> None:
    """The Live tab's events and the model endpoints, all over one count of open engine runs."""
    live = Live(engine, worker, stage, comparison, verdict, panel["export"], session)
    session.delete_callback = live.close  # a closed tab's paused run is freed
    wire_buttons(live, panel, limits)
    wire_api(live, limits)


def plain_answer(summary: Summary) -> dict:
    """What the `complete` API returns: the text, its token ids and the run's figures (JSON types only)."""
    return {"text": summary.text, "token_ids": list(summary.token_ids), "rounds": summary.rounds,
            "tokens_per_s": summary.tokens_per_s, "engine_tokens_per_s": summary.engine_tokens_per_s,
            "engine_seconds": summary.engine_seconds, "mean_accepted_len": summary.mean_accepted_len,
            "acceptance_rate": summary.acceptance_rate, "method": summary.method,
            "dtype": summary.extra.get("dtype"), "stop_reason": summary.stop_reason}


def explain(number: float, session: Session | None) -> str:
    """The explainer for the round on screen (the slider's), with the run's numbers."""
    record = session.round_at(int(number) - 1) if session else None
    return explainer_html(record, session.rounds if session else [], session.summary if session else None)


INTRO = (
    "### Speculative decoding with a Mamba drafter\n"
    "A small **drafter** guesses a *tree* of next tokens; the **target** checks the whole tree in one pass, so the "
    "text is the target's own in fewer passes. Pick an example, then **Generate**, **Step** or **Compare**."
)


def models_state(ready: threading.Event | None) -> None:
    """A line under the buttons saying whether the models are loaded yet, checked each second until they are."""

    def line() -> str:
        done = ready is None or ready.is_set()
        text = "Models ready." if done else "Loading the models… the first run waits for them."
        return f'<div class="sd-models" data-ready="{str(done).lower()}" style="font-size:14px;color:#555">{text}</div>'

    state = gr.HTML(line(), elem_id="models-state")
    timer = gr.Timer(1.0, active=ready is not None and not ready.is_set())
    timer.tick(lambda: (line(), gr.Timer(active=not (ready is None or ready.is_set()))), None, [state, timer],
               api_visibility="private", queue=False, show_progress="hidden")


def build_app(engine: Engine | None, prompts_dir: Path = ROOT / "assets" / "prompts", runs_dir: Path = RUNS,
              replay_only: str = "", limits: Limits | None = None, long_context: Path = LONG_CONTEXT,
              worker: EngineThread | None = None, ready: threading.Event | None = None) -> gr.Blocks:
    """The whole page. `engine=None` (with `replay_only` saying why) serves the Replay tab alone, no model;
    `limits` default to `Limits.from_env()`; `worker` is the thread every model call runs on (one of its own,
    started here, when not given); `ready` is set once the models are loaded (None: nothing to wait for)."""
    limits = limits or Limits.from_env()
    runs = recorded_runs(runs_dir)
    with gr.Blocks(title="Mamba drafters: speculative decoding", delete_cache=(1800, 3600)) as app:
        session = gr.State(None)  # this tab's `Session`, created by its first run or replay
        gr.Markdown(INTRO, elem_classes="sd-intro")
        with gr.Tabs(elem_id="page-tabs"):
            with gr.Tab("Demo", id="demo"):
                with gr.Row(equal_height=False, elem_id="main-row"):
                    with gr.Column(scale=2, min_width=340, elem_id="controls"):
                        with gr.Tabs(selected="replay" if engine is None else "live", elem_id="mode-tabs"):
                            with gr.Tab("Live", id="live", visible=engine is not None, elem_id="live-tab"):
                                examples = load_prompts(prompts_dir)
                                if long := long_documents(limits.max_prompt_chars):
                                    examples[LONG_DOCUMENT] = long
                                models_state(ready)
                                live = live_panel(examples)
                            with gr.Tab("Replay", id="replay", elem_id="replay-tab"):
                                replay = replay_panel(runs, replay_only)
                        toggles = presenter.view_toggles()
                    with gr.Column(scale=5, min_width=600, elem_id="stage"):
                        verdict = gr.HTML("", elem_id="verdict")
                        with gr.Row(equal_height=False):
                            with gr.Column(scale=3, min_width=360):
                                conversation = gr.HTML(conversation_html("", []), elem_id="conversation")
                                caption = gr.HTML("", elem_id="caption")
                            with gr.Column(scale=2, min_width=300):
                                round_slider = gr.Slider(1, 2, value=1, step=1, label="Round (drag to go back)",
                                                         interactive=False, elem_id="round-slider")
                                tree_view = gr.HTML(tree_html(None), elem_id="tree")
                        comparison = gr.HTML("", visible=False, elem_id="comparison")
                        bandit_plot = gr.HTML(bandit_view(None), elem_id="bandit-plot")
                gr.Markdown("## Live graphs")
                with gr.Row():
                    speed_plot = gr.HTML(speed_chart([]), elem_id="speed-plot")
                    memory_plot = gr.HTML(memory_chart([]), elem_id="memory-plot")
            with gr.Tab("Long documents", id="long"):
                long_context_tab(long_context)
            with gr.Tab("How it works", id="explainer") as explainer_tab:
                explainer = gr.HTML(explainer_html(None, []), elem_id="explainer")

        stage = Stage(conversation, caption, tree_view, round_slider, bandit_plot, speed_plot, memory_plot)
        if engine is not None:
            wire_live(engine, worker or EngineThread().start(), live, stage, comparison, verdict, session, limits)
        wire_replay(replay, runs, session, stage)
        presenter.wire_view(app, *toggles, live["collapsible"], session, tree_view, round_slider)
        round_slider.input(functools.partial(round_views, stage), [round_slider, session], round_outputs(stage),
                           api_name=False, concurrency_limit=None, show_progress="hidden", trigger_mode="always_last")
        explainer_tab.select(explain, [round_slider, session], explainer, api_name=False, queue=False)
    app.queue(default_concurrency_limit=1, max_size=limits.queue_size)
    return app


def page_look() -> dict:
    """The page's style, its script run on load (the URL's view switches, the "next round" key) and theme: what
    `launch` takes, so that the page built by `build_app` is launched with them."""
    return dict(css=presenter.CSS, js=presenter.ON_LOAD, theme=gr.themes.Default(primary_hue="blue"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description="Serve the speculative-decoding app.")
    p.add_argument("--host", default=env("SPECDEC_HOST", "127.0.0.1"), help="address to listen on [SPECDEC_HOST]")
    p.add_argument("--port", type=int, default=int(env("SPECDEC_PORT", "7860")), help="port [SPECDEC_PORT]")
    p.add_argument("--target", default=env("SPECDEC_TARGET", "smollm2-135m-instruct"),
                   help="target model: preset, folder, .gguf or hub id [SPECDEC_TARGET]")
    for kind in KINDS.values():
        if kind.flag:
            p.add_argument(kind.flag, *kind.aliases, dest=kind.option, default=env(kind.env, kind.model),
                           help=f"{kind.summary} [{kind.env}]")
    p.add_argument("--device", default=env("SPECDEC_DEVICE", "auto"), help="auto, cpu, cuda or mps [SPECDEC_DEVICE]")
    p.add_argument("--dtype", default=env("SPECDEC_DTYPE", "auto"),
                   help="target dtype: auto, float32, bfloat16 or float16 [SPECDEC_DTYPE]")
    p.add_argument("--drafter-dtype", default=env("SPECDEC_DRAFTER_DTYPE", "auto"),
                   help="drafter dtype: auto, float32, bfloat16 or float16 [SPECDEC_DRAFTER_DTYPE]")
    p.add_argument("--replay-only", action="store_true",
                   help="serve only the Replay tab (recorded runs, no model is loaded) [SPECDEC_REPLAY_ONLY=1]")
    args = p.parse_args(argv)
    args.replay_only = args.replay_only or env("SPECDEC_REPLAY_ONLY", "") == "1"
    return args


def missing_runtime() -> str:
    """Why no model can run here ('' when torch and transformers are installed); checked without importing them."""
    absent = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    return f"{' and '.join(absent)} {'is' if len(absent) == 1 else 'are'} not installed" if absent else ""


def hub_models(args: argparse.Namespace) -> list[str]:
    """The models asked for that are neither presets nor local files: they would be fetched from the hub."""
    from specdec.models import PRESETS

    specs = (args.target, *drafter_specs(args).values())
    return [s for s in specs if s not in PRESETS and not Path(s).expanduser().exists()]


def drafter_specs(args: argparse.Namespace) -> dict[str, str]:
    """The drafter models asked for, by kind."""
    return {kind.name: getattr(args, kind.option) for kind in KINDS.values() if kind.flag}


def warm_up(engine: Engine, worker: EngineThread, ready: threading.Event) -> None:
    """Load the default method's models on the engine thread, so the first click does not wait for them; the log
    says when they are ready."""

    def load() -> None:
        try:
            engine.prepare(engine.make_config(method=DEFAULTS["method"]), lambda message: None)
            ready.set()
            print("Models ready: the page answers at the engine's speed now.", flush=True)
        except gr.Error as err:  # the first request reports it again, in its own page
            print(f"Background model load failed: {err.message}", flush=True)

    worker.submit(load)


def return_large_frees_to_the_os() -> None:
    """glibc: serve every block of 128 KiB or more with its own mapping, returned to the system when freed.

    By default glibc raises that threshold as large blocks are freed, and then keeps them in its per-thread arenas.
    A round allocates tensors of [rows, vocabulary] whose row count changes with the drafted tree, on the server's
    worker threads, so the arenas would hold ever more freed pages of odd sizes."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD; fixing it turns the raising off
    except (OSError, AttributeError):  # not glibc: nothing to set
        pass


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    why = "started with --replay-only" if args.replay_only else missing_runtime()
    if not why and hub_models(args) and os.environ.get("SPECDEC_ALLOW_HUB_MODELS", "") != "1":
        raise SystemExit(f"Refusing to serve hub models {', '.join(hub_models(args))}: set "
                         "SPECDEC_ALLOW_HUB_MODELS=1 to allow model ids that are not presets or local files.")
    if not why:
        return_large_frees_to_the_os()
    engine = None if why else real_engine(args.target, drafter_specs(args), args.device, args.dtype,
                                          args.drafter_dtype)
    notice = f"Replay-only mode ({why}): no model is loaded here; pick a recorded run or load an exported one." \
        if why else ""
    print(f"Serving on http://{args.host}:{args.port} " + (f"in replay-only mode ({why})" if why else
                                                          "(models are loading in the background)"), flush=True)
    worker, ready = EngineThread(), threading.Event()
    page = build_app(engine, replay_only=notice, worker=worker, ready=None if engine is None else ready)
    page.launch(server_name=args.host, server_port=args.port, show_error=True, footer_links=["api", "gradio"],
                prevent_thread_lock=True, **page_look())
    if engine is None:
        page.block_thread()
        return
    warm_up(engine, worker, ready)  # after the page is up: the loading's imports would hold up the server's
    try:
        worker.serve()  # every model call runs on this, the main thread, from now on
    except KeyboardInterrupt:
        page.close()


if __name__ == "__main__":
    main()
