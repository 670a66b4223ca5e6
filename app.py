"""The app: type a prompt and watch a Mamba drafter's token tree being checked by the target, round by round.

`python app.py` (or `make demo`) serves it on http://127.0.0.1:7860. The page is built from the pure render
functions in `demo/`; this file only lays out the Blocks, wires the events and launches. Models load on the
first request (once per process), never at import.
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from demo.captions import caption_html, round_caption, status_text
from demo.compare import compare_html
from demo.plots import bandit_figure, memory_figure, speed_figure
from demo.prompts import load_prompts
from demo.runner import in_background
from demo.session import Session, write_export
from demo.tokens_html import conversation_html
from demo.tree_svg import tree_html

ROOT = Path(__file__).resolve().parent
EXPORTS = Path(tempfile.gettempdir()) / "specdec-exports"
PLOT_EVERY_S = 1.0  # plots are re-drawn at most this often while streaming; text and tree every round batch
LOOKUP_BRANCH = 6  # tokens of the prompt-lookup branch when it is switched on (specdec.config.LOOKUP_BRANCH)
LOOKUP_DEFAULT = True

METHODS = {  # value -> (label in the UI, one-line explanation)
    "mamba-ucb": ("Mamba tree + bandit", "A Mamba drafter drafts a tree; a UCB bandit picks its shape each round."),
    "mamba-tree": ("Mamba, fixed tree", "A Mamba drafter drafts a tree of the shape set under Advanced."),
    "mamba-chain": ("Mamba chain", "A Mamba drafter drafts a single chain of tokens (no branching)."),
    "tf-tree": ("Transformer drafter, tree", "A small Transformer drafter (with a KV cache) drafts a fixed tree."),
    "tf-chain": ("Transformer drafter, chain", "A small Transformer drafter drafts a single chain."),
    "lookup-chain": ("Prompt lookup", "No drafter model: copy what followed the last matching words of the text."),
    "ar": ("Target only", "No drafting: the target writes one token per step (the baseline)."),
}


@dataclass(frozen=True)
class Engine:
    """The three engine calls the app makes; `real_engine` wires `specdec`, tests pass a stand-in."""

    make_config: Callable[..., object]  # keyword settings -> validated config, ValueError when bad
    prepare: Callable[[object, Callable[[str], None]], object]  # (config, progress) -> models, loaded for it
    generate: Callable[..., Iterator]  # (models, prompt, config, stop, memory) -> RoundRecord..., Summary
    # `memory` is a dict that lives as long as the browser session: the bandit keeps learning there across runs


def real_engine(target: str, drafter: str, tf_drafter: str, device: str, dtype: str,
                drafter_dtype: str = "auto") -> Engine:
    """`specdec` behind the `Engine` calls; imported on first use so the page comes up at once."""

    @functools.cache
    def models():
        from specdec.models import Models

        return Models(target, drafter, tf_drafter, device, dtype, drafter_dtype)

    def make_config(**settings):
        from specdec.config import GenerationConfig

        return GenerationConfig(**settings).validate()

    def prepare(config, progress):
        from specdec.models import ModelLoadError

        try:
            loaded = models()
            loaded.load(progress)
            if config.spec.has_model:
                loaded.drafter(config.spec.drafter, progress)
            return loaded
        except ModelLoadError as err:
            raise gr.Error(f"Could not load the models: {err}") from err

    def generate(models, prompt, config, stop, memory):
        from specdec.bandit import UCBBandit
        from specdec.engine import generate as run

        bandit = None
        if config.spec.policy == "ucb":  # one bandit per browser session, renewed when its settings change
            bandit = memory.get("bandit")
            if bandit is None or not bandit.matches(config):
                bandit = memory["bandit"] = UCBBandit.for_config(config)
        return run(models, prompt, config, stop, bandit=bandit)

    return Engine(make_config, prepare, generate)


# ---------------------------------------------------------------- adapter: session -> UI values


def main_views(session: Session, live: bool, plots: bool = True) -> list:
    """The adapter: one session's run as values for conversation, caption, tree, round slider and the 3 plots."""
    latest = session.round_at(None)
    n = len(session.rounds)
    html = [
        conversation_html(session.prompt, session.rounds, live, status_text(session, live)),
        caption_html(round_caption(latest)) if latest else "",
        tree_html(latest, n),
        gr.Slider(minimum=1, maximum=max(n, 2), value=max(n, 1), step=1, interactive=n > 1),  # max > min always
    ]
    if not plots:
        return html + [gr.skip()] * 3
    bandit = bandit_figure(latest.bandit if latest else None, latest.index if latest else None)
    return html + [bandit, speed_figure(session.rounds), memory_figure(session.rounds)]


