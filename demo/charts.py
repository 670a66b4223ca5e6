"""The live graphs of a run as inline SVG: time and tokens per round, the running speed, and memory.

Drawn on the server as a few hundred SVG elements, so a redraw while a run streams costs the browser a layout of
plain markup rather than a chart library's redraw: the page stays off the cores the engine decodes on.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from demo.colours import SWATCHES
from specdec.records import RoundRecord, depth_reached

DRAFT, VERIFY, CUDA, INK = "#56b4e9", "#cc79a7", "#e69f00", "#222"
ACCEPTED, TARGET = SWATCHES["accepted"].border, SWATCHES["target"].fill
MIB = 1024 * 1024
WIDTH, PANEL_H, GAP, LEFT, TOP = 640, 120, 46, 56, 26
FONT = "font-family:ui-sans-serif,system-ui,sans-serif"


@dataclass(frozen=True)
class Series:
    name: str
    colour: str
    values: Sequence[float]
    x: Sequence[float] | None = None  # a line's x values (default: 1, 2, 3, ...)


def running_rate(rounds: list[RoundRecord]) -> list[float]:
    """Tokens per second after each round, from the rounds' own time (UI time excluded)."""
    out, ms = [], 0.0
    for r in rounds:
        ms += r.round_ms
        out.append(r.new_tokens_total / (ms / 1000) if ms > 0 else 0.0)
    return out


def _tick(value: float) -> str:
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def _frame(top: float, title: str, high: float, x_label: str) -> list[str]:
    """A panel's title, its axes and its largest value on the y axis."""
    w = WIDTH - LEFT - 12
    return [f'<text x="{LEFT}" y="{top - 8}" font-size="13" fill="#444">{html.escape(title)}</text>',
            f'<line x1="{LEFT}" y1="{top + PANEL_H}" x2="{LEFT + w}" y2="{top + PANEL_H}" stroke="#bbb"/>',
            f'<line x1="{LEFT}" y1="{top}" x2="{LEFT}" y2="{top + PANEL_H}" stroke="#bbb"/>',
            f'<text x="{LEFT - 6}" y="{top + 10}" font-size="12" text-anchor="end" fill="#555">{_tick(high)}</text>',
            f'<text x="{LEFT - 6}" y="{top + PANEL_H}" font-size="12" text-anchor="end" fill="#555">0</text>',
            f'<text x="{LEFT + w}" y="{top + PANEL_H + 16}" font-size="12" text-anchor="end" fill="#555">'
            f"{html.escape(x_label)}</text>"]


def bars(top: float, title: str, stacks: list[Series], unit: str = "round") -> list[str]:
    """Stacked bars, one a round (or a depth: `unit`), the stacks' values added bottom up."""
    n = max((len(s.values) for s in stacks), default=0)
    totals = [sum(s.values[i] for s in stacks) for i in range(n)]
    high = max(totals, default=0.0) or 1.0
    w = (WIDTH - LEFT - 12) / max(n, 1)
    out = _frame(top, title, high, f"{unit} 1 to {n}" if n else unit)
    for s_index, series in enumerate(stacks):
        base = [sum(stacks[k].values[i] for k in range(s_index)) for i in range(n)]
        rects = "".join(
            f'<rect x="{LEFT + i * w:.1f}" y="{top + PANEL_H * (1 - (base[i] + v) / high):.1f}" '
            f'width="{max(w * 0.85, 0.5):.1f}" height="{PANEL_H * v / high:.1f}"/>'
            for i, v in enumerate(series.values) if v > 0)
        out.append(f'<g class="sd-series" data-name="{html.escape(series.name)}" fill="{series.colour}">{rects}</g>')
    return out


def lines(top: float, title: str, series: list[Series], x_label: str) -> list[str]:
    """Lines over a shared x axis (each series' `x`, or the round number)."""
    xs = [list(s.x) if s.x is not None else list(range(1, len(s.values) + 1)) for s in series]
    low, high_x = min((min(x) for x in xs if x), default=0.0), max((max(x) for x in xs if x), default=1.0)
    span = (high_x - low) or 1.0
    high = max((max(s.values) for s in series if s.values), default=0.0) or 1.0
    out = _frame(top, title, high, x_label)
    w = WIDTH - LEFT - 12
    for s, x in zip(series, xs):
        points = " ".join(f"{LEFT + w * (a - low) / span:.1f},{top + PANEL_H * (1 - v / high):.1f}"
                          for a, v in zip(x, s.values))
        out.append(f'<polyline class="sd-series" data-name="{html.escape(s.name)}" points="{points}" fill="none" '
                   f'stroke="{s.colour}" stroke-width="2"/>')
    return out


