"""Packed bfloat16 linears (`specdec.packed`) against their reference twin, `F.linear`."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specdec.kvcache import MAX_INVARIANT_ROWS
from specdec.packed import PackedLinear, pack_linears, packing_available

pytestmark = pytest.mark.skipif(not packing_available(), reason="no oneDNN packed bf16 linear on this CPU/build")


def _linear(out_features: int, in_features: int, bias: bool) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(in_features, out_features, bias=bias).bfloat16().requires_grad_(False)


@pytest.mark.parametrize("bias", [False, True])
def test_packed_agrees_with_f_linear_and_is_row_invariant(bias):
    linear = _linear(1536, 576, bias)
    packed = PackedLinear(linear)
    x = torch.randn(1, 40, 576).bfloat16()  # [1, n, in]
    out = packed(x)  # [1, n, out]
    reference = F.linear(x.float(), linear.weight.float(), None if linear.bias is None else linear.bias.float())
    assert out.shape == (1, 40, 1536)
    assert (out.float() - reference).abs().max() < 0.05  # bf16 rounding of outputs of size ~1
    single = torch.cat([packed(x[:, i: i + 1]) for i in range(40)], dim=1)
    for n in (2, 3, 5, 8, 16, 32):  # up to the verifier's block size: row i has the same bits whatever the count
        assert torch.equal(packed(x[:, :n]), single[:, :n])
    assert MAX_INVARIANT_ROWS == 32


def test_packing_follows_the_weight_and_survives_copies():
    linear = _linear(64, 32, bias=False)
    packed = PackedLinear(linear)
    x = torch.randn(3, 32).bfloat16()
    before = packed(x)
    with torch.no_grad():
        linear.weight.mul_(2)  # in place: the packed copy must not go stale
    assert torch.allclose(packed(x).float(), 2 * before.float(), rtol=0.02, atol=0.02)
    clone = copy.deepcopy(packed)
    assert torch.equal(clone(x), packed(x)) and clone.weight.data_ptr() != packed.weight.data_ptr()
    as_float = packed.float()  # another dtype: F.linear, and copies of it need no packing
    assert torch.equal(as_float(x.float()), F.linear(x.float(), linear.weight.float()))
    assert copy.deepcopy(as_float).packed is None


def test_pack_linears_keeps_tied_weights_and_autograd():
    model = nn.Sequential(nn.Embedding(10, 16), nn.Linear(16, 16), nn.Linear(16, 10, bias=False)).bfloat16()
    model[2].weight = model[0].weight  # a tied output layer
    assert pack_linears(model) == 2 and pack_linears(model) == 0  # idempotent
    assert isinstance(model[2], PackedLinear) and model[2].weight is model[0].weight
    loss = model(torch.tensor([1, 2])).float().sum()  # grad enabled, weights require grad: F.linear, differentiable
    loss.backward()
    assert model[1].weight.grad is not None
