"""Tree attention: one pass over a tree gives the logits of running each branch on its own."""

import pytest
import torch

from specdec.kvcache import TreeLM
from specdec.tree import TreeShape
from tests.tiny import tiny_llama


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
    assert lm.length == len(prefix) + 3 and lm.cache.get_seq_length() == lm.length
    next_logits = lm.feed([9])[-1]
    seq = prefix + [tokens[i] for i in path] + [9]
    torch.testing.assert_close(next_logits, model(input_ids=torch.tensor([seq])).logits[0, -1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("row_invariant", [True, False])
@pytest.mark.parametrize("keep", [[], [0], [0, 1], [0, 1, 4], [0, 2, 7], [0, 3]])
@pytest.mark.parametrize("passes", [1, 2])
def test_commit_copies_only_what_is_not_in_place(row_invariant, keep, passes):
    """A pass leaves one branch in the buffer (the row layout: the first child's, visited last; the block layout:
    the region in order); a commit along it copies nothing, any other keeps the right keys all the same."""
    model = tiny_llama(11, seed=6)
    prefix, shape = [1, 4, 2], TreeShape((3, 2))
    tokens = [5, 0, 1, 2, 3, 4, 6, 7, 8, 9]
    lm = TreeLM(model, row_invariant=row_invariant)
    lm.feed(prefix)
    cut = 4 if passes == 2 else len(tokens)  # the tree fed in one pass, or in two
    lm.extend(tokens[:cut], shape.parents[:cut])
    if cut < len(tokens):
        lm.extend(tokens[cut:], shape.parents[cut:])
    writes = []
    original = lm.cache.write
    lm.cache.write = lambda layer, at, index: (writes.append(layer), original(layer, at, index))
    lm.commit(keep)
    in_place = [0, 1, 4] if row_invariant else list(range(len(tokens)))
    expected_copies = 0 if keep == in_place[:len(keep)] else model.config.num_hidden_layers
    assert len(writes) == expected_copies
    seq = prefix + [tokens[i] for i in keep] + [9]
    torch.testing.assert_close(lm.feed([9])[-1], model(input_ids=torch.tensor([seq])).logits[0, -1], atol=1e-4,
                               rtol=1e-4)


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




def test_the_head_probe_stacks_rows_only_where_the_kernel_keeps_their_bits(monkeypatch):
    """`head_mode` stacks the rows of a shared head in one call where this CPU's kernel gives each row the bits it
    gets alone; against a stand-in kernel whose rows change with the number of queries it falls back to one batch
    element a row (0), and the split layout's head then equals a call per row bitwise."""
    from specdec import kvcache

    real = kvcache._flash

    def count_dependent(q, k, v, *args, **kwargs):
        out, lse = real(q, k, v, *args, **kwargs)
        return out * (1 + 1e-3 * q.shape[2]), lse

    kvcache.head_mode.cache_clear()
    monkeypatch.setattr(kvcache, "_flash", count_dependent)
    assert kvcache.head_mode(torch.float32, 3, 8) == 0
    q, k = torch.randn(4, 3, 3, 8), torch.randn(1, 3, 20, 8)
    batched = kvcache._head_attention(q, k, k, None, 0)[0]
    assert all(torch.equal(batched[i], kvcache._head_attention(q[i: i + 1], k, k, None, 0)[0][0]) for i in range(4))
    monkeypatch.undo()
    kvcache.head_mode.cache_clear()
    stack = kvcache.head_mode(torch.float32, 3, 8)
    assert stack in (0, 10)  # this CPU's own answer: stacking 10 rows (30 queries), or none
    if stack:
        stacked = kvcache._head_attention(q, k, k, None, stack)[0]
        assert all(torch.equal(stacked[i], kvcache._head_attention(q[i: i + 1], k, k, None, stack)[0][0])
                   for i in range(4))


def test_a_fork_shares_the_weights_and_not_the_cache():
    lm = TreeLM(tiny_llama(11, seed=9))
    lm.prefill([1, 2, 3])
    fork = lm.fork()
    assert fork.model is lm.model
    fork.feed([4, 5])
    assert (lm.length, fork.length) == (3, 5)
    torch.testing.assert_close(fork.feed([6]), lm.fork().feed([4, 5, 6])[-1:], atol=1e-5, rtol=1e-5)