def legend(items: list[Series]) -> str:
    keys = "".join(f'<span style="margin-right:14px"><span style="display:inline-block;width:12px;height:12px;'
                   f'background:{s.colour};border-radius:2px;vertical-align:-1px"></span> {html.escape(s.name)}</span>'
                   for s in items)
    return f'<div style="font-size:13px;color:#333;margin-top:4px">{keys}</div>'


def chart(title: str, panels: list[list[str]], keys: list[Series], elem_class: str) -> str:
    height = len(panels) * (PANEL_H + GAP) + 6
    body = "".join("".join(p) for p in panels)
    svg = (f'<svg class="sd-chart-svg" viewBox="0 0 {WIDTH} {height}" width="100%" role="img" '
           f'aria-label="{html.escape(title)}" style="{FONT};max-width:{WIDTH}px">{body}</svg>')
    return (f'<div class="sd-chart {elem_class}" style="{FONT};background:#fff;border:1px solid #d0d0d0;'
            f'border-radius:10px;padding:10px 12px"><div style="font-size:16px;font-weight:600;color:#222">'
            f"{html.escape(title)}</div>{svg}{legend(keys)}</div>")


def waiting(title: str, message: str, elem_class: str) -> str:
    return (f'<div class="sd-chart {elem_class}" style="{FONT};background:#fff;border:1px solid #d0d0d0;'
            f'border-radius:10px;padding:10px 12px;color:#666"><div style="font-size:16px;font-weight:600;'
            f'color:#222">{html.escape(title)}</div>{html.escape(message)}</div>')


def speed_chart(rounds: list[RoundRecord]) -> str:
    """Per round: draft and verify time (ms), tokens emitted (accepted + the target's), running tokens/s."""
    if not rounds:
        return waiting("Speed", "Per-round timings appear here while generating.", "sd-speed")
    times = [Series("draft ms", DRAFT, [r.draft_ms for r in rounds]),
             Series("verify ms", VERIFY, [r.verify_ms for r in rounds])]
    tokens = [Series("accepted drafts", ACCEPTED, [r.accepted_len for r in rounds]),
              Series("target's token", TARGET, [len(r.emitted) - r.accepted_len for r in rounds])]
    rate = [Series("tokens/s", INK, running_rate(rounds), [r.index + 1 for r in rounds])]
    panels = [bars(TOP, "time per round (ms)", times),
              bars(TOP + PANEL_H + GAP, "tokens emitted per round", tokens),
              lines(TOP + 2 * (PANEL_H + GAP), "running tokens/s", rate, "round")]
    keys = times + tokens + rate
    reached = depth_reached((len(r.shape), r.accepted_len) for r in rounds)
    if reached:
        depth = [Series("depth reached", ACCEPTED, reached)]
        panels.append(bars(TOP + 3 * (PANEL_H + GAP), "acceptance by depth: of the rounds that drafted d deep, "
                                                      "the share whose accepted path reached d", depth, "depth"))
    return chart("Speed", panels, keys, "sd-speed")


def memory_chart(rounds: list[RoundRecord]) -> str:
    """Process memory over time (and CUDA memory on a GPU); drafter state vs target KV cache per round."""
    if not rounds:
        return waiting("Memory", "Memory use appears here while generating.", "sd-memory")
    t = [r.elapsed_s for r in rounds]
    process = [Series("process RSS", INK, [r.rss_bytes / MIB for r in rounds], t)]
    if any(r.cuda_allocated_bytes is not None for r in rounds):
        process.append(Series("CUDA allocated", CUDA, [(r.cuda_allocated_bytes or 0) / MIB for r in rounds], t))
    x = [r.index + 1 for r in rounds]
    states = [Series("drafter state", ACCEPTED, [r.drafter_state_bytes / MIB for r in rounds], x),
              Series("target KV cache", TARGET, [r.target_kv_bytes / MIB for r in rounds], x)]
    panels = [lines(TOP, "process memory (MiB) over time", process, "seconds"),
              lines(TOP + PANEL_H + GAP, "drafter state vs target KV cache (MiB)", states, "round")]
    return chart("Memory", panels, process + states, "sd-memory")
