"""Linear layers with their weights packed once for oneDNN (CPU, float32 or bfloat16): the same matmul, without
the per-call weight reorder, and with each row's bits independent of how many rows share the call.

`F.linear` on a CPU hands the weight to its kernel in the plain layout on every call; in bfloat16 oneDNN reorders
it into its blocked layout each time, which for a decode step (one row against every weight of the model) costs
more than the multiply, and in float32 the BLAS kernel it takes for 2-16 rows costs about twice what one row does
and gives row i other bits as the row count changes. `torch.ops.mkldnn._reorder_linear_weight` packs a weight once
for a given row count and `torch.ops.mkldnn._linear_pointwise` multiplies by the packed copy: the flat, row-
invariant kernel a tree verifier needs. Packing is what PyTorch's own compiler does for frozen CPU models
(inductor's weight prepacking); this module does it for an eager model: each `nn.Linear` is swapped for a
`PackedLinear` that keeps the original `weight` Parameter (tied weights stay tied, anything reading `.weight` still
works) and a packed copy used by `forward`.

Row invariance is a property of the CPU's kernels, so it is probed (`specdec.probes.probe_min_rows`): on some CPUs
every row count from 1 to `MAX_INVARIANT_ROWS` agrees; on others a lone row takes another kernel than two or more
(float32 with an input width over 1024 on AVX-512 CPUs), and a layer then pads a one-row input to two rows, which
costs about what one row does. `specdec.probes.linear_min_rows` keeps the probe's answer per machine.
Reference twin: `F.linear` (`tests/test_packed.py` checks the two agree).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specdec import probes
from specdec.probes import PACKED_DTYPES

# The row count oneDNN lays the packed weight out for; tuned with `python -m specdec bench --cost-curve`
# (docs/benchmarks.md): a layout for one row is neither flat nor row-invariant, 8 rows is both on the CPUs measured.
PACK_ROWS = 8
# A model whose rows need not be row-invariant (a Mamba drafter) keeps its linears of at most this many weights as
# plain `F.linear`: at one row and this size the BLAS kernel beats the packed call's fixed cost (`pack_linears`).
SMALL_WEIGHTS = 1024 * 256


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] -> an opaque oneDNN tensor in its blocked layout for `PACK_ROWS`-row inputs."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return _LINEAR_POINTWISE(x, packed, bias, "none", [], "")  # x [..., in] -> [..., out]


# The op's one overload, looked up once (calling the op by name resolves the overload again on every call).
_LINEAR_POINTWISE = getattr(getattr(torch.ops.mkldnn, "_linear_pointwise", None), "default", None)


class PackedLinear(nn.Linear):
    """An `nn.Linear` (float32 or bfloat16, CPU) whose forward runs on a packed copy of its weight.

    `min_rows`: inputs with fewer rows are padded with zero rows to this many (`specdec.probes`), so every call
    takes the kernel that larger blocks take. Inference only: where autograd needs the weight or the input
    (training) it falls back to `F.linear`, as it does for a tensor on another device or in another dtype. The
    packed copy follows the weight: a weight changed in place or replaced (`load_state_dict`, `.to()`) is packed
    again at the next call.
    """

    def __init__(self, linear: nn.Linear, min_rows: int = 1) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias  # the same Parameters: ties and `.weight` readers hold
        self.min_rows = min_rows
        self.repack()

    def repack(self) -> None:
        """Pack the weight again (a weight moved off the CPU, or cast to a dtype this CPU cannot pack, is left
        unpacked: `F.linear`)."""
        packable = self.weight.device.type == "cpu" and self.weight.dtype in PACKED_DTYPES and \
            probes.packing_available(self.weight.dtype)
        self.packed = _pack(self.weight) if packable else None
        self.packed_dtype = self.weight.dtype if packable else None
        self.packed_from = self._weight_key()

    def _weight_key(self) -> tuple[int, int, torch.dtype]:
        weight = self.weight  # an inference tensor keeps no version counter (nor may it change outside inference)
        return weight.data_ptr(), 0 if weight.is_inference() else weight._version, weight.dtype

    def unpack(self) -> None:
        """Drop the packed copy (a `FusedLinear` holds this weight packed); the next call packs it again."""
        self.packed = self.packed_from = None

    def _stale(self, weight: torch.Tensor) -> bool:
        """Whether the weight changed since it was packed (replaced, moved, cast, or written in place), or was
        unpacked."""
        if self.packed_from is None:
            return True
        ptr, version, dtype = self.packed_from
        return weight.dtype != dtype or weight.data_ptr() != ptr or (not weight.is_inference() and
                                                                      weight._version != version)

    def __getstate__(self) -> dict:  # copies and pickles carry the weight; the packed copy is rebuilt from it
        return {key: value for key, value in super().__getstate__().items() if key not in ("packed", "packed_from")}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.repack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight  # read once: a Module's parameter lookup is slow next to a small matmul
        if not x.is_cpu or x.dtype != weight.dtype or weight.dtype not in PACKED_DTYPES or \
                (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
            return F.linear(x, weight, self.bias)
        if self._stale(weight):
            self.repack()
        if self.packed is None:
            return F.linear(x, weight, self.bias)
        return _padded_linear(x, self.packed, self.bias, self.min_rows)


def _padded_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, min_rows: int) -> torch.Tensor:
    """x [..., in] through a packed weight; fewer than `min_rows` rows are padded with zero rows to that many and
    only the first rows' outputs kept."""
    in_features = x.shape[-1]
    rows = x.numel() // in_features
    if 0 < rows < min_rows:
        padded = torch.cat([x.reshape(rows, in_features), x.new_zeros(min_rows - rows, in_features)])
        out = _packed_linear(padded, packed, bias)[:rows]
        return out.reshape(*x.shape[:-1], out.shape[-1])
    return _packed_linear(x, packed, bias)


