"""The Live tab's controls: prompt, buttons, settings (collapsible) and example prompts.

The drafters, their methods and the defaults come from `specdec.registry` and `specdec.config` (both torch-free);
this module only adds the page's words for them.
"""

from __future__ import annotations

import gradio as gr

from specdec.config import LAMBDA_UCB, LOOKUP_BRANCH, METHODS as ENGINE_METHODS, REWARDS, GenerationConfig
from specdec.registry import KINDS, DrafterKind

# The settings' values as the page opens, by the handlers' input names; `lookup` grafts a LOOKUP_BRANCH branch
DEFAULTS = dict(method=GenerationConfig.method, temperature=GenerationConfig.temperature, max_new_tokens=96,
                seed=GenerationConfig.seed, tree=None, arms=None, lambda_ucb=LAMBDA_UCB[GenerationConfig.reward],
                reward=GenerationConfig.reward, lookup=True, min_branch_q=GenerationConfig.min_branch_q,
                min_expand_q=GenerationConfig.min_expand_q)
SETTINGS = tuple(DEFAULTS)  # their names: the page hands its values over by name, the API takes them as keywords

# Ways of drafting, by policy, in the order the page offers them
WAYS = {"ucb": "Tree, shape chosen by a bandit", "tree": "Fixed tree", "chain": "Chain", "none": "One token per step"}
REWARD_TEXT = {"pooled": "tokens/s, acceptance shared by the shapes", "throughput": "measured tokens/s per shape",
               "paper": "fewer target passes per token"}


def ways_of(kind: DrafterKind) -> dict[str, str]:
    """{way of drafting: method} of a drafter kind, in the order of `WAYS`."""
    methods = {policy: method for method, policy in kind.methods.items()}
    return {way: methods[way] for way in WAYS if way in methods}


DRAFTERS = {name: ways_of(kind) for name, kind in KINDS.items()}  # the page's drafter radio, in the registry's order


def label(method: str) -> str:
    """A method's name in the page: its drafter's label, and the way of drafting where the drafter has several."""
    drafter = ENGINE_METHODS[method].drafter
    ways = DRAFTERS[drafter]
    if len(ways) == 1:
        return KINDS[drafter].label
    return f"{KINDS[drafter].label} · {WAYS[ENGINE_METHODS[method].policy]}"


METHODS = {method: label(method) for ways in DRAFTERS.values() for method in ways.values()}  # method -> label


def _note(text: str) -> str:
    return f"<span style='color:#444'>{text}</span>"


def describe(method: str) -> str:
    text = ENGINE_METHODS[method].description
    return _note(f"{text[:1].upper()}{text[1:]}.")


def describe_drafter(drafter: str) -> str:
    return _note(KINDS[drafter].blurb)


def method_of(drafter: str, way: str) -> str:
    """The method a drafter and a way of drafting name; a way the drafter lacks falls back to its first."""
    ways = DRAFTERS[drafter]
    return ways.get(way, next(iter(ways.values())))


def on_drafter(drafter: str) -> tuple:
    """A new drafter: its ways of drafting (the first chosen), the method they name, its cost line."""
    ways = DRAFTERS[drafter]
    first = next(iter(ways))
    return (gr.Radio(choices=[(WAYS[w], w) for w in ways], value=first, interactive=len(ways) > 1),
            ways[first], describe_drafter(drafter))


