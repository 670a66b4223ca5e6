"""What this machine's kernels do, probed once and kept: every probe the exact CPU verifier relies on.

The verifier on a CPU is bit-exact only where its kernels give a row the same bits whatever the other rows of the
call. That depends on the CPU, torch's build and the shapes, so it is probed, on random numbers, with the kernels
themselves:

- `packing_available(dtype)`: whether this build packs linears for oneDNN in `dtype` (kept in the process);
- `cpu_has_native_bf16()`: whether the CPU multiplies bfloat16 natively (torch's own feature check);
- `probe_min_rows(dtype, shapes)`: the fewest rows (1 or 2) from which packed linears of these shapes give every row
  the same bits for any row count up to `MAX_INVARIANT_ROWS`, or None; kept per machine (`linear_min_rows`), for
  the shapes of the model at hand (`linear_shapes`);
- `shape_min_rows(dtype, out, in, min_rows)`: whether a lone row of one shape needs that padding (in the process);
- `fusion_is_exact(dtype, in, shapes)`: whether fused linears give each part its own layer's bits (in the process);
- `probe_attention_mode(dtype, groups, d)`: how the split layout calls the attention kernel so that a row keeps its
  bits (`AttentionMode`); kept per machine (`attention_mode`).

The answers kept per machine decide which tokens greedy decoding prints (each precision and kernel is exact to
itself, not to the others), so they must not flip between runs: `kept` keeps them in `cpu-kernels.json`.
"""

from __future__ import annotations

import json
import os
import platform
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

PACKED_DTYPES = (torch.float32, torch.bfloat16)  # the dtypes oneDNN packs linears in
MAX_INVARIANT_ROWS = 32  # the verifier's block size: rows a pass holds at most, and the row counts the probes try
_QUERY_BLOCK = 32  # the CPU attention kernel's query block: the most queries one stacked head call holds
_PROBE_VERSION = 8  # bump when what the kept probes answer changes, so every machine probes again


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# --- the kept answers ----------------------------------------------------------------------------------------------
def probe_file() -> Path:
    """Where the answers are kept: `cpu-kernels.json` in the specdec cache (`specdec.models.cache_dir`)."""
    from specdec.models import cache_dir

    return cache_dir() / "cpu-kernels.json"


def kept(name: str, probe: Callable[[], Any]) -> Any:
    """This machine's answer to one kernel probe (`probe()` the first time, then what it returned, from
    `probe_file()`).

    The answers change which tokens greedy decoding prints, so they must not flip between runs on one machine: they
    are kept keyed by the CPU, torch's version, its kernel capability and the thread count, and every later process
    (the app, the CLI, the benchmark) reads them. A process reads the file again only when it has changed.
    """
    key = f"{_cpu_name()}|torch {torch.__version__}|{torch.get_num_threads()} threads|{platform.machine()}|" \
          f"{torch.backends.cpu.get_cpu_capability()}|probe {_PROBE_VERSION}"
    path = probe_file()
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        stamp = None
    memo = _KEPT.get((path, key))
    if memo is not None and memo[0] == stamp and name in memo[1]:
        return memo[1][name]
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    answers = known.setdefault(key, {})
    if name not in answers:
        answers[name] = probe()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps(known, indent=1))
            partial.replace(path)  # atomic: a process reading it sees the old or the new file, whole
            stamp = path.stat().st_mtime_ns
        except OSError:
            stamp = None  # a read-only home: decide again next time
    _KEPT[(path, key)] = (stamp, answers)
    return answers[name]


_KEPT: dict[tuple[Path, str], tuple[int | None, dict]] = {}  # (file, key) -> (its mtime, its answers)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_has_native_bf16() -> bool:
    """Whether torch multiplies bfloat16 natively here: the CPU has AVX512-BF16 or AMX (torch's own feature probe)
    and torch's kernels use AVX-512 (`ATEN_CPU_CAPABILITY=avx2` has them emulate bf16 instead)."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        return False
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


# --- packed linears (`specdec.packed`) -----------------------------------------------------------------------------
@cache
def packing_available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether this torch build has oneDNN's packed linear for `dtype` on this CPU (tried once per process)."""
    from specdec import packed

    if packed._LINEAR_POINTWISE is None:  # a build without oneDNN's ops
        return False
    try:
        w = torch.zeros(8, 16, dtype=dtype)
        out = packed._packed_linear(torch.ones(2, 16, dtype=dtype), packed._pack(w), None)
        return out.shape == (2, 8) and bool((out == 0).all())
    except (AttributeError, RuntimeError):  # no mkldnn ops in this build, or no primitive for dtype on this CPU
        return False


