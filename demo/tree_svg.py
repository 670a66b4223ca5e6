"""The draft tree of one round as an SVG: columns are depths, rows follow sibling order.

Node = token text (escaped, white space made visible, long tokens shortened; the hover text has it whole);
fill = status (`colours.py`); hover (`<title>`) gives `q` (drafter probability) and `p` (target probability);
a token copied from the context by prompt lookup (a lookup branch) carries a small "copy" tag. The target's own
token (correction or bonus) is drawn as one extra node after the last accepted node, and a wide band runs under
the path the text took (root, accepted nodes, the target's token), so the accepted path reads left to right.
Sizes follow one font size: `font=15` on the page, larger in the presenter's large type.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from demo.colours import SWATCHES, TREE_KINDS, legend_html
from specdec.records import RoundRecord

MAX_LABEL = 11
TARGET = -2  # key of the extra node holding the target's token (-1 means "no parent")
VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}
PATH_BAND = "#009e73"  # the band under the accepted path: the accepted border colour, translucent
NOTES = (  # the two kinds of target token, one line each (shown under the legend)
    ("correction", "the target rejected the drafts at that point and wrote its own token in their place."),
    ("bonus", "every draft on the path was accepted, so the same target pass gives one more token for free."),
)


@dataclass(frozen=True)
class Layout:
    """Sizes in SVG pixels, all derived from the label font size."""

    font: int = 15

    @property
    def box_h(self) -> int:
        return round(self.font * 2)

    @property
    def row_h(self) -> int:
        return self.box_h + round(self.font * 0.7)

    @property
    def gap(self) -> int:  # horizontal space for the edges between two columns
        return round(self.font * 1.6)

    @property
    def head(self) -> int:  # depth labels' font size
        return round(self.font * 0.85)

    @property
    def top(self) -> int:  # room for the depth labels (two lines)
        return round(self.head * 2.9)

    @property
    def pad(self) -> int:
        return round(self.font * 0.6)

    def text_w(self, text: str, size: float) -> float:
        return len(text) * size * 0.62  # monospace advance (and a safe bound for the sans-serif headers)


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


def _whole(text: str) -> str:
    return "“" + visible(text, limit=len(text) + 1) + "”"


def boxes(record: RoundRecord) -> list[Box]:
    """The tree's nodes plus the extra target node, hung under the deepest accepted node (or the root)."""
    out = []
    for n in record.nodes:
        kind = n.status
        tip = f"{_whole(n.text)} · depth {n.depth} · {kind.replace('_', ' ')}"
        if n.copied:
            tip += "\ncopied from the context (prompt lookup): q = 1"
        elif n.parent >= 0:
            tip += f"\nq (drafter) = {n.q:.3f}"
            if n.drafted_as is not None:  # see `specdec.drafters.cross`: branches re-encoded in the target's tokens
                tip += "\nfrom the drafter's own tokens " + " ".join(_whole(piece) for piece in n.drafted_as)
            if record.drafter_read_target:  # see `specdec.drafters.mamba_feat`: real features up to the root
                tip += ("\ndrafted from the target's hidden state at the last accepted token" if n.depth == 1 else
                        "\ndrafted from the drafter's own guesses of the target's hidden state above it")
        if n.parent >= 0:
            tip += f"\np (target) = {n.p:.3f}"
        out.append(Box(n.index, n.parent, n.depth, visible(n.text), kind, tip, n.copied))
    added = target_token(record)
    if added:
        accepted = [n for n in record.nodes if n.status == "accepted"]
        anchor = max(accepted, key=lambda n: n.depth) if accepted else record.nodes[0]
        why = "after the accepted leaf" if added[1] == "bonus" else "after the drafts here were rejected"
        tip = f"{_whole(added[0])} · the target's {added[1]} token, sampled from p {why}"
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


def headers(record: RoundRecord, nodes: list[Box]) -> list[str]:
    """One label per depth column: root, `depth d (×N)` for the drafted shape, `depth d` for a deeper lookup
    branch, `target` for a column that holds only the target's token."""
    depth = max(b.depth for b in nodes)
    out = ["root"]
    for d in range(1, depth + 1):
        if d <= len(record.shape):
            out.append(f"depth {d} (×{record.shape[d - 1]})")
        else:
            only_target = all(b.key == TARGET for b in nodes if b.depth == d)
            out.append("target" if only_target else f"depth {d}")
    return out


