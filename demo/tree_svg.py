"""The draft tree of one round as an SVG: columns are depths, rows follow sibling order.

Node = token text (escaped, white space made visible); fill = status (`colours.py`); hover (`<title>`) gives
`q` (drafter probability) and `p` (target probability); a token copied from the context by prompt lookup
(a lookup branch) carries a small "copy" tag. The target's own token (correction or bonus) is drawn
as one extra node after the last accepted node, so the accepted path reads left to right.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from demo.colours import SWATCHES, TREE_KINDS, legend_html
from specdec.records import RoundRecord

COL_W, BOX_W, BOX_H, ROW_H, TOP, PAD = 150, 120, 30, 40, 34, 8
MAX_LABEL = 11
TARGET = -2  # key of the extra node holding the target's token (-1 means "no parent")
VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


@dataclass
class Box:
    key: int  # node index, or TARGET
    parent: int
    depth: int
    label: str
    kind: str  # a key of SWATCHES
    tip: str
    copied: bool = False


def visible(text: str, limit: int = MAX_LABEL) -> str:
    """Token text with white space shown as symbols, shortened to `limit` characters."""
    shown = "".join(VISIBLE.get(c, c) for c in text) or "∅"
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def target_token(record: RoundRecord) -> tuple[str, str] | None:
    """(text, source) of the token the target added this round, if any."""
    last = record.emitted[-1] if record.emitted else None
    return (last.text, last.source) if last and last.source != "draft" else None


def boxes(record: RoundRecord) -> list[Box]:
    """The tree's nodes plus the extra target node, hung under the deepest accepted node (or the root)."""
    out = []
    for n in record.nodes:
        kind = n.status
        tip = f"“{n.text}” · depth {n.depth} · {kind.replace('_', ' ')}"
        if n.copied:
            tip += "\ncopied from the context (prompt lookup): q = 1"
        elif n.parent >= 0:
            tip += f"\nq (drafter) = {n.q:.3f}"
        if n.parent >= 0:
            tip += f"\np (target) = {n.p:.3f}"
        out.append(Box(n.index, n.parent, n.depth, visible(n.text), kind, tip, n.copied))
    added = target_token(record)
    if added:
        accepted = [n for n in record.nodes if n.status == "accepted"]
        anchor = max(accepted, key=lambda n: n.depth) if accepted else record.nodes[0]
        why = "after the accepted leaf" if added[1] == "bonus" else "after the drafts here were rejected"
        tip = f"“{added[0]}” · the target's {added[1]} token, sampled from p {why}"
        out.append(Box(TARGET, anchor.index, anchor.depth + 1, visible(added[0]), "target", tip))
    return out


def rows(nodes: list[Box]) -> dict[int, float]:
    """Row of every node: leaves take rows in depth-first order, a parent sits midway between its children."""
    children: dict[int, list[int]] = {}
    for b in nodes:
        children.setdefault(b.parent, []).append(b.key)
    row: dict[int, float] = {}
    leaves = iter(range(len(nodes)))

    def place(key: int) -> None:
        kids = children.get(key, [])
        for k in kids:
            place(k)
        row[key] = (row[kids[0]] + row[kids[-1]]) / 2 if kids else float(next(leaves))

    for root in children.get(-1, []):
        place(root)
    return row


def _xy(b: Box, row: dict[int, float]) -> tuple[float, float]:
    return PAD + b.depth * COL_W, TOP + row[b.key] * ROW_H


def _edge(parent: Box, child: Box, row: dict[int, float]) -> str:
    (px, py), (cx, cy) = _xy(parent, row), _xy(child, row)
    x0, y0, x1, y1 = px + BOX_W, py + BOX_H / 2, cx, cy + BOX_H / 2
    strong = child.kind in ("accepted", "target")
    colour = SWATCHES[child.kind].border if strong else "#b5b5b5"
    mid = (x0 + x1) / 2
    return (
        f'<path d="M{x0:.0f},{y0:.0f} C{mid:.0f},{y0:.0f} {mid:.0f},{y1:.0f} {x1:.0f},{y1:.0f}" '
        f'fill="none" stroke="{colour}" stroke-width="{3 if strong else 1.5}"/>'
    )


