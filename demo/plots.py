"""Plotly figures of the Long documents page: speed and memory against prompt length, from a `bench --long` result.

(The live page's graphs are inline SVG, `demo/charts.py`: they are redrawn while a run streams.)
"""

from __future__ import annotations

import plotly.graph_objects as go

from demo.colours import SWATCHES

FONT = dict(size=14, family="ui-sans-serif,system-ui,sans-serif", color="#222")


def _layout(fig: go.Figure, height: int, title: str) -> go.Figure:
    fig.update_layout(
        height=height, title=dict(text=title, x=0, font=dict(size=16)), font=FONT, template="plotly_white",
        margin=dict(l=60, r=20, t=60, b=40), legend=dict(orientation="h", y=-0.12, x=0), bargap=0.15,
        paper_bgcolor="#ffffff", plot_bgcolor="#ffffff",
    )
    return fig


def _empty(message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, font=dict(size=15, color="#666"), x=0.5, y=0.5,
                       xref="paper", yref="paper")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, 380, "")


def context_figures(result: dict | None) -> tuple[go.Figure, go.Figure]:
    """From a `bench --long` result (its JSON): tok/s against prompt length per method, and the drafters' memory
    (Mamba state, Transformer KV cache) beside the target's KV cache against prompt length."""
    if not result:
        message = "No long-context benchmark is shipped with this copy (docs/benchmarks.md says how to make one)."
        return _empty(message), _empty(message)
    speed, memory = go.Figure(), go.Figure()
    target_kv: dict[float, float] = {}
    drafters: dict[tuple, list[str]] = {}  # a drafter-memory line -> the methods that drew it (one drafter's)
    for name, row in result["methods"].items():
        parts = sorted(row["by_kind"].values(), key=lambda part: part["prompt_tokens"])
        x = [part["prompt_tokens"] for part in parts]
        speed.add_trace(go.Scatter(x=x, y=[part["tokens_per_s"] for part in parts], name=name, mode="lines+markers",
                                   hovertemplate="%{x:.0f} prompt tokens: %{y:.1f} tok/s<extra>" + name + "</extra>"))
        if any(part.get("drafter_mb") for part in parts):
            drafters.setdefault((tuple(x), tuple(part["drafter_mb"] for part in parts)), []).append(name)
        for part in parts:
            if part.get("target_kv_mb"):
                target_kv[part["prompt_tokens"]] = part["target_kv_mb"]
    for (x, y), names in drafters.items():  # methods of one drafter share its line rather than hide each other
        memory.add_trace(go.Scatter(x=list(x), y=list(y), mode="lines+markers", name=f"{', '.join(names)}: drafter"))
    if target_kv:
        x = sorted(target_kv)
        memory.add_trace(go.Scatter(x=x, y=[target_kv[k] for k in x], name="target KV cache", mode="lines+markers",
                                    line=dict(color=SWATCHES["target"].fill, dash="dash")))
    speed.update_xaxes(title_text="prompt tokens")
    speed.update_yaxes(title_text="tok/s (prefill included)", rangemode="tozero")
    memory.update_xaxes(title_text="prompt tokens")
    memory.update_yaxes(title_text="MiB (log scale)", type="log", dtick=1)  # ticks at 1, 10, 100
    figures = _layout(speed, 420, "Speed against prompt length"), _layout(memory, 420, "Memory against prompt length")
    for fig in figures:  # the legend below the axis title
        fig.update_layout(legend=dict(orientation="h", y=-0.3, x=0), margin=dict(b=110))
    return figures
