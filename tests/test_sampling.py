import pytest
import torch
from scipy.stats import chisquare

from specdec.sampling import (accept_greedy, accept_node, accept_sampling, first_child_chances, logits_to_probs,
                              residual, sample, sample_distinct)


def test_residual_is_normalised_positive_part():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.6, 0.2])
    assert torch.allclose(residual(p, q), torch.tensor([1.0, 0.0, 0.0]))
    assert torch.allclose(residual(p, p), p)  # no mass left: keep p


def test_top_p_and_temperature():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    probs = logits_to_probs(logits, 1.0, top_p=0.7)
    assert probs[2] == 0 and probs[3] == 0 and torch.isclose(probs.sum(), torch.tensor(1.0))
    assert torch.allclose(logits_to_probs(logits, 0.0), torch.softmax(logits, -1))


def emitted_counts(p, q, children, n: int, g, point=None) -> torch.Tensor:
    """How often each token is emitted at one node over n trials; `children(i)` gives trial i's drafted tokens."""
    counts = torch.zeros(len(p))
    for i in range(n):
        xs = children(i)
        j, p_res = accept_node(p, q, xs, torch.rand(len(xs), generator=g), point)
        counts[xs[j] if j is not None else int(torch.multinomial(p_res, 1, generator=g))] += 1
    return counts


def test_multi_draft_node_is_exact():
    """k drafts from q without replacement, accepted as in docs/method.md ("3. Accept"): the emitted token is
    distributed as p."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.05, 0.25, 0.2])
    q = torch.tensor([0.1, 0.6, 0.1, 0.2])
    n = 20000
    drafts = sample_distinct(q.expand(n, -1), 3, g).tolist()  # [n, 3], each row drawn without replacement
    counts = emitted_counts(p, q, lambda i: drafts[i], n, g)
    assert chisquare(counts.numpy(), (p * n).numpy()).pvalue > 1e-3
    # the same test does detect the drafter's own distribution
    assert chisquare(counts.numpy(), (q * n).numpy()).pvalue < 1e-6


def test_the_node_check_rejects_distinct_drafts_tested_as_if_independent():
    """Negative control: drafts without replacement, each tested against the whole q (the law of independent
    draws, not the one they came from), emit a detectably wrong law."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.05, 0.25, 0.2])
    q = torch.tensor([0.1, 0.6, 0.1, 0.2])
    n = 20000

    def as_if_independent(p, q, xs, u, point=None):
        for j, x in enumerate(xs):
            if u[j] * q[x] < p[x]:
                return j, p
            p = residual(p, q)
        return None, p

    counts = torch.zeros(4)
    for xs in sample_distinct(q.expand(n, -1), 3, g).tolist():
        j, p_res = as_if_independent(p, q, xs, torch.rand(3, generator=g))
        counts[xs[j] if j is not None else int(torch.multinomial(p_res, 1, generator=g))] += 1
    assert chisquare(counts.numpy(), (p * n).numpy()).pvalue < 1e-6