def settings_of(method, temperature, max_new_tokens, seed, tree, arms, lambda_ucb, reward, lookup) -> dict:
    return dict(method=method, tree=(tree or "").strip() or None, arms=(arms or "").strip() or None,
                temperature=float(temperature), max_new_tokens=int(max_new_tokens), seed=int(seed or 0),
                lambda_ucb=float(lambda_ucb), reward=reward, lookup_branch=LOOKUP_BRANCH if lookup else 0)


def page_handler(handler):
    """`handler(prompt, settings, session, progress)` as a Gradio handler of the page's 11 inputs."""

    def on_page(prompt, method, temperature, max_new_tokens, seed, tree, arms, lambda_ucb, reward, lookup, session,
                progress=gr.Progress()):
        settings = settings_of(method, temperature, max_new_tokens, seed, tree, arms, lambda_ucb, reward, lookup)
        yield from handler(prompt, settings, session or Session(), progress)

    return on_page


def checked_prompt(prompt: str | None) -> str:
    if not (prompt or "").strip():
        raise gr.Error("Type a prompt first, or click one of the examples below the settings.")
    return prompt.strip()


def build_app(engine: Engine, prompts_dir: Path = ROOT / "assets" / "prompts") -> gr.Blocks:
    """The whole page; every handler below is a generator of UI updates over one session's `Session`."""

    def begin(prompt, settings, session):
        """Start a fresh run in `session`; show the prompt and a loading line at once, before anything slow."""
        session.start(checked_prompt(prompt), settings)
        return main_views(session, live=True) + [gr.HTML(visible=False), gr.DownloadButton(interactive=False), session]

    def setup(settings, progress):
        """Validate the settings and load the models they need; return (config, models)."""
        try:
            config = engine.make_config(**settings)
        except ValueError as err:
            raise gr.Error(f"Invalid settings: {err}") from err
        return config, engine.prepare(config, lambda message: progress(0.5, desc=message))

    def stream(session, events, panel=gr.skip):
        """Feed engine events into `session`, yielding UI values as they come (plots at most every PLOT_EVERY_S)."""
        last_plot = 0.0
        try:
            for batch in in_background(events, session.stop):
                for event in batch:
                    session.add(event)
                plots = time.monotonic() - last_plot >= PLOT_EVERY_S
                last_plot = time.monotonic() if plots else last_plot
                yield main_views(session, live=True, plots=plots) + [panel(), gr.skip(), session]
        except ValueError as err:
            raise gr.Error(str(err)) from err

    def finish(session, panel=gr.skip):
        path = write_export(session, EXPORTS)
        return main_views(session, live=False) + [panel(), gr.DownloadButton(value=str(path), interactive=True),
                                                  session]

    def opening(prompt, settings, session, progress):
        """Show the fresh run at once, then validate and load: `config, models = yield from opening(...)`."""
        yield begin(prompt, settings, session)
        return setup(settings, progress)

    @page_handler
    def run(prompt, settings, session, progress):
        config, models = yield from opening(prompt, settings, session, progress)
        yield from stream(session, engine.generate(models, session.prompt, config, session.stop,
                                                   session.memory))
        yield finish(session)

    @page_handler
    def compare(prompt, settings, session, progress):
        config, models = yield from opening(prompt, settings, session, progress)
        base = Session(session.prompt, {**settings, "method": "ar"}, stop=session.stop)
        base_config = engine.make_config(**base.settings)
        label = METHODS.get(settings["method"], (settings["method"],))[0]

        def panel():
            return gr.HTML(compare_html(base.rounds, base.summary, session.rounds, session.summary, label),
                           visible=True)

        baseline_run = engine.generate(models, base.prompt, base_config, session.stop, session.memory)
        yield from stream(base, baseline_run, panel)
        session.baseline = base.summary
        if not session.stop.is_set():
            method_run = engine.generate(models, session.prompt, config, session.stop, session.memory)
            yield from stream(session, method_run, panel)
        yield finish(session, panel)

    @page_handler
    def step(prompt, settings, session, progress):
        if session.stepper is None or session.settings != settings or session.prompt != (prompt or "").strip():
            config, models = yield from opening(prompt, settings, session, progress)
            session.stepper = engine.generate(models, session.prompt, config, session.stop, session.memory)
        try:
            session.add(next(session.stepper))
        except ValueError as err:
            session.stepper = None
            raise gr.Error(str(err)) from err
        if session.summary is not None:
            session.stepper = None
            yield finish(session)
            return
        views = main_views(session, live=False)
        views[0] = conversation_html(session.prompt, session.rounds, False,
                                     "Step mode: press “Step one round” again for the next round.")
        yield views + [gr.skip(), gr.DownloadButton(interactive=False), session]

    def show_round(number, session):
        record = session.round_at(int(number) - 1) if session else None
        if record is None:
            return gr.skip(), gr.skip(), gr.skip()
        return (caption_html(round_caption(record)), tree_html(record, len(session.rounds)),
                bandit_figure(record.bandit, record.index))

    def stop(session):
        if session:
            session.stop.set()

    def describe(method):
        return f"<span style='color:#444'>{METHODS[method][1]}</span>"

    prompts = load_prompts(prompts_dir)
    with gr.Blocks(title="Mamba drafters: speculative decoding", delete_cache=(1800, 3600)) as app:
        session = gr.State(None)  # this tab's `Session`, created by its first run
        gr.Markdown(
            "# Speculative decoding with a Mamba drafter\n"
            "A small, fast **drafter** guesses a *tree* of possible next tokens; the large **target** model checks the "
            "whole tree in one pass, keeps the longest branch it agrees with and adds one token of its own. "
            "The text is exactly what the target alone would write (with temperature 0), only produced in fewer "
            "target passes. A bandit learns which tree shape pays off best.\n\n"
            "**Try it:** pick an example or type a prompt, then press **Generate** (the whole answer), "
            "**Step one round** (one round per click, explained) or **Compare** (the target alone, then the chosen "
            "method)."
        )
        with gr.Row(equal_height=False):
            with gr.Column(scale=2, min_width=360):
                prompt = gr.Textbox(label="Prompt", lines=3, max_lines=12, elem_id="prompt",
                                    placeholder="Ask something, e.g. “Explain why the sky is blue.”")
                with gr.Row():
                    run_btn = gr.Button("▶ Generate", variant="primary", elem_id="generate-btn")
                    step_btn = gr.Button("Step one round", elem_id="step-btn")
                    compare_btn = gr.Button("⚖ Compare", elem_id="compare-btn")
                with gr.Row():
                    stop_btn = gr.Button("■ Stop", variant="stop", elem_id="stop-btn")
                    export_btn = gr.DownloadButton("⬇ Export JSON", interactive=False, elem_id="export-btn")
                method = gr.Radio([(v[0], k) for k, v in METHODS.items()], value="mamba-ucb", label="Method")
                method_info = gr.HTML(describe("mamba-ucb"))
                temperature = gr.Slider(0.0, 1.5, value=0.0, step=0.05, label="Temperature",
                                        info="0 = greedy: always the most likely token")
                max_new_tokens = gr.Slider(8, 512, value=96, step=8, label="Max new tokens",
                                           elem_id="max-new-tokens")
                seed = gr.Number(value=0, precision=0, label="Seed", info="Same seed, same sampled text")
                lookup = gr.Checkbox(value=LOOKUP_DEFAULT, label="Also copy from the text (prompt lookup)",
                                     info=f"Mamba and Transformer methods: when the last words already occurred, "
                                          f"the {LOOKUP_BRANCH} tokens that followed them join the tree as one more "
                                          "branch (tagged “copy”). Helps most on summaries and edits.",
                                     elem_id="lookup-branch")
                with gr.Accordion("Advanced", open=False):
                    tree = gr.Textbox(label="Tree shape", placeholder="e.g. 3,2,1 (or 4 for a chain)",
                                      info="Children per node at each depth, for the fixed-tree and chain methods.")
                    arms = gr.Textbox(label="Bandit arms", placeholder="e.g. 4; 2,2,1; 3,1,1",
                                      info="Tree shapes the bandit chooses from, separated by ';'.")
                    lambda_ucb = gr.Slider(0.0, 1.0, value=0.1, step=0.05, label="λ_UCB",
                                           info="Weight of exploration in the bandit's UCB score")
                    reward = gr.Radio([("paper: fewer target passes per token", "paper"),
                                       ("throughput: measured tokens/s", "throughput")], value="paper",
                                      label="Bandit reward")
                gr.Markdown("**Examples** (click one to use it)")
                with gr.Tabs():
                    for kind, items in prompts.items():
                        with gr.Tab(kind.capitalize()):
                            gr.Examples([[p["prompt"]] for p in items], inputs=[prompt], examples_per_page=4,
                                        label=None)
            with gr.Column(scale=3, min_width=420):
                conversation = gr.HTML(conversation_html("", []), elem_id="conversation")
                caption = gr.HTML("", elem_id="caption")
                comparison = gr.HTML("", visible=False, elem_id="comparison")
        gr.Markdown("## The draft tree of one round\nHover a node for its drafter probability *q* and target "
                    "probability *p*. Drag the slider to go back to any earlier round.")
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                round_slider = gr.Slider(1, 2, value=1, step=1, label="Round", interactive=False,
                                         elem_id="round-slider")
                tree_view = gr.HTML(tree_html(None), elem_id="tree")
            with gr.Column(scale=2):
                bandit_plot = gr.Plot(bandit_figure(None), label="Bandit arms", elem_id="bandit-plot")
        gr.Markdown("## Live graphs")
        with gr.Row():
            speed_plot = gr.Plot(speed_figure([]), label="Speed", elem_id="speed-plot")
            memory_plot = gr.Plot(memory_figure([]), label="Memory", elem_id="memory-plot")

        main = [conversation, caption, tree_view, round_slider, bandit_plot, speed_plot, memory_plot]
        inputs = [prompt, method, temperature, max_new_tokens, seed, tree, arms, lambda_ucb, reward, lookup, session]
        model_work = dict(concurrency_limit=1, concurrency_id="model", show_progress="minimal")
        outputs = main + [comparison, export_btn, session]
        run_btn.click(run, inputs, outputs, api_name="generate", **model_work)
        prompt.submit(run, inputs, outputs, api_name=False, **model_work)
        step_btn.click(step, inputs, outputs, api_name="step", **model_work)
        compare_btn.click(compare, inputs, outputs, api_name="compare", **model_work)
        stop_btn.click(stop, session, None, api_name="stop", queue=False)
        round_slider.input(show_round, [round_slider, session], [caption, tree_view, bandit_plot], api_name=False,
                           concurrency_limit=None, show_progress="hidden", trigger_mode="always_last")
        method.change(describe, method, method_info, api_name=False, queue=False)
    app.queue(default_concurrency_limit=1, max_size=32)
    return app


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description="Serve the speculative-decoding app.")
    p.add_argument("--host", default=env("SPECDEC_HOST", "127.0.0.1"), help="address to listen on [SPECDEC_HOST]")
    p.add_argument("--port", type=int, default=int(env("SPECDEC_PORT", "7860")), help="port [SPECDEC_PORT]")
    p.add_argument("--target", default=env("SPECDEC_TARGET", "smollm2-135m-instruct"),
                   help="target model: preset, folder, .gguf or hub id [SPECDEC_TARGET]")
    p.add_argument("--drafter", default=env("SPECDEC_DRAFTER", "mamba-smollm2"),
                   help="Mamba drafter [SPECDEC_DRAFTER]")
    p.add_argument("--tf-drafter", default=env("SPECDEC_TF_DRAFTER", "tf-smollm2"),
                   help="Transformer drafter [SPECDEC_TF_DRAFTER]")
    p.add_argument("--device", default=env("SPECDEC_DEVICE", "auto"), help="auto, cpu, cuda or mps [SPECDEC_DEVICE]")
    p.add_argument("--dtype", default=env("SPECDEC_DTYPE", "auto"),
                   help="target dtype: auto, float32, bfloat16 or float16 [SPECDEC_DTYPE]")
    p.add_argument("--drafter-dtype", default=env("SPECDEC_DRAFTER_DTYPE", "auto"),
                   help="drafter dtype: auto (bfloat16 on a CPU with native bf16, else the target's), float32, "
                        "bfloat16 or float16 [SPECDEC_DRAFTER_DTYPE]")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    engine = real_engine(args.target, args.drafter, args.tf_drafter, args.device, args.dtype, args.drafter_dtype)
    print(f"Serving on http://{args.host}:{args.port} (models load on the first request)", flush=True)
    build_app(engine).launch(server_name=args.host, server_port=args.port, show_error=True,
                             footer_links=["api", "gradio"],
                             theme=gr.themes.Default(primary_hue="blue"))


if __name__ == "__main__":
    main()
