import torch
from scipy.stats import chisquare

from specdec.sampling import accept_greedy, accept_node, accept_sampling, logits_to_probs, residual


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


def test_multi_draft_node_is_exact():
    """k i.i.d. drafts from q, accept/residual per PAPER.md: the emitted token is distributed as p."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.05, 0.25, 0.2])
    q = torch.tensor([0.1, 0.6, 0.1, 0.2])
    counts = torch.zeros(4)
    n = 20000
    for _ in range(n):
        xs = torch.multinomial(q, 3, replacement=True, generator=g).tolist()
        j, p_res = accept_node(p, q, xs, torch.rand(3, generator=g))
        token = xs[j] if j is not None else int(torch.multinomial(p_res, 1, generator=g))
        counts[token] += 1
    assert chisquare(counts.numpy(), (p * n).numpy()).pvalue > 1e-3
    # the same test does detect the drafter's own distribution
    assert chisquare(counts.numpy(), (q * n).numpy()).pvalue < 1e-6


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
    """Two i.i.d. drafts from q, then a copied token (a point mass): the emitted token is still distributed as p."""
    g = torch.Generator().manual_seed(1)
    p = torch.tensor([0.1, 0.4, 0.3, 0.2])
    q = torch.tensor([0.7, 0.1, 0.1, 0.1])
    counts = torch.zeros(4)
    n = 20000
    for i in range(n):
        copied = i % 4  # any token fixed before the draws, whatever its p
        xs = [*torch.multinomial(q, 2, replacement=True, generator=g).tolist(), copied]
        j, p_res = accept_node(p, q, xs, torch.rand(3, generator=g), point=[False, False, True])
        token = xs[j] if j is not None else int(torch.multinomial(p_res, 1, generator=g))
        counts[token] += 1
    assert chisquare(counts.numpy(), (p * n).numpy()).pvalue > 1e-3
    # treating the copy as one more draw from q is detectably wrong
    wrong = torch.zeros(4)
    for i in range(n):
        xs = [*torch.multinomial(q, 2, replacement=True, generator=g).tolist(), 1]
        j, p_res = accept_node(p, q, xs, torch.rand(3, generator=g))
        wrong[xs[j] if j is not None else int(torch.multinomial(p_res, 1, generator=g))] += 1
    assert chisquare(wrong.numpy(), (p * n).numpy()).pvalue < 1e-6