def _node(b: Box, row: dict[int, float], source: str | None) -> str:
    x, y = _xy(b, row)
    s = SWATCHES[b.kind]
    dash = ' stroke-dasharray="5,3"' if s.dashed else ""
    strike = ' text-decoration="line-through"' if b.kind == "rejected" else ""
    note = ""
    if b.copied:
        note = (f'<text class="sd-copy" x="{x + BOX_W - 4:.0f}" y="{y + 10:.0f}" text-anchor="end" font-size="9" '
                f'fill="{s.border}">copy</text>')
    if b.key == TARGET and source:
        note = (f'<text x="{x + BOX_W + 6:.0f}" y="{y + BOX_H / 2 + 5:.0f}" font-size="13" font-weight="bold" '
                f'fill="{s.border}">{source}</text>')
    return (
        f'<g class="sd-node" data-status="{b.kind}" data-index="{b.key}"><title>{html.escape(b.tip)}</title>'
        f'<rect x="{x:.0f}" y="{y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="6" fill="{s.fill}" '
        f'stroke="{s.border}" stroke-width="2"{dash}/>'
        f'<text x="{x + BOX_W / 2:.0f}" y="{y + BOX_H / 2 + 5:.0f}" text-anchor="middle" font-size="15" '
        f'font-family="ui-monospace,Menlo,Consolas,monospace" fill="{s.text}"{strike}>{html.escape(b.label)}</text>'
        f"{note}</g>"
    )


def _headers(record: RoundRecord, depth: int) -> str:
    labels = ["root"] + [f"depth {d + 1} (×{n})" for d, n in enumerate(record.shape)]
    labels += ["target"] * (depth + 1 - len(labels))
    return "".join(
        f'<text x="{PAD + d * COL_W + BOX_W / 2:.0f}" y="20" text-anchor="middle" font-size="13" fill="#555">'
        f"{html.escape(label)}</text>"
        for d, label in enumerate(labels[: depth + 1])
    )


def tree_svg(record: RoundRecord) -> str:
    """The round's draft tree as a standalone SVG string."""
    nodes = boxes(record)
    row = rows(nodes)
    by_key = {b.key: b for b in nodes}
    added = target_token(record)
    depth = max(b.depth for b in nodes)
    width = PAD * 2 + depth * COL_W + BOX_W + (90 if added else 0)
    height = TOP + (max(row.values()) + 1) * ROW_H
    edges = "".join(_edge(by_key[b.parent], b, row) for b in nodes if b.parent in by_key)
    drawn = "".join(_node(b, row, added[1] if added else None) for b in nodes)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="sd-tree" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'width="{width:.0f}" style="max-width:100%;height:auto;background:#fff" role="img" '
        f'aria-label="draft tree of round {record.index + 1}">{_headers(record, depth)}{edges}{drawn}</svg>'
    )


def tree_html(record: RoundRecord | None, rounds_total: int = 0) -> str:
    """Header (round, shape, how it was chosen), the tree, and its legend."""
    if record is None:
        return ('<div class="sd-tree-empty" style="color:#666;font-size:16px;padding:12px">'
                "The draft tree of each round appears here once generation starts.</div>")
    shape = record.shape_name if record.shape else "no draft (target only)"
    head = f"Round {record.index + 1}" + (f" of {rounds_total}" if rounds_total else "") + f" · shape {shape}"
    if record.bandit:
        arm = record.bandit.chosen
        head += f" · chosen by the bandit (arm {arm + 1} of {len(record.bandit.arms)})"
    title = (f'<div class="sd-tree-head" style="font-size:16px;font-weight:600;margin:4px 0 6px">'
             f"{html.escape(head)}</div>")
    scroller = f'<div style="overflow:auto;max-height:560px">{tree_svg(record)}</div>'
    return f'<div class="sd-tree-panel" style="color:#111">{title}{scroller}{legend_html(TREE_KINDS)}</div>'
