"""A prompt-lookup branch grafted onto a neural drafter's tree: layout, drafter catch-up, and exactness."""

import pytest
import torch

from specdec.config import GenerationConfig
from specdec.drafters import LookupBranch, MambaDrafter, Sampler, TransformerDrafter
from specdec.drafters.base import DraftTree
from specdec.drafters.lookup import graft
from specdec.tree import TreeShape
from tests.test_engine import run
from tests.tiny import tiny_llama, tiny_mamba

V = 13


def _tree() -> DraftTree:
    #      0 (root, token 9)
    #    1(4)   2(5)          depth 1
    #    3(6)   4(7)          depth 2
    q = torch.full((5, V), 1 / V)
    return DraftTree(TreeShape((2, 1)), [9, 4, 5, 6, 7], [-1, 0, 0, 1, 2], [1.0, .5, .3, .4, .2], q)


def test_graft_merges_into_the_tree_under_greedy():
    grafted = graft(_tree(), [4, 6, 8, 2], merge=True)  # follows nodes 1 and 3, then branches off
    assert grafted.tokens == [9, 4, 5, 6, 7, 8, 2] and grafted.parents == [-1, 0, 0, 1, 2, 3, 5]
    assert grafted.point == [False] * 5 + [True, True] and grafted.q_tok[5:] == [1.0, 1.0]
    assert grafted.q.shape == (7, V) and grafted.q[5:].sum() == 0
    assert graft(_tree(), [5, 7], merge=True).tokens == _tree().tokens  # wholly inside the tree: nothing added


def test_graft_hangs_its_own_branch_from_the_root_when_sampling():
    grafted = graft(_tree(), [4, 6, 8], merge=False)  # repeats node 1's token, still a separate branch
    assert grafted.tokens == [9, 4, 5, 6, 7, 4, 6, 8] and grafted.parents == [-1, 0, 0, 1, 2, 0, 5, 6]
    assert grafted.point == [False] * 5 + [True] * 3


@pytest.mark.parametrize("kind", ["mamba", "transformer"])
def test_copied_tokens_on_the_path_are_caught_up_by_the_drafter(kind):
    """After a path that leaves the drafted tree through copied tokens, the drafter's next root is right."""
    model = tiny_mamba(V, seed=5) if kind == "mamba" else tiny_llama(V, seed=5)
    make = MambaDrafter if kind == "mamba" else TransformerDrafter
    context = [3, 1, 2, 3, 1, 2, 3]  # the last 3-gram "1 2 3" occurred before, followed by "1 2 3"
    branch, plain = LookupBranch(make(model, V), length=3), make(model, V)
    shape = TreeShape((2, 1))
    branch.start(context, shape.num_drafted)
    tree = branch.draft(shape, Sampler(0.0, 1.0, None))
    copied = [i for i, is_copy in enumerate(tree.point) if is_copy]
    assert copied, "the context repeats, so a branch must be grafted"
    path, leaf = [0], copied[-1]
    while leaf > 0:  # the path from the root down to the deepest copied node
        path.insert(1, leaf)
        leaf = tree.parents[leaf]
    branch.commit(path, next_token=11)
    accepted = [tree.tokens[i] for i in path[1:]]
    plain.start(context + accepted + [11], shape.num_drafted)
    ref = plain.draft(shape, Sampler(0.0, 1.0, None))
    again = branch.draft(shape, Sampler(0.0, 1.0, None))
    assert again.tokens[: len(ref.tokens)] == ref.tokens  # the same drafted tree as from scratch
    assert branch.context == context + accepted + [11]


# The bandit's arms all draft: which one it picks follows the machine's timings, and an arm "0" round grafts nothing
LOOKUP_CASES = [("mamba-tree", dict(tree="2,1")), ("mamba-chain", dict(tree="3")),
                ("mamba-ucb", dict(arms="3; 2,1,1")), ("tf-tree", dict(tree="2,2"))]


@pytest.mark.parametrize("method, settings", LOOKUP_CASES)
def test_greedy_with_a_lookup_branch_is_identical_to_target_alone(tiny_models, method, settings):
    _, ar = run(tiny_models, method="ar", max_new_tokens=40)
    rounds, sd = run(tiny_models, method=method, lookup_branch=4, max_new_tokens=40, **settings)
    assert sd.token_ids == ar.token_ids
    copied = [n for r in rounds for n in r.nodes if n.copied]
    assert any(n.status == "accepted" for n in copied)  # the branch really was used


def test_lookup_branch_is_validated():
    with pytest.raises(ValueError, match="lookup_branch"):
        GenerationConfig(lookup_branch=99).validate()
    assert not GenerationConfig(method="ar", lookup_branch=4).grafts_lookup
    assert GenerationConfig(method="tf-chain", lookup_branch=4).grafts_lookup


@pytest.mark.parametrize("accept_copies", [False, True])
def test_branch_backs_off_while_its_copies_are_rejected(accept_copies):
    branch = LookupBranch(MambaDrafter(tiny_mamba(V, seed=8), V), length=3, probe_every=8)
    context = [1, 2] * 4  # every round ends in a repeated 2-gram, so a copy is always found
    branch.start(context, 1)
    grafted = []
    for _ in range(14):
        tree = branch.draft(TreeShape((1,)), Sampler(0.0, 1.0, None))
        grafted.append(branch.grafted)
        path = [0]
        if accept_copies and branch.grafted:  # the target agrees with the whole copied branch
            node = len(tree.tokens) - 1
            while node > 0:
                path.insert(1, node)
                node = tree.parents[node]
        branch.commit(path, next_token=1 if branch.context[-1] == 2 else 2)
    if accept_copies:
        assert all(grafted)
    else:  # the yield decays below 0.25 after four grafts; then one probe every 8th round
        assert grafted == [True] * 4 + [False] * 7 + [True] + [False] * 2