def test_sample_distinct_draws_in_turn_from_the_weights_left():
    """Each draw's law is the row's weights less the earlier draws, renormalised (chi-square on the ordered
    pairs); a row with fewer positive tokens than draws gets -1 for the rest; tokens of zero weight never come."""
    g = torch.Generator().manual_seed(0)
    w = torch.tensor([[0.0, 3.0, 1.0, 0.0, 2.0, 4.0], [5.0, 0.0, 0.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    n = 20000
    draws = sample_distinct(w.expand(n, 2, 6), 2, g)  # [n, 2, 2]
    first, second = draws[:, 0, 0], draws[:, 0, 1]
    assert bool((first != second).all()) and set(draws[:, 0].flatten().tolist()) <= {1, 2, 4, 5}
    pairs = [(a, b) for a in (1, 2, 4, 5) for b in (1, 2, 4, 5) if a != b]
    law = torch.tensor([w[0, a] / w[0].sum() * w[0, b] / (w[0].sum() - w[0, a]) for a, b in pairs])
    seen = torch.tensor([float(((first == a) & (second == b)).sum()) for a, b in pairs])
    assert chisquare(seen.numpy(), (law * n).numpy()).pvalue > 1e-3
    # the control: the law of independent draws (repeats removed) is detectably different
    wrong = torch.tensor([w[0, a] * w[0, b] for a, b in pairs])
    assert chisquare(seen.numpy(), (wrong / wrong.sum() * n).numpy()).pvalue < 1e-6
    two = sample_distinct(w[1], 3, g)
    assert sorted(two[:2].tolist()) == [0, 3] and int(two[2]) == -1
    with pytest.raises(ValueError, match="without positive weight"):
        sample_distinct(torch.zeros(2, 4), 2, g)


def test_a_sibling_after_a_near_certain_token_is_drawn_from_the_weights_left():
    """A drafter nearly sure of one token (the rest below float64 rounding of the whole sum): the next sibling is
    drawn from the others as they weigh, and a node of such draws still emits p."""
    g = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.tensor([0.0, 0, 0, 0, 4.5, 0, 0, 0]) / 0.1, -1)  # q(4) = 1 - 7e-20
    n = 20000
    draws = sample_distinct(q.expand(n, -1), 2, g)
    assert bool((draws[:, 0] == 4).all())
    second = torch.bincount(draws[:, 1], minlength=8)[[0, 1, 2, 3, 5, 6, 7]]
    assert chisquare(second.numpy(), [n / 7] * 7).pvalue > 1e-3
    p = torch.tensor([0.01, 0.08, 0.08, 0.08, 0.5, 0.08, 0.08, 0.09])
    counts = emitted_counts(p, q, lambda i: draws[i].tolist(), n, g)
    assert chisquare(counts.numpy(), (p * n).numpy()).pvalue > 1e-3


def test_sample_distinct_leaves_its_input_alone():
    w = torch.tensor([[0.2, 0.5, 0.3]], dtype=torch.float64)
    sample_distinct(w, 2, torch.Generator().manual_seed(0))
    assert w.tolist() == [[0.2, 0.5, 0.3]]


def test_sample_distinct_never_repeats_at_the_rounding_edge(monkeypatch):
    """A uniform that rounds up to the weight left lands on the last token not drawn yet, never on a drawn one."""
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.ones(a[0], dtype=k["dtype"]))
    w = torch.tensor([0.2, 0.0, 0.5, 0.3, 0.0])
    assert sample_distinct(w, 3, None).tolist() == [3, 2, 0]


def test_greedy_walk():
    #        0
    #      1   2        children of 0: tokens 5, 7; target argmax after 0 is 7 -> node 2
    #     3     4       child of 2: node 4 (token 9); argmax after 2 is 9 -> accepted leaf
    tokens, parents = [0, 5, 7, 1, 9], [-1, 0, 0, 1, 2]
    acc = accept_greedy(tokens, parents, p_argmax=[7, 0, 9, 0, 3])
    assert acc.path == [0, 2, 4] and acc.next_token == 3 and acc.is_bonus
    assert acc.rejected == [1] and acc.tested_depths == 2
    acc = accept_greedy(tokens, parents, p_argmax=[8, 0, 9, 0, 3])
    assert acc.path == [0] and acc.next_token == 8 and not acc.is_bonus and acc.rejected == [1, 2]


def test_sampling_walk_accepts_certain_tokens():
    # p puts all mass on the drafted tokens: everything is accepted and the bonus comes from p at the leaf
    V = 3
    tokens, parents = [0, 1, 2], [-1, 0, 1]
    p = torch.tensor([[0, 1.0, 0], [0, 0, 1.0], [1.0, 0, 0]])
    q = torch.full((3, V), 1 / V)
    acc = accept_sampling(tokens, parents, p, q, torch.Generator().manual_seed(0))
    assert acc.path == [0, 1, 2] and acc.next_token == 0 and acc.is_bonus


def test_point_mass_children_keep_the_node_exact():
    """Two drafts from q (without replacement), then a copied token (a point mass): the emitted token is still distributed as p."""
    g = torch.Generator().manual_seed(1)
    p = torch.tensor([0.1, 0.4, 0.3, 0.2])
    q = torch.tensor([0.7, 0.1, 0.1, 0.1])
    n = 20000

    def draws_and(k, copied):  # the copy is any token fixed before the draws, whatever its p
        drafts = sample_distinct(q.expand(n, -1), k, g).tolist()
        return lambda i: [*drafts[i], copied(i)]

    counts = emitted_counts(p, q, draws_and(2, lambda i: i % 4), n, g, point=[False, False, True])
    assert chisquare(counts.numpy(), (p * n).numpy()).pvalue > 1e-3
    # treating the copy as one more draw from q is detectably wrong
    wrong = emitted_counts(p, q, draws_and(1, lambda i: 1), n, g)
    assert chisquare(wrong.numpy(), (p * n).numpy()).pvalue < 1e-6


def test_first_child_chances_are_the_acceptance_of_a_first_child_drawn_from_q():
    """sum_x min(p(x), q(x)) at each node of the path: how often `accept_node` keeps a first child drawn from q
    there; p(x) for a copied first child; 0 where the node has no child."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, 6, generator=g), -1)  # [n, V]
    q = torch.softmax(torch.randn(4, 6, generator=g), -1)
    tokens, parents, path = [0, 2, 3, 1], [-1, 0, 0, 1], [0, 1, 3]  # root -> 1, 2; 1 -> 3 (a leaf)
    chances = first_child_chances(tokens, parents, path, p, q)
    for node, chance in zip(path[:2], chances):
        assert abs(chance - float(sum(q[node, x] * min(1.0, p[node, x] / q[node, x]) for x in range(6)))) < 1e-6
    assert chances[2] == 0.0
    draws = torch.multinomial(q[0], 4000, replacement=True, generator=g).tolist()
    kept = sum(accept_node(p[0], q[0], [x], torch.rand(1, generator=g))[0] == 0 for x in draws)
    assert abs(kept / 4000 - chances[0]) < 0.025  # about 3.3 standard errors
    copied = first_child_chances(tokens, parents, path, p, q, point=[False, True, False, False])
    assert copied[0] == float(p[0, 2]) and copied[1] == chances[1]


def test_sample_draws_each_row_from_its_weights():
    """Inverse-CDF draws: the right law per row (weights need not sum to 1), never a token of zero weight."""
    g = torch.Generator().manual_seed(3)
    weights = torch.tensor([[0.0, 2.0, 0.0, 1.0, 1.0, 0.0],  # zero weights first, between and last
                            [0.1, 0.0, 0.0, 0.0, 0.0, 0.9]])
    n = 20000
    draws = sample(weights, n, g)  # [2, n]
    for row, law in zip(draws, weights):
        counts = torch.bincount(row, minlength=len(law)).double()
        assert counts[law == 0].sum() == 0
        expected = law / law.sum() * n
        assert chisquare(counts[law > 0].numpy(), expected[law > 0].numpy()).pvalue > 1e-3
    # the same test does detect a slightly wrong law: the first row's draws against (0.45, 0.3, 0.25)
    first = torch.bincount(draws[0], minlength=6).double()[[1, 3, 4]]
    assert chisquare(first.numpy(), (torch.tensor([0.45, 0.3, 0.25]) * n).numpy()).pvalue < 1e-6
    assert sample(torch.rand(3, 4, 7), 2, g).shape == (3, 4, 2)


def test_sample_never_lands_past_the_last_token_of_positive_weight(monkeypatch):
    """A uniform number that rounds up to the row's total weight draws the last token of positive weight."""
    monkeypatch.setattr(torch, "rand", lambda *shape, **kw: torch.ones(*shape, dtype=kw.get("dtype")))
    assert sample(torch.tensor([[0.0, 0.3, 0.7, 0.0, 0.0]]), 4, None).tolist() == [[2, 2, 2, 2]]


def test_sample_refuses_a_row_without_weight():
    with pytest.raises(ValueError, match="without positive weight"):
        sample(torch.tensor([[0.5, 0.5], [0.0, 0.0]]), 1, None)