def linear_shapes(model: nn.Module) -> tuple[tuple[int, int], ...]:
    """The distinct (out_features, in_features) of a model's linear layers, its output layer's included, in the
    order they first appear: the shapes the linear probes try for it."""
    return tuple(dict.fromkeys(tuple(module.weight.shape) for module in model.modules()
                               if isinstance(module, nn.Linear)))


def linear_min_rows(dtype: torch.dtype, shapes: tuple[tuple[int, int], ...]) -> int | None:
    """This machine's `probe_min_rows` for packed linears of `dtype` and these shapes, kept (`kept`). None also for
    a dtype oneDNN does not pack, and for bfloat16 on a CPU without native bf16 (not probed: emulated bf16 is slow,
    and `auto` never picks it)."""
    if dtype not in PACKED_DTYPES or dtype == torch.bfloat16 and not cpu_has_native_bf16():
        return None
    return kept(f"linears {dtype_name(dtype)} {' '.join(f'{out}x{in_}' for out, in_ in shapes)}",
                lambda: probe_min_rows(dtype, shapes))


def model_min_rows(model: nn.Module) -> int | None:
    """`linear_min_rows` for a model: its own dtype and linear shapes."""
    return linear_min_rows(next(model.parameters()).dtype, linear_shapes(model))


@cache
def probe_min_rows(dtype: torch.dtype, shapes: tuple[tuple[int, int], ...],
                   rows: int = MAX_INVARIANT_ROWS) -> int | None:
    """The fewest rows from which this CPU's packed `dtype` linears of these (out_features, in_features) shapes give
    every row the same bits for any row count up to `rows`: 1 (any count), 2 (a lone row must be padded to two) or
    None (not row-invariant, or no packing). Probed on random weights, with `PackedLinear` itself."""
    from specdec.packed import PackedLinear

    if not packing_available(dtype):
        return None
    g = torch.Generator().manual_seed(0)
    layers = []
    for out_features, in_features in shapes:
        linear = _random_linear(out_features, in_features, dtype, g)
        layers.append((linear, torch.randn(rows, in_features, generator=g).to(dtype)))
    for min_rows in (1, 2):
        invariant = True
        for linear, x in layers:
            packed = PackedLinear(linear, min_rows)
            single = torch.cat([packed(x[i: i + 1]) for i in range(rows)])  # [rows, out]
            invariant &= all(torch.equal(packed(x[:n]), single[:n]) for n in range(2, rows + 1))
        if invariant:
            return min_rows
    return None


@cache
def shape_min_rows(dtype: torch.dtype, out_features: int, in_features: int, min_rows: int) -> int:
    """1 where a lone row of this weight shape already gets the bits of any larger block's row (tried once per
    process on random numbers, up to `MAX_INVARIANT_ROWS` rows), else `min_rows`."""
    from specdec.packed import PackedLinear

    g = torch.Generator().manual_seed(1)
    packed = PackedLinear(_random_linear(out_features, in_features, dtype, g))
    x = torch.randn(MAX_INVARIANT_ROWS, in_features, generator=g).to(dtype)
    single = torch.cat([packed(x[i: i + 1]) for i in range(MAX_INVARIANT_ROWS)])
    invariant = all(torch.equal(packed(x[:n]), single[:n]) for n in range(2, MAX_INVARIANT_ROWS + 1))
    return 1 if invariant else min_rows


@cache
def fusion_is_exact(dtype: torch.dtype, in_features: int, shapes: tuple[tuple[int, int], ...]) -> bool:
    """Whether layers of these (out_features, min_rows), fused, give each output the bits of the layers alone for
    every row count up to `MAX_INVARIANT_ROWS` (tried once per process on random numbers)."""
    from specdec.packed import FusedLinear, PackedLinear

    g = torch.Generator().manual_seed(2)
    layers = [PackedLinear(_random_linear(out_features, in_features, dtype, g), min_rows)
              for out_features, min_rows in shapes]
    fused = FusedLinear(layers)
    x = torch.randn(MAX_INVARIANT_ROWS, in_features, generator=g).to(dtype)
    return all(torch.equal(part, layer(x[:n])) for n in range(1, MAX_INVARIANT_ROWS + 1)
               for part, layer in zip(fused(x[:n]), layers))


def _random_linear(out_features: int, in_features: int, dtype: torch.dtype, generator: torch.Generator) -> nn.Linear:
    """A bias-free linear layer with random weights of about a trained model's size, for the kernel probes."""
    linear = nn.Linear(in_features, out_features, bias=False, dtype=dtype).requires_grad_(False)
    linear.weight.copy_(torch.randn(out_features, in_features, generator=generator) * 0.05)
    return linear


