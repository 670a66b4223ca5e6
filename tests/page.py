"""The Live tab's handlers in-process, called as the page calls them: Generate, Step and Compare get the page's
values as one dict by component (through `app.page_handler`) and yield their outputs by component. The page's own
events are not API endpoints, so tests of what they show run here; the wiring is the browser test's."""

from __future__ import annotations

from collections.abc import Iterator

import gradio as gr

import app
from demo.live import DEFAULTS, SETTINGS, live_panel
from demo.runner import EngineThread
from demo.session import Session
from demo.views import Stage


class Page:
    """One Live tab's components and handlers over `engine`, on an engine thread of its own."""

    def __init__(self, engine: app.Engine, limits: app.Limits = app.Limits()) -> None:
        with gr.Blocks():
            self.panel = live_panel({})
            stage = Stage(gr.HTML(), gr.HTML(), gr.HTML(), gr.Slider(), gr.HTML(), gr.HTML(), gr.HTML())
            self.live = app.Live(engine, EngineThread().start(), stage, gr.HTML(), gr.HTML(), gr.DownloadButton(),
                                 gr.State())
        self.limits = limits

    def press(self, button: str, prompt: str, session: Session | None, **changes) -> Iterator[dict]:
        """The updates of pressing `button` ("run", "step" or "compare") with the settings' defaults and `changes`
        on the page, in the tab whose state is `session`."""
        on_page, inputs = app.page_handler(getattr(self.live, button), self.panel, self.live.session, self.limits)
        settings = {self.panel[name]: value for name, value in {**DEFAULTS, **changes}.items()}
        values = {self.panel["prompt"]: prompt, self.live.session: session, **settings}
        assert set(values) == inputs and len(settings) == len(SETTINGS)
        return on_page(values, progress=lambda *args, **kwargs: None)

    def last(self, button: str, prompt: str, session: Session | None, **changes) -> dict:
        """The final updates of a run pressed with `press`."""
        *_, final = self.press(button, prompt, session, **changes)
        return final

    def value(self, update, name: str):
        """The value an update gives the component `name` of the live view (`conversation`, `verdict`, ...)."""
        component = getattr(self.live.stage, name, None) or getattr(self.live, name)
        shown = update[component]
        return shown.value if isinstance(shown, gr.components.Component) else shown
