"""bfloat16 linear layers with their weights packed once for oneDNN (CPU): the same matmul, without the per-call cost.

On a CPU, `F.linear` in bfloat16 hands the weight to oneDNN in its plain layout on every call, and oneDNN reorders
it into its blocked layout each time. For a decode step (one row against every weight of the model) that reorder
costs more than the multiply: on this project's Intel Xeon (AMX) the 211 matmuls of a SmolLM2-135M step took 50 ms
in bf16 against 55 ms in float32 on one thread, and 34 ms with the weights packed once (`python -m specdec bench`
reports the whole step). Packing is what PyTorch's own compiler does for frozen CPU models (inductor's weight
prepacking); this module does the same for an eager model: each `nn.Linear` is swapped for a `PackedLinear` that
keeps the original `weight` Parameter (tied weights stay tied, anything reading `.weight` still works) and a packed
copy used by `forward`.

The packed kernel is row-invariant: row i of an n-row input gets the same bits for every n (checked on this CPU up
to 32 rows, the verifier's block size; `specdec.kvcache.bf16_is_row_invariant` probes it on each machine), which
the exact bf16 verifier needs.
Reference twin: `F.linear` (`tests/test_packed.py` checks the two agree).
"""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F
from torch import nn


@cache
def packing_available() -> bool:
    """Whether this torch build has oneDNN's packed linear for bfloat16 on this CPU (tried once per process)."""
    try:
        w = torch.zeros(8, 16, dtype=torch.bfloat16)
        out = _packed_linear(torch.ones(2, 16, dtype=torch.bfloat16), _pack(w), None)
        return out.shape == (2, 8) and bool((out == 0).all())
    except (AttributeError, RuntimeError):  # no mkldnn ops in this build, or no bf16 primitive on this CPU
        return False


# The row count oneDNN lays the packed weight out for. A speculative round runs blocks of 1 to ~16 rows. Measured
# on this project's Xeon (AMX, 2 threads, the 211 matmuls of a SmolLM2 step, interleaved, medians of 7): a layout
# for 1 row took 38.9 ms for 1 row and 39.6 for 6; for 4, 8, 16, 32 or 64 rows, 24-30 ms for either (float32:
# 28-31 and 53-54). The 1-row layout was row-invariant up to 80 rows, the others up to 32 (33 switches kernels),
# which is the verifier's block size (`specdec.kvcache.MAX_INVARIANT_ROWS`).
PACK_ROWS = 8


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] -> an opaque oneDNN tensor in its blocked layout for `PACK_ROWS`-row inputs."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")  # x [..., in] -> [..., out]


class PackedLinear(nn.Linear):
    """An `nn.Linear` (bfloat16, CPU) whose forward runs on a packed copy of its weight.

    Inference only: where autograd needs the weight or the input (training) it falls back to `F.linear`, as it
    does for a tensor on another device or in another dtype. The packed copy follows the weight: a weight changed
    in place or replaced (`load_state_dict`, `.to()`) is packed again at the next call.
    """

    def __init__(self, linear: nn.Linear) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias  # the same Parameters: ties and `.weight` readers hold
        self.repack()

    def repack(self) -> None:
        """Pack the weight again (a weight moved off the CPU or out of bf16 is left unpacked: `F.linear` runs)."""
        cpu_bf16 = self.weight.device.type == "cpu" and self.weight.dtype == torch.bfloat16
        self.packed = _pack(self.weight) if cpu_bf16 else None
        self.packed_from = self._weight_key()

    def _weight_key(self) -> tuple[int, int]:
        weight = self.weight  # an inference tensor keeps no version counter (nor may it change outside inference)
        return weight.data_ptr(), 0 if weight.is_inference() else weight._version

    def __getstate__(self) -> dict:  # copies and pickles carry the weight; the packed copy is rebuilt from it
        return {key: value for key, value in super().__getstate__().items() if key not in ("packed", "packed_from")}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.repack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.dtype != torch.bfloat16 or self.weight.dtype != torch.bfloat16 or \
                (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
            return F.linear(x, self.weight, self.bias)
        if self._weight_key() != self.packed_from:
            self.repack()
        return _packed_linear(x, self.packed, self.bias)


def pack_linears(model: nn.Module) -> int:
    """Swap every bfloat16 CPU `nn.Linear` of `model` for a `PackedLinear` (in place; idempotent).

    Returns how many were swapped; 0 where packing is unavailable. The model's outputs change only by the
    rounding of another kernel; its greedy tokens are then exact to this model, as every bf16 pass here is.
    """
    if not packing_available():
        return 0
    swapped = 0
    for name, module in list(model.named_modules()):
        if type(module) is nn.Linear and module.weight.dtype == torch.bfloat16 and module.weight.device.type == "cpu":
            model.set_submodule(name, PackedLinear(module))
            swapped += 1
    return swapped