# --- attention (`specdec.verify.split`) ----------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionMode:
    """How the split layout calls the CPU's attention kernel so that a row's bits do not depend on the other rows of
    the call (`probe_attention_mode`).

    `batch_min_rows`: calls with one row a batch element hold at least this many (1, or 2 where a batch of one takes
    another path than larger batches). `stack`: rows of a shared head stacked along one call's query axis (0: each
    its own batch element instead); `stack_min_rows`: the fewest rows such a call holds (2: a lone row is padded).
    """

    batch_min_rows: int = 1
    stack: int = 0
    stack_min_rows: int = 1


@cache
def attention_mode(dtype: torch.dtype, groups: int, d: int) -> AttentionMode:
    """This machine's `AttentionMode` for a head layout, kept with its other kernel probes (`kept`): it decides bits
    greedy decoding prints."""
    return AttentionMode(**kept(f"attention {dtype_name(dtype)} {groups}x{d}",
                                lambda: vars(probe_attention_mode(dtype, groups, d))))


def probe_attention_mode(dtype: torch.dtype, groups: int, d: int) -> AttentionMode:
    """The cheapest row-invariant way to call this CPU's attention kernel, probed on random tensors as
    `probe_min_rows` probes the linears: the fewest batch elements (1 or 2) from which each element's bits are the
    same whatever the batch, up to `MAX_INVARIANT_ROWS`; then whether a shared head's rows can be stacked, up to
    `_QUERY_BLOCK` queries a call, a row getting the same bits whatever the other rows of the call, from one row or
    (padded) from two."""
    g = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=g).to(dtype)  # noqa: E731
    batch_min_rows = _probe_batch_min_rows(rand, groups, d)
    if not batch_min_rows:
        warnings.warn("this CPU's attention kernel gives a row other bits beside other rows (in float32 on x86:"
                      " MKL ran before specdec could set MKL_CBWR; import specdec first), so tree verification here"
                      " is not bit-exact: greedy output may differ from the target alone")
        return AttentionMode(2)
    most = _QUERY_BLOCK // groups
    if most >= 2:
        cases = [(rand(most, 3, groups, d), rand(1, 3, keys, d), rand(1, 3, keys, d)) for keys in (100, 700)]
        for min_rows in (1, 2):
            mode = AttentionMode(batch_min_rows, most, min_rows)
            if all(_stack_invariant(q, k, v, mode) for q, k, v in cases):
                return mode
    return AttentionMode(batch_min_rows)


def _probe_batch_min_rows(rand, groups: int, d: int) -> int:
    """The fewest batch elements (1 or 2) from which every element gets its bits whatever the batch, for a tail's
    keys and for a head's; 0 where neither does."""
    from specdec.verify.split import TAIL

    rows = MAX_INVARIANT_ROWS
    batch_min_rows = 1  # 0: no batch is invariant
    for keys in (TAIL, 700):  # a tail's keys, a head's
        q, k, v = rand(rows, 3, groups, d), rand(rows, 3, keys, d), rand(rows, 3, keys, d)
        mask = torch.zeros(rows, 1, 1, keys)
        for r in range(rows):
            mask[r, ..., 1 + r * 7 % keys:] = float("-inf")
        found = 1 if _batch_invariant(q, k, v, mask, 1) else 2 if _batch_invariant(q, k, v, mask, 2) else 0
        batch_min_rows = 0 if not found or not batch_min_rows else max(batch_min_rows, found)
    return batch_min_rows


def _batch_invariant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, min_rows: int) -> bool:
    """Whether each batch element of q/k/v/mask [rows, ...] gets the bits it gets alone in batches of any size."""
    from specdec.verify.split import _batched_flash

    rows = q.shape[0]
    alone = [_batched_flash(q[i: i + 1], k[i: i + 1], v[i: i + 1], mask[i: i + 1], None, min_rows)
             for i in range(rows)]
    return all(_same_rows(_batched_flash(q[:n], k[:n], v[:n], mask[:n], None, min_rows), alone)
               for n in (2, 3, 5, 8, 16, rows))


def _stack_invariant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mode: AttentionMode) -> bool:
    """Whether the first m rows of q [rows, H_kv, groups, d] over shared keys, stacked as `mode` says, get the bits
    each gets alone, for every m from 2."""
    from specdec.verify.split import _head_attention

    alone = [_head_attention(q[i: i + 1], k, v, None, mode) for i in range(q.shape[0])]
    return all(_same_rows(_head_attention(q[:m], k, v, None, mode), alone) for m in range(2, q.shape[0] + 1))


def _same_rows(together: tuple[torch.Tensor, torch.Tensor], alone: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    """Whether each row of a call's (out, lse) has the bits that row got in a call of its own."""
    out, lse = together
    return all(torch.equal(out[i], alone[i][0][0]) and torch.equal(lse[i], alone[i][1][0]) for i in range(len(out)))
