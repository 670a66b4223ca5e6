"""The bandit's arms as an HTML bar chart: pulls, mean reward and UCB value per tree shape, the chosen arm in orange.

Plain HTML rather than a plotting library's figure: it is redrawn with the tree every frame of a streaming run,
and the browser lays a few dozen `div`s out in far less time than a chart library redraws a figure.
"""

from __future__ import annotations

import html

from specdec.records import BanditSnapshot

CHOSEN, OTHER = "#e69f00", "#9fb3c8"
COLUMNS = ("pulls", "mean reward", "UCB value")
PANEL = ("font-family:ui-sans-serif,system-ui,sans-serif;color:#222;background:#fff;border:1px solid #d0d0d0;"
         "border-radius:10px;padding:10px 12px")
GRID = "display:grid;grid-template-columns:minmax(90px,auto) repeat(3,minmax(0,1fr));gap:4px 10px;align-items:center"


def _number(value: float | int | None) -> str:
    if value is None:
        return "untried"
    return f"{value:d}" if isinstance(value, int) else f"{value:.2f}"


def _bar(value: float | int | None, top: float, colour: str) -> str:
    """A bar as long as `value` against the column's largest, its number beside it (negative values from 0)."""
    share = 0.0 if value is None or top <= 0 else max(0.0, min(1.0, abs(value) / top))
    return (f'<div class="sd-bar" style="display:flex;align-items:center;gap:6px;font-size:14px">'
            f'<div style="height:14px;width:{share * 70:.1f}%;background:{colour};border-radius:3px"></div>'
            f"<span>{html.escape(_number(value))}</span></div>")


def bandit_html(snapshot: BanditSnapshot | None, round_index: int | None = None, waiting: str = "") -> str:
    """The arms of the bandit as it chose in round `round_index` (0-based): one row an arm, three bars."""
    if snapshot is None:
        return f'<div class="sd-bandit" style="{PANEL};color:#666">{html.escape(waiting)}</div>'
    columns = ([a.pulls for a in snapshot.arms], [a.mean_reward for a in snapshot.arms],
               [a.ucb for a in snapshot.arms])
    tops = [max((abs(v) for v in values if v is not None), default=0.0) for values in columns]
    chosen = snapshot.arms[snapshot.chosen].name if snapshot.arms else "?"
    when = f" in round {round_index + 1}" if round_index is not None else ""
    cells = [f'<div style="font-size:13px;color:#555">{"arm (tree shape)"}</div>']
    cells += [f'<div style="font-size:13px;color:#555">{name}</div>' for name in COLUMNS]
    for i, arm in enumerate(snapshot.arms):
        colour = CHOSEN if i == snapshot.chosen else OTHER
        weight = "font-weight:600;" if i == snapshot.chosen else ""
        cells.append(f'<div class="sd-arm" data-chosen="{str(i == snapshot.chosen).lower()}" '
                     f'style="{weight}font-size:14px">{html.escape(arm.name)}</div>')
        cells += [_bar(values[i], top, colour) for values, top in zip(columns, tops)]
    head = (f'<div class="sd-bandit-head" style="font-size:16px;font-weight:600;margin-bottom:6px">'
            f"Bandit ({html.escape(snapshot.reward_kind)} reward): arm {html.escape(chosen)} chosen{when}</div>")
    return f'<div class="sd-bandit" style="{PANEL}">{head}<div style="{GRID}">{"".join(cells)}</div></div>'
