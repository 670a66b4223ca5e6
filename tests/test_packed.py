"""Packed linears (`specdec.packed`, float32 and bfloat16) against their reference twin, `F.linear`."""

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specdec import probes
from specdec.models import load_model
import specdec.packed as packed_module
from specdec.packed import SMALL_WEIGHTS, PackedLinear, pack_linears
from specdec.probes import MAX_INVARIANT_ROWS, linear_min_rows, linear_shapes, packing_available, probe_min_rows
from tests.exact import require_row_invariant
from tests.tiny import tiny_llama

# Each test skips only for the dtypes it packs: a CPU without bf16 packing (AVX2) still runs the float32 ones.
F32 = pytest.mark.skipif(not packing_available(torch.float32), reason="no oneDNN packed float32 linear here")
BF16 = pytest.mark.skipif(not packing_available(torch.bfloat16), reason="no oneDNN packed bfloat16 linear here")
DTYPES = [pytest.param(torch.float32, marks=F32, id="float32"), pytest.param(torch.bfloat16, marks=BF16, id="bf16")]
SHAPES = ((576, 576), (1536, 576), (576, 1536), (8192, 576))  # SmolLM2-135M's widths and a reduced head
TOLERANCE = {torch.bfloat16: 0.05, torch.float32: 1e-4}  # rounding of outputs of size ~1


