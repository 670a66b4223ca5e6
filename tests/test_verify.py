"""Tree attention: one pass over a tree gives the logits of running each branch on its own."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specdec.packed import PackedLinear, fuse
from specdec.probes import packing_available
from specdec.tree import TreeShape
from specdec.verify import TreeLM
from tests.tiny import tiny_llama


BACKENDS = ["split", "block", "plain"]


def make(model, backend: str) -> TreeLM:
    """A verifier of one backend: the CPU's row-invariant (`split`) or `block` one, or the `plain` one that CUDA
    and MPS run (here on a CPU: the model's own forward and linears)."""
    if backend == "plain":
        lm = TreeLM.__new__(TreeLM)  # no model given: no backend picked
        lm.__init__(model)
        return lm
    return TreeLM(model, row_invariant=backend == "split")


def _branch(parents: list[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_tree_logits_match_each_branch(attn):
    model = tiny_llama(11, seed=5, attn=attn)
    prefix = [1, 4, 2, 7, 3]
    shape = TreeShape((2, 2, 1))
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 11, (len(shape.parents),), generator=g).tolist()
    lm = TreeLM(model)
    lm.feed(prefix)
    logits = lm.extend(tokens, shape.parents)  # [n, V]
    for node in range(len(tokens)):
        seq = prefix + [tokens[i] for i in _branch(shape.parents, node)]
        expected = model(input_ids=torch.tensor([seq])).logits[0, -1]
        torch.testing.assert_close(logits[node], expected, atol=1e-4, rtol=1e-4)


def test_commit_keeps_only_the_accepted_path():
    model = tiny_llama(11, seed=6)
    prefix = [1, 4, 2]
    shape = TreeShape((3, 2))
    tokens = [5, 0, 1, 2, 3, 4, 6, 7, 8, 9]
    lm = TreeLM(model)
    lm.feed(prefix)
    lm.extend(tokens[: len(shape.parents)], shape.parents)
    path = [0, 2, 6]  # root, its second child, that child's second child
    lm.commit(path)
    assert lm.length == len(prefix) + 3
    next_logits = lm.feed([9])[-1]
    seq = prefix + [tokens[i] for i in path] + [9]
    torch.testing.assert_close(next_logits, model(input_ids=torch.tensor([seq])).logits[0, -1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("keep", [[], [0], [0, 1], [0, 1, 4], [0, 2, 7], [0, 3]])
@pytest.mark.parametrize("passes", [1, 2])
def test_commit_copies_only_what_is_not_in_place(backend, keep, passes):
    """A pass leaves one branch in the buffer (the row layout: the first child's, visited last; the block layout:
    the region in order); a commit along it copies nothing, any other keeps the right keys all the same."""
    model = tiny_llama(11, seed=6)
    prefix, shape = [1, 4, 2], TreeShape((3, 2))
    tokens = [5, 0, 1, 2, 3, 4, 6, 7, 8, 9]
    lm = make(model, backend)
    lm.feed(prefix)
    cut = 4 if passes == 2 else len(tokens)  # the tree fed in one pass, or in two
    lm.extend(tokens[:cut], shape.parents[:cut])
    if cut < len(tokens):
        lm.extend(tokens[cut:], shape.parents[cut:])
    writes = []
    original = lm.cache.write
    lm.cache.write = lambda layer, at, index: (writes.append(layer), original(layer, at, index))
    lm.commit(keep)
    in_place = [0, 1, 4] if backend == "split" else list(range(len(tokens)))
    expected_copies = 0 if keep == in_place[:len(keep)] else model.config.num_hidden_layers
    assert len(writes) == expected_copies
    seq = prefix + [tokens[i] for i in keep] + [9]
    torch.testing.assert_close(lm.feed([9])[-1], model(input_ids=torch.tensor([seq])).logits[0, -1], atol=1e-4,
                               rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_commit_of_a_branch_deeper_than_the_placed_one_fits_the_buffer(backend):
    """The split layout places the first child's branch; a commit of a deeper branch (a lookup branch beside a short
    drafted one) must still find room when the prefix ends just short of the buffer's capacity."""
    model = tiny_llama(11, seed=6, positions=512)
    prefix = [1, 4, 2, 7, 3] * 50 + [1, 4]  # 252 tokens: a buffer of 256 positions
    lm = make(model, backend)
    lm.prefill(prefix)
    parents = [-1, 0, 0, 2, 3, 4, 5, 6]  # root; its first child a leaf; its second child a chain 6 deep
    tokens = [5, 0, 1, 2, 3, 4, 6, 7]
    lm.extend(tokens, parents)
    keep = [0, 2, 3, 4, 5, 6, 7]
    lm.commit(keep)
    assert lm.length == len(prefix) + len(keep)
    seq = prefix + [tokens[i] for i in keep] + [9]
    torch.testing.assert_close(lm.feed([9])[-1], model(input_ids=torch.tensor([seq])).logits[0, -1], atol=1e-4,
                               rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pass_that_grows_the_buffer_keeps_the_region_fed_before(backend):
    """Two passes before a commit (as the Transformer drafter feeds a tree level by level), the second growing the
    buffer: the first pass's keys are still there for it."""
    model = tiny_llama(11, seed=6, positions=512)
    prefix = [1, 4, 2, 7, 3] * 50 + [1, 4, 2, 7]  # 254 tokens: a buffer of 256 positions
    lm = make(model, backend)
    lm.prefill(prefix)
    lm.extend([5], [-1])  # 255 positions
    logits = lm.extend([0, 1], [0, 1])  # a chain below it: 257 positions, so the buffer grows
    expected = model(input_ids=torch.tensor([prefix + [5, 0, 1]])).logits[0, -2:]
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def test_the_backend_is_chosen_once_from_the_device_and_the_models_own_shapes(monkeypatch):
    """On a CPU the verifier is row-invariant where this machine's packed linears of the model's dtype and shapes
    are (the kept probe), else the block layout; elsewhere it is the plain backend, which is never row-invariant. A
    copy keeps its backend."""
    from specdec import probes
    from specdec.verify.cpu import CpuTreeLM, RowInvariantTreeLM

    model = tiny_llama(11, seed=2)
    asked = []
    monkeypatch.setattr(probes, "linear_min_rows", lambda dtype, shapes: asked.append((dtype, shapes)) and None)
    assert type(TreeLM(model)) is CpuTreeLM and asked[0] == (torch.float32, probes.linear_shapes(model))
    monkeypatch.setattr(probes, "linear_min_rows", lambda dtype, shapes: 1)
    lm = TreeLM(model)
    assert type(lm) is RowInvariantTreeLM and lm.row_invariant and type(lm.fork()) is RowInvariantTreeLM
    meta = tiny_llama(11, seed=2).to("meta")
    assert type(TreeLM(meta)) is TreeLM and type(TreeLM(meta).fork()) is TreeLM
    with pytest.raises(ValueError, match="runs on a CPU"):
        TreeLM(meta, row_invariant=True)


def test_commit_refuses_a_non_chain():
    lm = TreeLM(tiny_llama(11, seed=6))
    lm.feed([1, 2])
    lm.extend([3, 4, 5], [-1, 0, 0])
    with pytest.raises(ValueError):
        lm.commit([0, 2, 1])


def test_sliding_window_targets_are_refused():
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=11, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=8)
    with pytest.raises(ValueError, match="sliding-window"):
        TreeLM(MistralForCausalLM(config))




def test_the_attention_probe_keeps_each_rows_bits_whatever_the_other_rows(monkeypatch):
    """`probe_attention_mode` pads a batch of one where a lone batch element takes another path, stacks the rows of
    a shared head in one call where the kernel gives each row the bits it gets alone (padding a lone row to two
    where only that differs), and against a stand-in kernel whose rows change with the number of queries falls
    back to one batch element a row. Whatever this machine's answer (the one kept for it), every row's bits are the
    same alone and with others."""
    from specdec import probes
    from specdec.probes import AttentionMode
    from specdec.verify import split

    real = split._flash

    def per_query(q, k, v, *args, **kwargs):  # each query its own batch element: the same bits whatever the others
        b, h, n, d = q.shape
        if kwargs.get("attn_mask") is not None:
            kwargs["attn_mask"] = kwargs["attn_mask"].repeat_interleave(n, 0)
        out, lse = real(q.transpose(1, 2).reshape(b * n, h, 1, d), k.repeat_interleave(n, 0),
                        v.repeat_interleave(n, 0), *args, **kwargs)
        return out.view(b, n, h, d).transpose(1, 2), lse.view(b, n, h).transpose(1, 2)

    def count_dependent(q, k, v, *args, **kwargs):
        out, lse = per_query(q, k, v, *args, **kwargs)
        return out * (1 + 1e-3 * q.shape[2]), lse

    def lone_differs(q, k, v, *args, **kwargs):  # what the CPUs measured do: a lone batch element, a lone row
        out, lse = per_query(q, k, v, *args, **kwargs)
        return (out * (1 + 1e-3) if q.shape[:3:2] == (1, 3) else out), lse  # one batch element of 3 queries

    monkeypatch.setattr(split, "_flash", count_dependent)
    assert probes.probe_attention_mode(torch.float32, 3, 8) == AttentionMode(1, 0, 1)
    monkeypatch.setattr(split, "_flash", lone_differs)
    assert probes.probe_attention_mode(torch.float32, 3, 8) == AttentionMode(2, 10, 2)
    monkeypatch.setattr(split, "_flash", lambda q, *a, **kw: (lambda o, lse: (o * (1 + 1e-3 * q.shape[0]), lse))(
        *per_query(q, *a, **kw)))  # every batch size its own bits: no padding helps, and the probe says so
    with pytest.warns(UserWarning, match="not bit-exact"):
        assert probes.probe_attention_mode(torch.float32, 3, 8) == AttentionMode(2)
    monkeypatch.undo()
    mode = probes.probe_attention_mode(torch.float32, 3, 8)
    assert probes.attention_mode(torch.float32, 3, 8) == mode
    q, k = torch.randn(12, 3, 3, 8), torch.randn(1, 3, 20, 8)  # more rows than one call stacks: the last holds two
    for m in (1, 2, 11, 12):
        together = split._head_attention(q[:m], k, k, None, mode)
        assert probes._same_rows(together, [split._head_attention(q[i: i + 1], k, k, None, mode) for i in range(m)])


def test_a_fork_shares_the_weights_and_not_the_cache():
    lm = TreeLM(tiny_llama(11, seed=9))
    lm.prefill([1, 2, 3])
    fork = lm.fork()
    assert fork.model is lm.model
    fork.feed([4, 5])
    assert (lm.length, fork.length) == (3, 5)
    torch.testing.assert_close(fork.feed([6]), lm.fork().feed([4, 5, 6])[-1:], atol=1e-5, rtol=1e-5)


def passes(lm: TreeLM, prompt: list[int], tokens: list[int], parents: list[int]) -> list[torch.Tensor]:
    """The logits and last hidden states of a prefill of `prompt`, a tree, a commit of its last node's branch, a
    chain and a decode step (what `_llama_pass` must give as the model's own `forward` does)."""
    out = [lm.prefill(prompt), lm.hidden, lm.extend(tokens, parents), lm.hidden]
    lm.commit(_branch(parents, len(tokens) - 1))
    return out + [lm.feed([7, 8, 9]), lm.feed([10]), lm.hidden]


@pytest.mark.parametrize("row_invariant", [True, False])
def test_the_direct_pass_gives_the_bits_of_the_models_own_forward(row_invariant):
    """`TreeLM` runs a transformers Llama's layers itself (`_llama_pass`); every pass (prefill, tree, chain, decode
    step) gives the bits of going through the model's `forward`, whatever the layout. A subclass runs its own."""
    model = tiny_llama(11, seed=7)
    direct, through = TreeLM(model, row_invariant=row_invariant), TreeLM(model, row_invariant=row_invariant)
    through.direct = False
    assert direct.direct
    shape = TreeShape((2, 2, 1))
    tokens = [(3 * i + 5) % 11 for i in range(len(shape.parents))]
    prompt = list(range(1, 10)) * 9  # 81 tokens: the split layout has a head to attend
    expected = passes(through, prompt, tokens, shape.parents)
    assert all(torch.equal(a, b) for a, b in zip(passes(direct, prompt, tokens, shape.parents), expected, strict=True))

    class Custom(type(model.model.layers[0].mlp)):
        pass

    model.model.layers[1].mlp.__class__ = Custom
    assert not TreeLM(model).direct


@pytest.mark.skipif(not packing_available(torch.float32), reason="no oneDNN packed float32 linear here")
def test_fused_linears_give_each_layer_its_own_bits_and_follow_the_weights():
    """q/k/v-like layers fused into one packed weight: each output has its own layer's bits at every row count, the
    layers' packed copies are dropped and made again when a layer is called alone, and a weight changed in place
    is packed again. Layers with a bias or another input width are not fused."""
    torch.manual_seed(3)
    layers = [PackedLinear(nn.Linear(64, out, bias=False).requires_grad_(False)) for out in (64, 16, 16)]
    fused = fuse(layers)
    assert fused is not None and all(layer.packed is None for layer in layers)
    x = torch.randn(12, 64)
    for n in (1, 2, 5, 12):
        assert all(torch.equal(part, layer(x[:n])) for part, layer in zip(fused(x[:n]), layers))
    assert all(layer.packed is not None for layer in layers)  # called alone: packed again
    with torch.no_grad():
        layers[1].weight.mul_(2)
    assert torch.allclose(fused(x)[1], F.linear(x, layers[1].weight), atol=1e-5)
    assert fuse([PackedLinear(nn.Linear(64, 8)), PackedLinear(nn.Linear(64, 8))]) is None  # biases
    assert fuse([layers[0], PackedLinear(nn.Linear(32, 8, bias=False))]) is None
