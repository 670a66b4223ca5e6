"""The row-invariant verifier: in float32 and in bfloat16 on a CPU whose packed linears pass the row-invariance probe,
a tree pass gives every node the bits of decoding its branch one token at a time, so every method prints exactly
the tokens of `ar` in that precision."""

import pytest
import torch

from specdec.config import LOOKUP_BRANCH, GenerationConfig
from specdec.engine import generate, make_verifier
from specdec import probes
from specdec.models import Models
from specdec.probes import MAX_INVARIANT_ROWS
from specdec.tree import TreeShape
from specdec.verify import TreeLM
from tests.exact import require_row_invariant
from tests.test_verify import _branch, passes
from tests.tiny import tiny_llama

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module", params=DTYPES, ids=["float32", "bfloat16"])
def smollm2_exact(request, smollm2) -> Models:
    """The real target in each precision whose verifier is bit-exact here (float32: the session's shared copy)."""
    require_row_invariant(request.param, probes.linear_shapes(smollm2.target.model))
    torch.set_num_threads(2)
    if request.param == torch.float32:
        models = smollm2
    else:
        models = Models(device="cpu", dtype="bfloat16")
        models.load()
    yield models
    torch.set_num_threads(1)


def _stepwise(base: TreeLM, tokens: list[int], parents: list[int]) -> dict[int, torch.Tensor]:
    """Logits of every node from single decode steps along its branch (one copy of the cache per leaf)."""
    logits: dict[int, torch.Tensor] = {}
    leaves = [i for i in range(len(parents)) if i not in parents]
    for leaf in leaves:
        lm = base.fork()
        for node in _branch(parents, leaf):
            logits[node] = lm.feed([tokens[node]])[-1]  # [V]
    return logits