class FusedLinear:
    """`PackedLinear`s without biases that read the same input (a layer's query, key and value projections; its
    gate and up projections) multiplied as one: their weights stacked and packed together, one kernel call
    instead of several, each part of the output the bits its own layer gives (`fuse` makes one only where this
    CPU's kernel does so). The layers' own packed copies are dropped, so each weight is held packed once; a layer
    called on its own (the model's own `forward`) packs itself again. A layer's weight that changes has the
    whole packed again at the next call. Inference only, like the pass that calls it (no autograd through the
    packed weight).
    """

    def __init__(self, linears: list[PackedLinear]) -> None:
        self.linears = linears
        self.sizes = [linear.out_features for linear in linears]
        self.min_rows = max(linear.min_rows for linear in linears)
        self.repack()

    def repack(self) -> None:
        self.packed = _pack(torch.cat([linear.weight.detach() for linear in self.linears]))  # [sum(out), in]
        self.packed_from = self._weight_keys()
        for linear in self.linears:
            linear.unpack()

    def _weight_keys(self) -> list[tuple[int, int, torch.dtype]]:
        return [linear._weight_key() for linear in self.linears]

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [..., in] -> each layer's output [..., out_i] (views of one tensor)."""
        if self._weight_keys() != self.packed_from:
            if not all(linear.weight.is_cpu and linear.weight.dtype == x.dtype for linear in self.linears):
                return tuple(linear(x) for linear in self.linears)  # moved or cast: each layer as it is
            self.repack()
        return _padded_linear(x, self.packed, None, self.min_rows).split(self.sizes, dim=-1)


def fuse(linears: list[nn.Module]) -> FusedLinear | None:
    """One `FusedLinear` for `linears`, or None where they cannot be fused exactly: not all packed, with a bias,
    of other input widths or dtypes, or (`specdec.probes.fusion_is_exact`) a CPU whose kernel gives a stacked
    weight's rows other bits than the layers' own."""
    if not all(isinstance(linear, PackedLinear) and linear.bias is None for linear in linears):
        return None
    first = linears[0].weight
    if any(linear.in_features != linears[0].in_features or linear.weight.dtype != first.dtype or
           not linear.weight.is_cpu for linear in linears) or not probes.packing_available(first.dtype):
        return None
    shapes = tuple((linear.out_features, linear.min_rows) for linear in linears)
    return FusedLinear(linears) if probes.fusion_is_exact(first.dtype, linears[0].in_features, shapes) else None


def pack_linears(model: nn.Module, min_rows: int = 1, plain_up_to: int = 0) -> int:
    """Swap every CPU `nn.Linear` of `model` in a packable dtype for a `PackedLinear` (in place; idempotent).

    `min_rows` (the probe's answer for the dtype) pads lone rows only in layers whose shape needs it
    (`specdec.probes.shape_min_rows`): padding is a copy on every call. Linears of at most `plain_up_to` weights
    stay as they are (for a model whose bits need not be row-invariant: `SMALL_WEIGHTS`). Returns how many were
    swapped; 0 where packing is unavailable. The model's outputs change only by the rounding of another kernel.
    """
    swapped = 0
    for name, module in list(model.named_modules()):
        weight = module.weight if type(module) is nn.Linear else None
        if weight is not None and weight.numel() > plain_up_to and weight.dtype in PACKED_DTYPES and \
                weight.device.type == "cpu" and probes.packing_available(weight.dtype):
            rows = 1 if min_rows == 1 else probes.shape_min_rows(weight.dtype, *weight.shape, min_rows)
            model.set_submodule(name, PackedLinear(module, rows))
            swapped += 1
    return swapped


def head_linear(weight: torch.Tensor) -> nn.Module:
    """`x @ weight.T` as a layer, for a weight [out, in] that is not a model's `nn.Linear` (a draft head's rows cut
    from an embedding): a `PackedLinear` over it, so a CPU multiplies a few rows by it at the packed layout's
    speed rather than through a plain matrix product, which reads the whole weight at a fraction of the memory's
    speed for one row; elsewhere `F.linear`. The weight is shared, not copied."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta", dtype=weight.dtype)
    linear.weight = nn.Parameter(weight.detach(), requires_grad=False)
    return PackedLinear(linear)
