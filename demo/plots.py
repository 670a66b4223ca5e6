"""Plotly figures of a run: the bandit's arms, per-round speed, and memory.

The live figures are redrawn while a run streams, so they are built without plotly's validating figure objects: each
figure's frame (layout, axes, the traces' styles) is made once with `plotly.graph_objects` and kept as JSON, and a
redraw fills the traces' numbers into a copy of it and hands Gradio the JSON as it is (`PlotData`).
"""

from __future__ import annotations

import functools
import json

import plotly.graph_objects as go
from gradio.components.plot import PlotData
from plotly.subplots import make_subplots

from demo.colours import SWATCHES
from demo.live import WAYS
from specdec.records import BanditSnapshot, RoundRecord

FONT = dict(size=14, family="ui-sans-serif,system-ui,sans-serif", color="#222")
CHOSEN, OTHER = "#e69f00", "#9fb3c8"  # bandit bars: the chosen arm vs the rest
DRAFT, VERIFY = "#56b4e9", "#cc79a7"
MIB = 1024 * 1024
BANDIT_COLUMNS = ("pulls", "mean reward", "UCB value")


def _layout(fig: go.Figure, height: int, title: str) -> go.Figure:
    fig.update_layout(
        height=height, title=dict(text=title, x=0, font=dict(size=16)), font=FONT, template="plotly_white",
        margin=dict(l=60, r=20, t=60, b=40), legend=dict(orientation="h", y=-0.12, x=0), bargap=0.15,
        paper_bgcolor="#ffffff", plot_bgcolor="#ffffff",
    )
    return fig


def _plot(data: list[dict], layout: dict) -> PlotData:
    """A plotly figure as the JSON Gradio's `gr.Plot` sends to the page."""
    return PlotData(type="plotly", plot=json.dumps({"data": data, "layout": layout}, separators=(",", ":")))


def figure_dict(plot: PlotData) -> dict:
    """The figure a `PlotData` holds, as plain data (`data` and `layout`)."""
    return json.loads(plot.plot)


def _frame(fig: go.Figure) -> dict:
    """A figure built once, as plain JSON data to copy and fill."""
    return json.loads(fig.to_json())


def _filled(frame: dict, columns: list[dict], **layout) -> PlotData:
    """`frame`'s traces each updated with its column of numbers (in order), its layout with `layout`."""
    data = [{**trace, **column} for trace, column in zip(frame["data"], columns)]
    return _plot(data, {**frame["layout"], **layout})


@functools.cache
def empty_figure(message: str, height: int = 300) -> PlotData:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, font=dict(size=15, color="#666"), x=0.5, y=0.5,
                       xref="paper", yref="paper")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    frame = _frame(_layout(fig, height, ""))
    return _plot(frame["data"], frame["layout"])


@functools.cache
def _bandit_frame() -> dict:
    fig = make_subplots(rows=1, cols=3, shared_yaxes=True, subplot_titles=BANDIT_COLUMNS, horizontal_spacing=0.06)
    for col, label in enumerate(BANDIT_COLUMNS, start=1):
        fig.add_trace(go.Bar(orientation="h", name=label, textposition="auto", showlegend=False,
                             hovertemplate="%{y}: %{text}<extra>" + label + "</extra>"), row=1, col=col)
    fig.update_yaxes(autorange="reversed", title_text="arm (tree shape)", row=1, col=1)
    return _frame(_layout(fig, 300, ""))


def bandit_figure(snapshot: BanditSnapshot | None, round_index: int | None = None) -> PlotData:
    """Per arm: pulls, mean reward and UCB value as horizontal bars; the arm chosen this round in orange."""
    if snapshot is None:
        return empty_figure(f"The bandit panel fills in when Drafting is “{WAYS['ucb']}”.")
    names = [a.name for a in snapshot.arms]
    colours = [CHOSEN if i == snapshot.chosen else OTHER for i in range(len(names))]
    columns = []
    for values in ([a.pulls for a in snapshot.arms], [a.mean_reward for a in snapshot.arms],
                   [a.ucb for a in snapshot.arms]):
        text = ["untried" if v is None else (f"{v:d}" if isinstance(v, int) else f"{v:.2f}") for v in values]
        columns.append(dict(y=names, x=[0 if v is None else v for v in values], text=text,
                            marker=dict(color=colours)))
    chosen = names[snapshot.chosen] if names else "?"
    when = f" in round {round_index + 1}" if round_index is not None else ""
    frame = _bandit_frame()
    title = {**frame["layout"]["title"], "text": f"Bandit ({snapshot.reward_kind} reward): arm {chosen} chosen{when}"}
    return _filled(frame, columns, title=title, height=120 + 46 * len(names))