@dataclass
class Grid:
    """Where each column starts and how wide its boxes are."""

    x: list[float]
    w: list[float]
    row: dict[int, float]
    lay: Layout

    def xy(self, b: Box) -> tuple[float, float]:
        return self.x[b.depth], self.lay.top + self.row[b.key] * self.lay.row_h


def grid(nodes: list[Box], labels: list[str], lay: Layout) -> Grid:
    """Columns as wide as their longest label (or depth label), at least three characters."""
    widths = []
    for d, head in enumerate(labels):
        longest = max((lay.text_w(b.label, lay.font) for b in nodes if b.depth == d), default=0.0)
        head_w = max(lay.text_w(line, lay.head) for line in head_lines(head))
        widths.append(max(longest + lay.font, head_w, lay.text_w("abc", lay.font) + 12))
    xs, x = [], float(lay.pad)
    for w in widths:
        xs.append(x)
        x += w + lay.gap
    return Grid(xs, widths, rows(nodes), lay)


def _centre(b: Box, g: Grid) -> tuple[float, float]:
    x, y = g.xy(b)
    return x + g.w[b.depth] / 2, y + g.lay.box_h / 2


def _edge(parent: Box, child: Box, g: Grid) -> str:
    (px, py), (cx, cy) = g.xy(parent), g.xy(child)
    half = g.lay.box_h / 2
    x0, y0, x1, y1 = px + g.w[parent.depth], py + half, cx, cy + half
    strong = child.kind in ("accepted", "target")
    colour = SWATCHES[child.kind].border if strong else "#b5b5b5"
    mid = (x0 + x1) / 2
    return (
        f'<path d="M{x0:.0f},{y0:.0f} C{mid:.0f},{y0:.0f} {mid:.0f},{y1:.0f} {x1:.0f},{y1:.0f}" '
        f'fill="none" stroke="{colour}" stroke-width="{3 if strong else 1.5}"/>'
    )


def _band(nodes: list[Box], g: Grid) -> str:
    """A wide translucent band through the centres of root, accepted nodes and the target's token."""
    on_path = sorted((b for b in nodes if b.kind in ("root", "accepted", "target")), key=lambda b: b.depth)
    points = " ".join(f"{x:.0f},{y:.0f}" for x, y in (_centre(b, g) for b in on_path))
    return (f'<polyline class="sd-text-path" points="{points}" fill="none" stroke="{PATH_BAND}" '
            f'stroke-opacity="0.18" stroke-width="{g.lay.box_h + 12}" stroke-linejoin="round" '
            'stroke-linecap="round"/>')


def _node(b: Box, g: Grid, source: str | None) -> str:
    x, y = g.xy(b)
    lay, w = g.lay, g.w[b.depth]
    s = SWATCHES[b.kind]
    dash = ' stroke-dasharray="5,3"' if s.dashed else ""
    strike = ' text-decoration="line-through"' if b.kind == "rejected" else ""
    small = round(lay.font * 0.62)
    note = ""
    if b.copied:
        note = (f'<text class="sd-copy" x="{x + w - 3:.0f}" y="{y + small:.0f}" text-anchor="end" '
                f'font-size="{small}" fill="{s.border}">copy</text>')
    if b.key == TARGET and source:
        note = (f'<text x="{x + w + 6:.0f}" y="{y + lay.box_h / 2 + lay.font / 3:.0f}" font-size="{lay.font - 1}" '
                f'font-weight="bold" fill="{s.border}">{source}</text>')
    return (
        f'<g class="sd-node" data-status="{b.kind}" data-index="{b.key}"><title>{html.escape(b.tip)}</title>'
        f'<rect x="{x:.0f}" y="{y:.0f}" width="{w:.0f}" height="{lay.box_h}" rx="6" fill="{s.fill}" '
        f'stroke="{s.border}" stroke-width="2"{dash}/>'
        f'<text class="sd-label" x="{x + w / 2:.0f}" y="{y + lay.box_h / 2 + lay.font / 3:.0f}" text-anchor="middle" '
        f'font-size="{lay.font}" font-family="ui-monospace,Menlo,Consolas,monospace" fill="{s.text}"{strike}>'
        f"{html.escape(b.label)}</text>{note}</g>"
    )