def _linear(out_features: int, in_features: int, bias: bool, dtype: torch.dtype = torch.bfloat16) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(in_features, out_features, bias=bias).to(dtype).requires_grad_(False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_features", [576, 1536])  # 1536: a lone float32 row takes another kernel on AVX-512
@pytest.mark.parametrize("bias", [False, True])
def test_packed_agrees_with_f_linear_and_is_row_invariant(bias, in_features, dtype):
    min_rows = require_row_invariant(dtype, SHAPES)
    linear = _linear(576, in_features, bias, dtype)
    packed = PackedLinear(linear, min_rows)
    x = torch.randn(1, 40, in_features).to(dtype)  # [1, n, in]
    out = packed(x)  # [1, n, out]
    reference = F.linear(x.float(), linear.weight.float(), None if linear.bias is None else linear.bias.float())
    assert out.shape == (1, 40, 576) and out.dtype == dtype
    assert (out.float() - reference).abs().max() < TOLERANCE[dtype]
    single = torch.cat([packed(x[:, i: i + 1]) for i in range(40)], dim=1)  # one row a call, padded where needed
    for n in (2, 3, 5, 8, 16, 32):  # up to the verifier's block size: row i has the same bits whatever the count
        assert torch.equal(packed(x[:, :n]), single[:, :n])
    assert MAX_INVARIANT_ROWS == 32


@F32
def test_a_padded_single_row_is_the_row_of_a_larger_block():
    """`min_rows=2` computes a lone row inside a two-row call: its bits are those of any larger block's row, and
    the shapes of the input come back (a batch of one, a flat vector of rows)."""
    linear = _linear(576, 1536, bias=True, dtype=torch.float32)
    packed = PackedLinear(linear, min_rows=2)
    x = torch.randn(5, 1536)
    block = packed(x)  # [5, 576]
    assert torch.equal(packed(x[None, 2:3]), block[None, 2:3])  # [1, 1, in] -> [1, 1, out]
    assert torch.equal(packed(x[3]), block[3])  # [in] -> [out]


@F32
def test_the_probe_finds_the_fewest_rows_that_are_invariant(monkeypatch):
    """Against a stand-in kernel whose lone row is computed differently (as float32 on AVX-512 is), the probe
    answers 2; against one that changes every row with the count, None; the real kernel's answer is kept."""
    from specdec import packed as packed_module

    real = packed_module._packed_linear

    def lone_row_differs(x, weight, bias):
        out = real(x, weight, bias)
        return out + 1 if x.shape[0] == 1 else out

    def count_dependent(x, weight, bias):
        return real(x, weight, bias) * (1 + 1e-3 * x.shape[0])

    for kernel, expected in ((lone_row_differs, 2), (count_dependent, None)):
        monkeypatch.setattr(packed_module, "_packed_linear", kernel)
        probe_min_rows.cache_clear()
        assert probe_min_rows(torch.float32, SHAPES, rows=6) == expected, kernel.__name__
    monkeypatch.undo()
    probe_min_rows.cache_clear()
    assert probe_min_rows(torch.float32, SHAPES) == linear_min_rows(torch.float32, SHAPES)


def test_a_models_shapes_are_probed_once_and_kept(monkeypatch, tmp_path):
    """The linear probe runs on the shapes of the model at hand, once per machine: its answer is kept in
    `cpu-kernels.json` under the dtype and the shapes, and a later call (a later process) reads it."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(probes, "probe_min_rows", lambda dtype, shapes: calls.append((dtype, shapes)) or 2)
    shapes = linear_shapes(tiny_llama(11, seed=1))
    assert shapes == ((32, 32), (16, 32), (64, 32), (32, 64), (11, 32))  # q and o, k and v, gate and up, down, head
    assert linear_min_rows(torch.float32, shapes) == linear_min_rows(torch.float32, shapes) == 2
    assert calls == [(torch.float32, shapes)]
    kept = json.loads((tmp_path / "cpu-kernels.json").read_text())
    assert [answers for answers in kept.values()] == [{"linears float32 32x32 16x32 64x32 32x64 11x32": 2}]
    assert linear_min_rows(torch.float16, shapes) is None and len(calls) == 1  # not a packed dtype: not probed


@F32
@BF16
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
    as_half = packed.half()  # a dtype oneDNN packing does not take: F.linear, and copies of it need no packing
    assert torch.equal(as_half(x.half()), F.linear(x.half(), linear.weight.half()))
    assert copy.deepcopy(as_half).packed is None
    as_float = packed.float()  # float32 is packed again, from the converted weight
    assert torch.allclose(as_float(x.float()), F.linear(x.float(), as_float.weight), atol=1e-5)
    assert as_float.packed_dtype == torch.float32


@BF16
def test_pack_linears_keeps_tied_weights_and_autograd():
    model = nn.Sequential(nn.Embedding(10, 16), nn.Linear(16, 16), nn.Linear(16, 10, bias=False)).bfloat16()
    model[2].weight = model[0].weight  # a tied output layer
    assert pack_linears(model) == 2 and pack_linears(model) == 0  # idempotent
    assert isinstance(model[2], PackedLinear) and model[2].weight is model[0].weight
    loss = model(torch.tensor([1, 2])).float().sum()  # grad enabled, weights require grad: F.linear, differentiable
    loss.backward()
    assert model[1].weight.grad is not None


@F32
def test_a_drafter_keeps_its_small_linears_plain():
    """A model that is not verified packs only its large linears; a verified one packs all of them."""
    model = nn.Sequential(nn.Linear(1024, 256), nn.Linear(1024, 257, bias=False))
    assert pack_linears(model, plain_up_to=SMALL_WEIGHTS) == 1
    assert type(model[0]) is nn.Linear and isinstance(model[1], PackedLinear)
    drafter = load_model("mamba-smollm2", torch.device("cpu"), torch.float32, verified=False).model
    verified = load_model("mamba-smollm2", torch.device("cpu"), torch.float32).model
    small = [name for name, m in drafter.named_modules()
             if isinstance(m, nn.Linear) and m.weight.numel() <= SMALL_WEIGHTS]
    assert small and all(type(drafter.get_submodule(name)) is nn.Linear for name in small)
    assert all(isinstance(verified.get_submodule(name), PackedLinear) for name in small)


@F32
def test_a_weight_cast_to_a_dtype_this_cpu_cannot_pack_runs_unpacked(monkeypatch):
    """A float32 model packed, then cast to bf16 on a CPU whose oneDNN has no bf16 reorder (AVX2): plain F.linear."""
    linear = nn.Linear(16, 8)
    packed = PackedLinear(linear)
    monkeypatch.setattr(probes, "packing_available", lambda dtype=torch.bfloat16: dtype == torch.float32)
    packed.to(torch.bfloat16)
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(packed(x), F.linear(x, packed.weight, packed.bias)) and packed.packed is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_draft_head_cut_from_an_embedding_is_multiplied_packed(dtype):
    """`head_linear` (a drafter's reduced head: rows of a tied embedding, no `nn.Linear` of its own) computes
    x @ W.T with the weight packed once, sharing the weight; a head on another device runs `F.linear`."""
    torch.manual_seed(0)
    embedding = torch.randn(300, 64).to(dtype)
    rows = embedding[torch.tensor([0, 5, 7, 299])]  # [4, 64]
    head = packed_module.head_linear(rows)
    assert isinstance(head, PackedLinear) and head.packed is not None and head.weight.data_ptr() == rows.data_ptr()
    x = torch.randn(3, 64).to(dtype)
    with torch.inference_mode():
        torch.testing.assert_close(head(x).float(), (x @ rows.T).float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    meta = packed_module.head_linear(rows.to("meta"))
    assert meta.packed is None and meta(x.to("meta")).shape == (3, 4)
