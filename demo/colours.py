"""One colour per token origin, shared by the token stream, the draft tree, the plots and the legend.

Okabe & Ito's colour-blind-safe hues; light fills with black text (drafted tokens) and a dark fill with white
text (the target's own token) also differ in lightness, so they stay apart in grey-scale and on a projector.
"""

from __future__ import annotations

import html
from dataclasses import dataclass


@dataclass(frozen=True)
class Swatch:
    fill: str
    border: str
    text: str
    label: str  # legend text
    dashed: bool = False


SWATCHES: dict[str, Swatch] = {
    "accepted": Swatch("#a6dfcb", "#009e73", "#111111", "drafted by the drafter, accepted by the target"),
    "target": Swatch("#0072b2", "#00466e", "#ffffff", "produced by the target (correction or bonus)"),
    "rejected": Swatch("#f7c7a6", "#d55e00", "#111111", "drafted, rejected by the target"),
    "not_reached": Swatch("#eeeeee", "#9a9a9a", "#555555", "drafted, never checked (its parent was rejected)", True),
    "root": Swatch("#ffffff", "#333333", "#111111", "last token before this round"),
}

STREAM_KINDS = ("accepted", "target")  # the stream shows only emitted tokens
TREE_KINDS = ("root", "accepted", "rejected", "not_reached", "target")


def swatch_for_source(source: str) -> Swatch:
    """Colour of an emitted token: `draft` tokens were accepted drafts, the rest came from the target."""
    return SWATCHES["accepted" if source == "draft" else "target"]


def chip_style(swatch: Swatch) -> str:
    border = "dashed" if swatch.dashed else "solid"
    return f"background:{swatch.fill};color:{swatch.text};border:2px {border} {swatch.border};"


def legend_html(kinds: tuple[str, ...] = STREAM_KINDS) -> str:
    """A row of coloured chips, each with the sentence it stands for."""
    items = "".join(
        f'<span class="sd-legend-item" data-kind="{kind}" style="display:inline-flex;align-items:center;gap:6px">'
        f'<span class="sd-chip" style="{chip_style(SWATCHES[kind])}padding:0 6px;border-radius:4px">abc</span>'
        f"{html.escape(SWATCHES[kind].label)}</span>"
        for kind in kinds
    )
    style = "display:flex;flex-wrap:wrap;gap:6px 18px;font-size:15px;color:#222;margin:4px 0"
    return f'<div class="sd-legend" style="{style}">{items}</div>'
