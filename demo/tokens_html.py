"""The generated text as HTML, every token coloured by where it came from (see `colours.py`)."""

from __future__ import annotations

import html

from demo.colours import chip_style, legend_html, swatch_for_source
from specdec.records import RoundRecord

ORIGIN = {"draft": "drafted and accepted", "correction": "target's correction", "bonus": "target's bonus"}

BOX = (
    "font-family:ui-sans-serif,system-ui,sans-serif;font-size:18px;line-height:1.9;color:#111;"
    "background:#fff;border:1px solid #d0d0d0;border-radius:10px;padding:12px 14px;"
)
UNDERLINE = "border-width:0 0 2px 0;border-radius:3px;padding:1px 0;"  # after the chip's border, so it wins
# One rule per token origin, so a long answer's spans carry a class and two data attributes, not a style each.
TOKEN_CSS = "<style>" + "".join(f'.sd-tok[data-source="{source}"]{{{chip_style(swatch_for_source(source))}'
                                f"{UNDERLINE}}}" for source in ORIGIN) + "</style>"


def token_span(text: str, source: str, round_index: int) -> str:
    """One emitted token; hovering tells its origin and round."""
    tip = f"round {round_index + 1}: {ORIGIN.get(source, source)}"
    return (
        f'<span class="sd-tok" data-source="{source}" data-round="{round_index}" '
        f'title="{html.escape(tip)}">{html.escape(text)}</span>'
    )


def stream_html(rounds: list[RoundRecord], live: bool = False) -> str:
    """All tokens emitted so far, in order, as coloured spans (white space kept)."""
    spans = "".join(token_span(t.text, t.source, r.index) for r in rounds for t in r.emitted)
    cursor = '<span class="sd-cursor" style="color:#0072b2">▍</span>' if live else ""
    return (f'{TOKEN_CSS}<div class="sd-stream" style="white-space:pre-wrap;word-break:break-word">'
            f"{spans}{cursor}</div>")


def conversation_html(prompt: str, rounds: list[RoundRecord], live: bool = False, status: str = "") -> str:
    """Chat-style view: the user's prompt, then the model's answer token by token, then a legend."""
    if not prompt:
        body = '<div style="color:#666">Type a prompt (or click an example) and press <b>Generate</b>. ' \
               "The answer streams here, each token coloured by who wrote it.</div>"
        return f'<div class="sd-conversation" style="{BOX}">{body}{legend_html()}</div>'
    user = (
        '<div class="sd-user" style="margin-left:auto;max-width:85%;background:#f2f2f2;border-radius:10px;'
        f'padding:6px 12px;white-space:pre-wrap;font-size:16px;line-height:1.5">{html.escape(prompt)}</div>'
    )
    status_line = (f'<div class="sd-status" style="color:#444;font-size:15px">{html.escape(status)}</div>'
                   if status else "")
    answer = f'<div style="margin-top:10px">{stream_html(rounds, live)}</div>'
    return f'<div class="sd-conversation" style="{BOX}">{user}{answer}{status_line}{legend_html()}</div>'
