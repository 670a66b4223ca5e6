"""The generated text as HTML, every token coloured by where it came from (see `colours.py`)."""

from __future__ import annotations

import html

from demo.colours import chip_style, legend_html, swatch_for_source
from specdec.records import RoundRecord

ORIGIN = {"draft": "drafted and accepted", "correction": "target's correction", "bonus": "target's bonus"}
ALONE = "written by the target alone"  # the token of a round that drafted nothing (`ar`, arm 0): no bonus
FOLD_LINES, FOLD_CHARS = 6, 600  # a longer prompt is folded in its bubble: a pasted document stays a few lines tall
PREVIEW_LINES, PREVIEW_CHARS = 3, 240  # what a folded prompt shows of its start

BOX = (
    "font-family:ui-sans-serif,system-ui,sans-serif;font-size:18px;line-height:1.9;color:#111;"
    "background:#fff;border:1px solid #d0d0d0;border-radius:10px;padding:12px 14px;"
)
UNDERLINE = "border-width:0 0 2px 0;border-radius:3px;padding:1px 0;"  # after the chip's border, so it wins
# One rule per token origin, so a long answer's spans carry a class and two data attributes, not a style each.
TOKEN_CSS = "<style>" + "".join(f'.sd-tok[data-source="{source}"]{{{chip_style(swatch_for_source(source))}'
                                f"{UNDERLINE}}}" for source in ORIGIN) + "</style>"
FOLD_CSS = "<style>.sd-user details[open] .sd-fold-preview{display:none}</style>"  # open: the whole text, once
USER_STYLE = ("margin-left:auto;max-width:85%;background:#f2f2f2;border-radius:10px;padding:6px 12px;"
              "white-space:pre-wrap;font-size:16px;line-height:1.5")


def token_span(text: str, source: str, round_index: int, alone: bool = False) -> str:
    """One emitted token; hovering tells its origin and round. `alone`: its round drafted nothing, so the target's
    token follows no accepted draft."""
    tip = f"round {round_index + 1}: {ALONE if alone and source == 'bonus' else ORIGIN.get(source, source)}"
    return (
        f'<span class="sd-tok" data-source="{source}" data-round="{round_index}" '
        f'title="{html.escape(tip)}">{html.escape(text)}</span>'
    )


def stream_html(rounds: list[RoundRecord], live: bool = False) -> str:
    """All tokens emitted so far, in order, as coloured spans (white space kept)."""
    spans = "".join(token_span(t.text, t.source, r.index, drafted_nothing(r)) for r in rounds for t in r.emitted)
    cursor = '<span class="sd-cursor" style="color:#0072b2">▍</span>' if live else ""
    return (f'{TOKEN_CSS}<div class="sd-stream" style="white-space:pre-wrap;word-break:break-word">'
            f"{spans}{cursor}</div>")


def drafted_nothing(record: RoundRecord) -> bool:
    """Whether the round's tree is just its root: the target alone wrote its token (`ar`, or a lookup miss)."""
    return all(node.depth == 0 for node in record.nodes)


def prompt_html(prompt: str) -> str:
    """The user's bubble: the prompt escaped; a long one folded to its first lines and its size, click to open."""
    lines = prompt.splitlines()
    if len(lines) <= FOLD_LINES and len(prompt) <= FOLD_CHARS:
        return f'<div class="sd-user" style="{USER_STYLE}">{html.escape(prompt)}</div>'
    preview = "\n".join(lines[:PREVIEW_LINES])[:PREVIEW_CHARS]
    size = f"{len(prompt):,} characters, {len(lines):,} line{'s' if len(lines) != 1 else ''}"
    summary = (f'<summary style="cursor:pointer"><span class="sd-fold-preview">{html.escape(preview)}…\n</span>'
               f'<span style="color:#555;font-size:14px">{size}: click to show the whole prompt</span></summary>')
    return (f'{FOLD_CSS}<div class="sd-user" style="{USER_STYLE}"><details class="sd-fold">{summary}'
            f"{html.escape(prompt)}</details></div>")


def conversation_html(prompt: str, rounds: list[RoundRecord], live: bool = False, status: str = "") -> str:
    """Chat-style view: the user's prompt, then the model's answer token by token, then a legend."""
    if not prompt:
        body = '<div style="color:#666">Type a prompt (or click an example) and press <b>Generate</b>. ' \
               "The answer streams here, each token coloured by who wrote it.</div>"
        return f'<div class="sd-conversation" style="{BOX}">{body}{legend_html()}</div>'
    user = prompt_html(prompt)
    status_line = (f'<div class="sd-status" style="color:#444;font-size:15px">{html.escape(status)}</div>'
                   if status else "")
    answer = f'<div style="margin-top:10px">{stream_html(rounds, live)}</div>'
    return f'<div class="sd-conversation" style="{BOX}">{user}{answer}{status_line}{legend_html()}</div>'
