"""Tree attention: one pass over a tree gives the logits of running each branch on its own."""

import threading

import pytest
import torch

from specdec.kvcache import SLOW_HEAD_ROWS, TreeLM, padded_rows
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


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_output_layer_row_padding_changes_no_logit(n):
    """2-3-row blocks reach the output layer as 4 rows on a CPU; the logits are those of the unpadded pass."""
    model = tiny_llama(11, seed=7)
    seen: list[int] = []
    model.get_output_embeddings().register_forward_hook(lambda module, args, out: seen.append(args[0].shape[-2]))
    tokens = [3, 1, 4, 1, 5][:n]
    padded = TreeLM(model)
    assert padded.head_padding  # on by default on a CPU
    plain = TreeLM(model)
    plain.head_padding = {}
    a = padded.feed(tokens)
    b = plain.feed(tokens)
    assert a.shape == b.shape == (n, 11)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert seen == [4 if n in (2, 3) else n, n]
    assert len(model.get_output_embeddings()._forward_hooks) == 1  # only the test's own hook is left


def test_row_padding_leaves_other_threads_alone():
    model = tiny_llama(11, seed=8)
    head = model.get_output_embeddings()
    seen: list[int] = []
    head.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[-2]))
    other: list[torch.Tensor] = []
    with padded_rows(head, SLOW_HEAD_ROWS):
        worker = threading.Thread(target=lambda: other.append(model(input_ids=torch.tensor([[1, 2]])).logits))
        worker.start()
        worker.join()
        mine = model(input_ids=torch.tensor([[1, 2]])).logits
    assert seen == [2, 4]  # the other thread's call was not padded, this thread's was
    assert other[0].shape == mine.shape == (1, 2, 11)