def settings_panel() -> dict:
    """Method and decoding settings, by the names of `SETTINGS`.

    The method is chosen as a drafter and a way of drafting; the `method` radio they set stays hidden, and is the
    one input the handlers and the API read (so an API call may name any method)."""
    first = ENGINE_METHODS[DEFAULTS["method"]]
    drafter = gr.Radio([(kind.label, name) for name, kind in KINDS.items()], value=first.drafter, label="Drafter",
                       elem_id="drafter")
    drafter_info = gr.HTML(describe_drafter(first.drafter), elem_id="drafter-info")
    way = gr.Radio([(WAYS[w], w) for w in DRAFTERS[first.drafter]], value=first.policy, label="Drafting",
                   elem_id="way")
    c = {"method": gr.Radio([(text, method) for method, text in METHODS.items()], value=DEFAULTS["method"],
                            label="Method", visible=False)}
    info = gr.HTML(describe(DEFAULTS["method"]), elem_id="method-info")
    drafter.input(on_drafter, drafter, [way, c["method"], drafter_info], api_name=False, queue=False)
    way.input(method_of, [drafter, way], c["method"], api_name=False, queue=False)
    c["method"].change(describe, c["method"], info, api_name=False, queue=False)
    c["temperature"] = gr.Slider(0.0, 1.5, value=DEFAULTS["temperature"], step=0.05, label="Temperature",
                                 info="0 = greedy: always the most likely token")
    c["max_new_tokens"] = gr.Number(DEFAULTS["max_new_tokens"], precision=0, label="Max new tokens",
                                    elem_id="max-new-tokens", info="A number out of range is refused, not changed")
    c["seed"] = gr.Number(value=DEFAULTS["seed"], precision=0, label="Seed", info="Same seed, same sampled text")
    c["lookup"] = gr.Checkbox(value=DEFAULTS["lookup"], label="Also copy from the text (prompt lookup)",
                              info=f"Mamba and Transformer methods: when the last words already occurred, the "
                                   f"{LOOKUP_BRANCH} tokens that followed them join the tree as one more branch "
                                   "(tagged “copy”). Helps most on summaries and edits.", elem_id="lookup-branch")
    with gr.Accordion("Advanced", open=False):
        c["tree"] = gr.Textbox(DEFAULTS["tree"], label="Tree shape", placeholder="e.g. 3,2,1 (or 4 for a chain)",
                               info="Children per node at each depth, for the fixed-tree and chain methods.")
        c["arms"] = gr.Textbox(DEFAULTS["arms"], label="Bandit arms", placeholder="e.g. 4; 2,2,1; 3,1,1",
                               info="Tree shapes the bandit chooses from, separated by ';'.")
        c["lambda_ucb"] = gr.Slider(0.0, 1.0, value=DEFAULTS["lambda_ucb"], step=0.05, label="λ_UCB",
                                    elem_id="lambda-ucb", info="Weight of exploration in the bandit's UCB score "
                                                               "(each reward sets its default: 0.1 pooled, 0.3 the "
                                                               "others)")
        c["reward"] = gr.Radio([(f"{r}: {REWARD_TEXT[r]}", r) for r in REWARDS], value=DEFAULTS["reward"],
                               label="Bandit reward", elem_id="bandit-reward")
        # picking a reward sets λ_UCB to that reward's default (the user may move it after)
        c["reward"].input(LAMBDA_UCB.get, c["reward"], c["lambda_ucb"], api_name=False, queue=False)
        c["min_branch_q"] = gr.Slider(0.0, 0.9, value=DEFAULTS["min_branch_q"], step=0.01,
                                      label="Trim the tree by the drafter's confidence: keep a node from",
                                      elem_id="min-branch-q",
                                      info="Greedy decoding leaves out a drafted node whose branch the drafter "
                                           "gives a probability below this (each node costs a row of the "
                                           "target's pass). Output is exact either way.")
        c["min_expand_q"] = gr.Slider(0.0, 1.0, value=DEFAULTS["min_expand_q"], step=0.01,
                                      label="… and draft a node's children from", elem_id="min-expand-q",
                                      info="A node gets children only if the drafter's probability of its branch "
                                           "is at least this (each level costs a drafter step). Both 0: every "
                                           "node of the shape.")
    return c


def example_kinds(prompts: dict[str, list[dict]]) -> list[tuple[str, str]]:
    """The example categories as the page's radio offers them: (label, kind)."""
    return [(kind.capitalize(), kind) for kind in prompts]


def example_choices(items: list[dict]) -> list[tuple[str, int]]:
    """One category's examples as radio choices: each shown whole by its label (or its prompt), by index."""
    return [(p.get("label", p["prompt"]), i) for i, p in enumerate(items)]


def live_panel(prompts: dict[str, list[dict]]) -> dict:
    """Prompt, buttons, examples and settings (folded); returned by name (the settings by the names of
    `SETTINGS`)."""
    c = {"prompt": gr.Textbox(label="Prompt", lines=2, max_lines=8, elem_id="prompt",
                              placeholder="Ask something, e.g. “Explain why the sky is blue.”")}
    with gr.Row(elem_id="run-buttons"):
        c["run"] = gr.Button("▶ Generate", variant="primary", elem_id="generate-btn", min_width=90)
        c["step"] = gr.Button("Step ›", elem_id="step-btn", min_width=90)
        c["compare"] = gr.Button("⚖ Compare", elem_id="compare-btn", min_width=90)
    with gr.Row(elem_id="run-controls"):
        c["stop"] = gr.Button("■ Stop", variant="stop", interactive=False, elem_id="stop-btn", min_width=90,
                              size="sm")
        c["export"] = gr.DownloadButton("⬇ Export JSON", interactive=False, elem_id="export-btn", min_width=90,
                                        size="sm")
    with gr.Accordion("Examples (click one to use it)", open=True, elem_id="examples") as examples:
        first = next(iter(prompts), None)
        kind = gr.Radio(example_kinds(prompts), value=first, show_label=False, elem_id="example-kind")
        listed = gr.Radio(example_choices(prompts.get(first, [])), value=None, show_label=False,
                          elem_id="example-list")

        def show_kind(chosen: str) -> gr.Radio:
            return gr.Radio(example_choices(prompts.get(chosen, [])), value=None)

        def pick(chosen: str, index: int | None) -> str:
            items = prompts.get(chosen, [])
            return items[index]["prompt"] if index is not None and 0 <= index < len(items) else gr.skip()

        kind.change(show_kind, kind, listed, api_visibility="private", queue=False)
        listed.input(pick, [kind, listed], c["prompt"], api_visibility="private", queue=False)
    with gr.Accordion("Settings", open=False, elem_id="settings") as settings:
        c.update(settings_panel())
    c["collapsible"] = [settings, examples]
    return c
