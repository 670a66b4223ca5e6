"""CUDA graphs of the Mamba drafter's step: one graph per batch size (a tree depth's width), captured on first use.

As in mamba_ssm's `utils/generation.py`, the capture lives in its own small class. Each graph owns static
buffers allocated once: the tokens [B], the per-layer states (conv [L, B, d_in, K], ssm [L, B, d_in, N]) and the
logits [B, V]. A replay copies the round's tokens and states in, runs the recorded kernels and copies the updated
states out, so the caller's `MambaState` behaves exactly as under the eager step. All graphs of one drafter
share one memory pool, and they are kept on the model (`model._specdec_graphs`), so a new drafter built for the
next generation replays the graphs already captured instead of capturing again.

The eager `MambaDrafter.step_eager` stays the reference (tests check a replay equals it bitwise). Graphs are on by
default on CUDA; `MambaDrafter(..., cuda_graphs=False)` or the environment variable SPECDEC_CUDA_GRAPHS=0 turns
them off. A graph records parameter addresses: move or reload the model and the cache on it must be dropped
(`model._specdec_graphs = {}`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

ENV_FLAG = "SPECDEC_CUDA_GRAPHS"
WARMUP_STEPS = 2  # eager runs on a side stream before capture (cuBLAS handles, Triton autotuning, lazy inits)

StepFn = Callable[[torch.Tensor, Any, bool], torch.Tensor | None]  # (tokens [B], state, logits?) -> [B, V] | None


def graphs_enabled(device: torch.device, requested: bool | None) -> bool:
    """Whether to replay CUDA graphs: `requested` if given, else on CUDA unless SPECDEC_CUDA_GRAPHS=0."""
    if requested is None:
        return device.type == "cuda" and os.environ.get(ENV_FLAG, "1") != "0"
    if requested and device.type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA device; the drafter is on {device.type}")
    return requested


def _clone_state(state: Any) -> Any:
    """A copy of a dataclass of tensors (the static buffers of one graph)."""
    return replace(state, **{f.name: getattr(state, f.name).clone() for f in fields(state)})


def _copy_state(dst: Any, src: Any) -> None:
    for f in fields(src):
        getattr(dst, f.name).copy_(getattr(src, f.name))


@dataclass
class CapturedStep:
    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor  # [B] static input
    state: Any  # static states of B rows, updated in place by a replay
    logits: torch.Tensor | None  # [B, V] static output, None for a step whose logits are not needed


class GraphedStep:
    """Replays `step(tokens, state, logits)` from CUDA graphs keyed by (batch size, logits wanted)."""

    def __init__(self, step: StepFn) -> None:
        self.step = step
        self.graphs: dict[tuple[int, bool], CapturedStep] = {}
        self.pool: tuple[int, int] | None = None  # one memory pool shared by every graph

    def __call__(self, tokens: torch.Tensor, state: Any, logits: bool = True) -> torch.Tensor | None:
        """Same contract as the eager step: `state` rows are updated in place; -> logits [B, V] or None."""
        key = (tokens.shape[0], logits)
        if key not in self.graphs:
            self.graphs[key] = self.capture(tokens, state, logits)
        captured = self.graphs[key]
        captured.tokens.copy_(tokens)
        _copy_state(captured.state, state)
        captured.graph.replay()
        _copy_state(state, captured.state)
        return captured.logits.clone() if logits else None  # the next replay overwrites the static output

    def capture(self, tokens: torch.Tensor, state: Any, logits: bool) -> CapturedStep:
        static_tokens, static_state = tokens.clone(), _clone_state(state)
        side = torch.cuda.Stream(device=tokens.device)
        side.wait_stream(torch.cuda.current_stream(tokens.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self.step(static_tokens, static_state, logits)
        torch.cuda.current_stream(tokens.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.step(static_tokens, static_state, logits)
        self.pool = graph.pool()
        return CapturedStep(graph, static_tokens, static_state, out)

    @property
    def batch_sizes(self) -> list[int]:
        return sorted({batch for batch, _ in self.graphs})


def shared_graphs(model: torch.nn.Module, key: tuple, step: StepFn) -> GraphedStep:
    """The `GraphedStep` kept on `model` for drafters that compute the same step (same `key`), made on first use."""
    cache: dict[tuple, GraphedStep] = model.__dict__.setdefault("_specdec_graphs", {})
    if key not in cache:
        cache[key] = GraphedStep(step)
    return cache[key]
