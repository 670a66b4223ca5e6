"""The Live tab's controls: prompt, buttons, settings (collapsible) and example prompts."""

from __future__ import annotations

import gradio as gr

LOOKUP_BRANCH = 6  # tokens of the prompt-lookup branch when it is switched on (specdec.config.LOOKUP_BRANCH)
LOOKUP_DEFAULT = True
LAMBDA_UCB = 0.3  # the bandit's default exploration weight (specdec.config.GenerationConfig.lambda_ucb)

METHODS = {  # value -> (label in the UI, one-line explanation)
    "mamba-ucb": ("Mamba tree + bandit", "A Mamba drafter drafts a tree; a UCB bandit picks its shape each round."),
    "mamba-tree": ("Mamba, fixed tree", "A Mamba drafter drafts a tree of the shape set under Advanced."),
    "mamba-chain": ("Mamba chain", "A Mamba drafter drafts a single chain of tokens (no branching)."),
    "mamba-feat-ucb": ("Mamba reading the target + bandit",
                       "A Mamba drafter that also reads the target's last hidden state (free from each check) "
                       "drafts a tree; a bandit picks its shape. Needs a drafter trained for this target."),
    "mamba-feat-chain": ("Mamba reading the target, chain",
                         "The Mamba drafter that reads the target's hidden state drafts a single chain."),
    "mamba-feat-tree": ("Mamba reading the target, fixed tree",
                        "The Mamba drafter that reads the target's hidden state drafts a tree of a fixed shape."),
    "tf-tree": ("Transformer drafter, tree", "A small Transformer drafter (with a KV cache) drafts a fixed tree."),
    "tf-chain": ("Transformer drafter, chain", "A small Transformer drafter drafts a single chain."),
    "lookup-chain": ("Prompt lookup", "No drafter model: copy what followed the last matching words of the text."),
    "ar": ("Target only", "No drafting: the target writes one token per step (the baseline)."),
}
SETTINGS = ("method", "temperature", "max_new_tokens", "seed", "tree", "arms", "lambda_ucb", "reward", "lookup")

# The page picks a method as a drafter and a way of drafting; value -> (label, what it costs and buys, {way: method})
DRAFTERS = {
    "mamba": ("Mamba (plug-in)", "Trained once on the target's answers; works beside any target with the same "
              "tokenizer, with no retraining. Its state is fixed-size (1.4 MiB here) however long the text.",
              {"ucb": "mamba-ucb", "tree": "mamba-tree", "chain": "mamba-chain"}),
    "mamba-feat": ("Mamba reading the target", "Also reads the target's last hidden state, which each check "
                   "computes anyway: more to go on per token, but trained for this one target (4.2 MiB) and "
                   "useless with any other.",
                   {"ucb": "mamba-feat-ucb", "tree": "mamba-feat-tree", "chain": "mamba-feat-chain"}),
    "tf": ("Transformer", "A small Transformer drafter: its KV cache, and its step, grow with the text.",
           {"tree": "tf-tree", "chain": "tf-chain"}),
    "lookup": ("None: prompt lookup", "No model: copies what followed the last matching words of the text. "
               "Free; helps on summaries and edits.", {"chain": "lookup-chain"}),
    "none": ("None: target only", "No drafting: the baseline every other choice is measured against.",
             {"none": "ar"}),
}
WAYS = {"ucb": "Tree, shape chosen by a bandit", "tree": "Fixed tree", "chain": "Chain", "none": "One token per step"}


def _note(text: str) -> str:
    return f"<span style='color:#444'>{text}</span>"


def describe(method: str) -> str:
    return _note(METHODS[method][1])


def describe_drafter(drafter: str) -> str:
    return _note(DRAFTERS[drafter][1])


def method_of(drafter: str, way: str) -> str:
    """The method a drafter and a way of drafting name; a way the drafter lacks falls back to its first."""
    ways = DRAFTERS[drafter][2]
    return ways.get(way, next(iter(ways.values())))


def on_drafter(drafter: str) -> tuple:
    """A new drafter: its ways of drafting (the first chosen), the method they name, its cost line."""
    ways = DRAFTERS[drafter][2]
    first = next(iter(ways))
    return (gr.Radio(choices=[(WAYS[w], w) for w in ways], value=first, interactive=len(ways) > 1),
            ways[first], describe_drafter(drafter))