def head_lines(label: str) -> list[str]:
    """'depth 1 (×2)' on two lines: 'depth 1', '(×2)'."""
    first, _, rest = label.partition(" (")
    return [first, "(" + rest] if rest else [first]


def _headers(labels: list[str], g: Grid) -> str:
    size = g.lay.head
    out = []
    for d, label in enumerate(labels):
        lines = head_lines(label)
        spans = "".join(f'<tspan x="{g.x[d] + g.w[d] / 2:.0f}" dy="{0 if i == 0 else size * 1.15:.0f}">'
                        f"{html.escape(line)}</tspan>" for i, line in enumerate(lines))
        y = g.lay.top - size * (0.7 + 1.15 * (len(lines) - 1))
        out.append(f'<text class="sd-depth" x="{g.x[d] + g.w[d] / 2:.0f}" y="{y:.0f}" text-anchor="middle" '
                   f'font-size="{size}" fill="#444" data-label="{html.escape(label)}">{spans}</text>')
    return "".join(out)


def tree_svg(record: RoundRecord, font: int = 15) -> str:
    """The round's draft tree as a standalone SVG string, its labels `font` pixels high at natural size."""
    lay = Layout(font)
    nodes = boxes(record)
    labels = headers(record, nodes)
    g = grid(nodes, labels, lay)
    by_key = {b.key: b for b in nodes}
    added = target_token(record)
    depth = len(labels) - 1
    width = g.x[depth] + g.w[depth] + lay.pad + (lay.font * 6 if added else 0)
    height = lay.top + (max(g.row.values()) + 1) * lay.row_h
    edges = "".join(_edge(by_key[b.parent], b, g) for b in nodes if b.parent in by_key)
    drawn = "".join(_node(b, g, added[1] if added else None) for b in nodes)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="sd-tree" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'width="{width:.0f}" style="--sd-w:{width:.0f}px;max-width:100%;height:auto;background:#fff" role="img" '
        f'aria-label="draft tree of round {record.index + 1}">{_headers(labels, g)}{_band(nodes, g)}{edges}{drawn}'
        "</svg>"
    )


def path_text(record: RoundRecord) -> str:
    """The text this round added, token by token: '␣cat → ␣ran (correction)'."""
    parts = [visible(t.text, limit=24) for t in record.emitted]
    added = target_token(record)
    return " → ".join(parts) + (f" ({added[1]})" if added else "")


def notes_html() -> str:
    """Correction vs bonus, one line each."""
    lines = "".join(f'<div class="sd-note" data-kind="{kind}"><b>{kind}</b>: {html.escape(text)}</div>'
                    for kind, text in NOTES)
    return f'<div class="sd-legend-notes" style="font-size:15px;color:#222;line-height:1.5">{lines}</div>'


def tree_html(record: RoundRecord | None, rounds_total: int = 0, font: int = 15) -> str:
    """Header (round, shape, how it was chosen), the tree, the text's path, and the legend."""
    if record is None:
        return ('<div class="sd-tree-empty" style="color:#666;font-size:16px;padding:12px">'
                "The draft tree of each round appears here once generation starts.</div>")
    shape = record.shape_name if record.shape else "no draft (target only)"
    head = f"Round {record.index + 1}" + (f" of {rounds_total}" if rounds_total else "") + f" · shape {shape}"
    if record.bandit:
        arm = record.bandit.chosen
        head += f" · chosen by the bandit (arm {arm + 1} of {len(record.bandit.arms)})"
    title = (f'<div class="sd-tree-head" style="font-size:{font + 1}px;font-weight:600;margin:4px 0 6px">'
             f"{html.escape(head)}</div>")
    scroller = f'<div class="sd-tree-scroll" style="overflow:auto;max-height:560px">{tree_svg(record, font)}</div>'
    path = (f'<div class="sd-path-text" style="font-size:{font}px;margin:4px 0">The text took the shaded path: '
            f'<span style="font-family:ui-monospace,Menlo,Consolas,monospace">{html.escape(path_text(record))}'
            "</span></div>")
    return (f'<div class="sd-tree-panel" style="color:#111">{title}{scroller}{path}{legend_html(TREE_KINDS)}'
            f"{notes_html()}</div>")
