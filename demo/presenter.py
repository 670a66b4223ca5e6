"""Presenter view: a page style that puts the answer and the round's tree side by side on one screen, large type,
and a keyboard key for "next round". Switched on by its checkbox or the URL (`?presenter`, `?large`).

The view is a class on `<body>` (`sd-presenter`, `sd-large`) that the page's CSS (`CSS`, which `launch` takes)
reads; the checkboxes' Python side collapses the settings and redraws the tree in the larger type.
"""

from __future__ import annotations

import gradio as gr

from demo.session import Session
from demo.views import tree_view

NEXT_KEYS = ("n", "N", "ArrowRight", "PageDown")  # PageDown and → are what presentation clickers send

CSS = """
.gradio-container > .main { padding-top: 0 !important; }
.sd-intro h3 { margin: 4px 0 2px 0 !important; }
#run-buttons button { white-space: nowrap; padding-left: 6px; padding-right: 6px; }
#example-list { max-height: 232px; overflow-y: auto; }
#example-list label { width: 100%; font-size: 14px; padding: 4px 8px !important; line-height: 1.3; }
#example-kind label { padding: 3px 8px !important; }
#verdict:empty, #verdict .prose:empty { display: none; }
body.sd-presenter .sd-intro, body.sd-presenter #method-info { display: none; }
body.sd-presenter .gradio-container > .main { max-width: none !important; padding: 0 12px !important; }
body.sd-presenter #controls { flex: 0 0 300px !important; min-width: 280px !important; max-width: 320px; }
body.sd-presenter #stage { min-width: 0 !important; }
body.sd-presenter #conversation, body.sd-presenter #tree { max-height: calc(100vh - 150px); overflow: auto; }
body.sd-presenter #prompt textarea { max-height: 5.5em; }
body.sd-presenter .sd-conversation { font-size: 20px; }
body.sd-large .sd-conversation { font-size: 26px; line-height: 1.7; }
body.sd-large .sd-stream { font-size: 26px; }
body.sd-large .sd-caption { font-size: 22px !important; }
body.sd-large .sd-legend, body.sd-large .sd-legend-notes, body.sd-large .sd-status { font-size: 18px !important; }
body.sd-presenter .sd-tree-scroll { max-height: none !important; }
body.sd-presenter svg.sd-tree { width: min(100%, calc(var(--sd-w) * 1.6)); max-height: calc(100vh - 340px); }
"""

# Runs once when the page loads: the URL's switches, and the "next round" key (outside text fields) pressing
# whichever step button is on screen (the replay's when the Replay tab is open, else the live one).
ON_LOAD = """() => {
  const query = new URLSearchParams(window.location.search);
  const tick = (id) => {
    const box = document.querySelector('#' + id + ' input');
    if (box && !box.checked) box.click();
  };
  if (query.has('presenter')) tick('presenter-toggle');
  if (query.has('large')) tick('large-type');
  const keys = KEYS;
  document.addEventListener('keydown', (e) => {
    if (!keys.includes(e.key) || e.ctrlKey || e.metaKey || e.altKey) return;
    if (e.target.closest && e.target.closest('input, textarea, select, [contenteditable=true]')) return;
    const button = ['replay-step-btn', 'step-btn'].map((id) => document.getElementById(id))
      .find((b) => b && b.offsetParent !== null && !b.disabled);
    if (button) { e.preventDefault(); button.click(); }
  });
}""".replace("KEYS", "[" + ", ".join(f"'{k}'" for k in NEXT_KEYS) + "]")


def body_class(name: str) -> str:
    """JS run in the browser when a view checkbox changes: set or clear `name` on <body>, pass the value on."""
    return f"(on) => {{ document.body.classList.toggle('{name}', on); return on; }}"


def body_class_first(name: str) -> str:
    """Like `body_class`, for a handler with more inputs than the checkbox: passes them all on."""
    return f"(on, ...rest) => {{ document.body.classList.toggle('{name}', on); return [on, ...rest]; }}"


def view_toggles() -> tuple[gr.Checkbox, gr.Checkbox]:
    """The two view checkboxes, side by side."""
    with gr.Row(elem_id="view-toggles"):
        presenter = gr.Checkbox(False, label="Presenter view", elem_id="presenter-toggle", min_width=120,
                                info="Answer and tree side by side; N or → for the next round")
        large = gr.Checkbox(False, label="Large type", elem_id="large-type", min_width=120,
                            info="For the back of the room")
    return presenter, large


def wire_view(app: gr.Blocks, presenter: gr.Checkbox, large: gr.Checkbox, collapsible: list[gr.Accordion],
              session: gr.State, tree: gr.HTML, round_slider: gr.Slider) -> None:
    """Presenter view collapses `collapsible`; large type redraws the tree bigger (the URL is read by `ON_LOAD`,
    which the page is launched with)."""

    def present(on: bool) -> list:
        return [gr.Accordion(open=not on) for _ in collapsible]

    def enlarge(on: bool, number: float, state: Session | None) -> tuple:
        state = state or Session()
        state.large = bool(on)
        return tree_view(state, int(number) - 1 if state.rounds else None), state

    presenter.change(present, presenter, collapsible, js=body_class("sd-presenter"), queue=False, api_name=False)
    large.change(enlarge, [large, round_slider, session], [tree, session], js=body_class_first("sd-large"),
                 queue=False, api_name=False)