def settings_panel() -> dict:
    """Method and decoding settings, by the names of `SETTINGS`.

    The method is chosen as a drafter and a way of drafting; the `method` radio they set stays hidden, and is the
    one input the handlers and the API read (so an API call may name any method)."""
    drafter = gr.Radio([(v[0], k) for k, v in DRAFTERS.items()], value="mamba", label="Drafter", elem_id="drafter")
    drafter_info = gr.HTML(describe_drafter("mamba"), elem_id="drafter-info")
    way = gr.Radio([(WAYS[w], w) for w in DRAFTERS["mamba"][2]], value="ucb", label="Drafting", elem_id="way")
    c = {"method": gr.Radio([(v[0], k) for k, v in METHODS.items()], value="mamba-ucb", label="Method",
                            visible=False)}
    info = gr.HTML(describe("mamba-ucb"), elem_id="method-info")
    drafter.input(on_drafter, drafter, [way, c["method"], drafter_info], api_name=False, queue=False)
    way.input(method_of, [drafter, way], c["method"], api_name=False, queue=False)
    c["method"].change(describe, c["method"], info, api_name=False, queue=False)
    c["temperature"] = gr.Slider(0.0, 1.5, value=0.0, step=0.05, label="Temperature",
                                 info="0 = greedy: always the most likely token")
    c["max_new_tokens"] = gr.Slider(8, 512, value=96, step=8, label="Max new tokens", elem_id="max-new-tokens")
    c["seed"] = gr.Number(value=0, precision=0, label="Seed", info="Same seed, same sampled text")
    c["lookup"] = gr.Checkbox(value=LOOKUP_DEFAULT, label="Also copy from the text (prompt lookup)",
                              info=f"Mamba and Transformer methods: when the last words already occurred, the "
                                   f"{LOOKUP_BRANCH} tokens that followed them join the tree as one more branch "
                                   "(tagged “copy”). Helps most on summaries and edits.", elem_id="lookup-branch")
    with gr.Accordion("Advanced", open=False):
        c["tree"] = gr.Textbox(label="Tree shape", placeholder="e.g. 3,2,1 (or 4 for a chain)",
                               info="Children per node at each depth, for the fixed-tree and chain methods.")
        c["arms"] = gr.Textbox(label="Bandit arms", placeholder="e.g. 4; 2,2,1; 3,1,1",
                               info="Tree shapes the bandit chooses from, separated by ';'.")
        c["lambda_ucb"] = gr.Slider(0.0, 1.0, value=LAMBDA_UCB, step=0.05, label="λ_UCB",
                                    info="Weight of exploration in the bandit's UCB score")
        c["reward"] = gr.Radio([("throughput: measured tokens/s", "throughput"),
                                ("paper: fewer target passes per token", "paper")], value="throughput",
                               label="Bandit reward")
    return c


def live_panel(prompts: dict[str, list[dict]]) -> dict:
    """Prompt, buttons, settings and examples; returned by name (the settings by the names of `SETTINGS`)."""
    c = {"prompt": gr.Textbox(label="Prompt", lines=3, max_lines=12, elem_id="prompt",
                              placeholder="Ask something, e.g. “Explain why the sky is blue.”")}
    with gr.Row():
        c["run"] = gr.Button("▶ Generate", variant="primary", elem_id="generate-btn")
        c["step"] = gr.Button("Step one round", elem_id="step-btn")
        c["compare"] = gr.Button("⚖ Compare", elem_id="compare-btn")
    with gr.Row():
        c["stop"] = gr.Button("■ Stop", variant="stop", elem_id="stop-btn")
        c["export"] = gr.DownloadButton("⬇ Export JSON", interactive=False, elem_id="export-btn")
    with gr.Accordion("Settings", open=True, elem_id="settings") as settings:
        c.update(settings_panel())
    with gr.Accordion("Examples (click one to use it)", open=True, elem_id="examples") as examples:
        with gr.Tabs():
            for kind, items in prompts.items():
                with gr.Tab(kind.capitalize()):
                    gr.Examples([[p["prompt"]] for p in items], inputs=[c["prompt"]], examples_per_page=4,
                                label=None)
    c["collapsible"] = [settings, examples]
    return c