def running_rate(rounds: list[RoundRecord]) -> list[float]:
    """Tokens per second after each round, from the rounds' own time (UI time excluded)."""
    out, ms = [], 0.0
    for r in rounds:
        ms += r.round_ms
        out.append(r.new_tokens_total / (ms / 1000) if ms > 0 else 0.0)
    return out


@functools.cache
def _speed_frame() -> dict:
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.09,
                        subplot_titles=["time per round (ms)", "tokens emitted per round", "running tokens/s"])
    fig.add_trace(go.Bar(name="draft ms", marker_color=DRAFT), row=1, col=1)
    fig.add_trace(go.Bar(name="verify ms", marker_color=VERIFY), row=1, col=1)
    fig.add_trace(go.Bar(name="accepted drafts", marker_color=SWATCHES["accepted"].border), row=2, col=1)
    fig.add_trace(go.Bar(name="target's token", marker_color=SWATCHES["target"].fill), row=2, col=1)
    fig.add_trace(go.Scatter(name="tokens/s", mode="lines+markers", line=dict(color="#222", width=2)), row=3, col=1)
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="round", row=3, col=1)
    return _frame(_layout(fig, 560, ""))


def speed_figure(rounds: list[RoundRecord]) -> PlotData:
    """Per round: draft and verify time (ms), tokens emitted (accepted + the target's), running tokens/s."""
    if not rounds:
        return empty_figure("Per-round timings appear here while generating.", 520)
    x = [r.index + 1 for r in rounds]
    series = ([r.draft_ms for r in rounds], [r.verify_ms for r in rounds], [r.accepted_len for r in rounds],
              [len(r.emitted) - r.accepted_len for r in rounds], running_rate(rounds))
    return _filled(_speed_frame(), [dict(x=x, y=y) for y in series])


@functools.cache
def _memory_frame(cuda: bool) -> dict:
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.24,
                        subplot_titles=["process memory (MiB) over time", "drafter state vs target KV cache (MiB)"])
    fig.add_trace(go.Scatter(name="process RSS", line=dict(color="#222")), row=1, col=1)
    if cuda:
        fig.add_trace(go.Scatter(name="CUDA allocated", line=dict(color=CHOSEN)), row=1, col=1)
    fig.add_trace(go.Scatter(name="drafter state", line=dict(color=SWATCHES["accepted"].border, width=3)),
                  row=2, col=1)
    fig.add_trace(go.Scatter(name="target KV cache", line=dict(color=SWATCHES["target"].fill, width=3)), row=2, col=1)
    fig.update_xaxes(title_text="seconds", row=1, col=1)
    fig.update_xaxes(title_text="round", row=2, col=1)
    return _frame(_layout(fig, 520, ""))


def memory_figure(rounds: list[RoundRecord]) -> PlotData:
    """Process memory over time (and CUDA memory on a GPU); drafter state vs target KV cache per round."""
    if not rounds:
        return empty_figure("Memory use appears here while generating.", 420)
    t = [r.elapsed_s for r in rounds]
    x = [r.index + 1 for r in rounds]
    cuda = any(r.cuda_allocated_bytes is not None for r in rounds)
    columns = [dict(x=t, y=[r.rss_bytes / MIB for r in rounds])]
    if cuda:
        columns.append(dict(x=t, y=[(r.cuda_allocated_bytes or 0) / MIB for r in rounds]))
    columns += [dict(x=x, y=[r.drafter_state_bytes / MIB for r in rounds]),
                dict(x=x, y=[r.target_kv_bytes / MIB for r in rounds])]
    return _filled(_memory_frame(cuda), columns)


def _empty(message: str) -> go.Figure:
    return go.Figure(figure_dict(empty_figure(message, 380)))


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