# 2000, 3984, 8008: a 15-chain from the root at context - 1 straddles a cut (a multiple of SPLIT_BLOCK plus
# SPLIT_MARGIN), so its rows use two heads; 8008: near SmolLM2's 8,192 positions
@pytest.mark.parametrize("context", [7, 2000, 3984, 8008])
def test_tree_rows_equal_single_steps_bitwise(smollm2_exact, context):
    target = smollm2_exact.target
    sentence = "A state-space model keeps a fixed-size state per layer. "  # 12 tokens
    text = target.tokenizer(sentence * (context // 10 + 10))["input_ids"]
    g = torch.Generator().manual_seed(context)
    base = make_verifier(target.model)
    assert base.row_invariant
    base.prefill(text[: context - 1])
    shapes = ((15,), (2, 2, 1, 1), (4, 2, 1), (2, 2, 2, 1)) if context <= 2000 else \
        ((15,), (2, 2, 2, 1))  # long contexts: the longest chain and the widest 16-node tree (single steps cost)
    for shape in map(TreeShape, shapes):
        parents = shape.parents  # up to 16 nodes, root included
        tokens = [text[context - 1], *torch.randint(0, target.vocab_size, (len(parents) - 1,), generator=g).tolist()]
        tree = base.fork().extend(tokens, parents)  # [n, V]
        for node, expected in _stepwise(base, tokens, parents).items():
            assert torch.equal(tree[node], expected), (context, shape.name, node)


def test_blocks_longer_than_the_invariant_row_count_are_split(smollm2_exact):
    target = smollm2_exact.target
    base = make_verifier(target.model)
    base.prefill(list(range(1, 51)))  # rows from position 80 on are cut at 64, past the prefix: heads into the branch
    tokens = list(range(100, 100 + MAX_INVARIANT_ROWS + 5))  # one chain, longer than MAX_INVARIANT_ROWS
    parents = list(range(-1, len(tokens) - 1))
    block = base.fork().extend(tokens, parents)
    steps = _stepwise(base, tokens, parents)
    assert all(torch.equal(block[i], steps[i]) for i in range(len(tokens)))


def test_the_direct_pass_has_the_bits_of_the_models_own_forward(smollm2_exact):
    """The verifier runs SmolLM2's layers itself, its projections fused where that keeps their bits; a prefill, a
    tree, a chain and a decode step give the bits of the model's own `forward` (which runs each layer unfused)."""
    target = smollm2_exact.target
    direct, through = make_verifier(target.model), make_verifier(target.model)
    through.direct = False
    assert direct.direct
    prompt, tokens, parents = list(range(1000, 1100)), [5, 6, 7, 8, 9, 10, 11], TreeShape((2, 2, 1)).parents[:7]
    expected = passes(through, prompt, tokens, parents)  # 100 tokens of prompt: the split layout has a head
    assert all(torch.equal(a, b) for a, b in zip(passes(direct, prompt, tokens, parents), expected, strict=True))


@pytest.mark.parametrize("smollm2_exact", DTYPES[1:], ids=["bfloat16"], indirect=True)
@pytest.mark.parametrize("prompt", ["Write a Python function that reverses a list.",
                                    "Summarise: the cat sat on the mat. The cat sat on the mat because it was warm."])
def test_every_method_prints_the_tokens_of_ar(smollm2_exact, prompt):
    """In bfloat16; in float32, the shared target's precision, `tests/test_smollm2.py` checks every method against
    `ar` and transformers' greedy decoding."""
    def tokens(**kwargs) -> list[int]:
        *_, summary = generate(smollm2_exact, prompt, GenerationConfig(max_new_tokens=48, **kwargs))
        return summary

    ar = tokens(method="ar")
    cases = [dict(method="mamba-chain"), dict(method="mamba-tree", tree="3,2,2,1"), dict(method="mamba-ucb"),
             dict(method="mamba-ucb", lookup_branch=LOOKUP_BRANCH), dict(method="tf-tree", tree="2,2,1"),
             dict(method="tf-tree", lookup_branch=LOOKUP_BRANCH), dict(method="lookup-chain"),
             dict(method="mamba-feat-tree", tree="3,2,1")]
    accepted = 0
    for case in cases:
        summary = tokens(**case)
        assert summary.token_ids == ar.token_ids, case
        accepted += summary.accepted_tokens
    assert accepted > 0  # drafts were really verified and kept, not only the target's own tokens


def test_row_and_block_layouts_agree_on_a_tiny_model():
    """float32 tiny Llama: the row-invariant and the masked block layout give the same logits and the same cache."""
    model = tiny_llama(11, seed=9)
    shape = TreeShape((3, 2, 1))
    tokens = [(3 * i + 1) % 11 for i in range(len(shape.parents))]
    rows, block = TreeLM(model, row_invariant=True), TreeLM(model, row_invariant=False)
    for lm in (rows, block):
        lm.prefill([1, 2, 3, 4])
    torch.testing.assert_close(rows.extend(tokens, shape.parents), block.extend(tokens, shape.parents),
                               atol=1e-5, rtol=1e-5)
    path = _branch(shape.parents, len(shape.parents) - 1)  # the last leaf's branch: not a prefix of the region
    rows.commit(path)
    block.commit(path)
    torch.testing.assert_close(rows.feed([7]), block.feed([7]), atol=1e-5, rtol=1e-5)


def test_commit_copies_only_the_accepted_entries():
    """A commit's copy grows with the accepted tokens, not with the context (#12: no O(context) work per round)."""
    model = tiny_llama(11, seed=9)
    lm = TreeLM(model)
    lm.prefill(list(range(1, 11)) * 50)  # 500 tokens
    copied: list[int] = []
    write = lm.cache.write
    lm.cache.write = lambda layer, at, index: (copied.append(len(index) if isinstance(index, list)
                                                              else index.stop - index.start), write(layer, at, index))
    lm.extend([3, 4, 5, 6], [-1, 0, 0, 2])
    copied.clear()
    lm.commit([0, 2, 3])
    assert copied == [2] * model.config.num_hidden_layers  # the root was in place already: entries 2 and 3
