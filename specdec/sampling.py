"""Sampling and tree acceptance as pure tensor functions, in the paper's notation.

Glossary:
    V       vocabulary size (logits width of the target)
    n       number of tree nodes, root included (node 0 is the last emitted token)
    p       target distribution at a node, [n, V]: p[i] is the target's next-token distribution after node i
    q       drafter distribution at a node, [n, V]: q[i] is what node i's children were drawn from
    x       a drafted token; the drafted children of one node are draws from q[parent] without replacement
            (`sample_distinct`): child j from q_j, q with the earlier children's tokens removed and renormalised.
            Children marked `point` (a token copied from the context) are proposed with a point mass at x
    u       uniform random numbers for the accept tests

Multi-draft acceptance (docs/method.md, "3. Accept"): at an accepted node with children x_1..x_k, try them in order;
accept x_j with probability min(1, p(x_j) / q_j(x_j)), q_j the law x_j was drawn from; on rejection replace p by
the residual norm(max(0, p - q_j)) and try the next child. If none is accepted the *correction* token is drawn
from the residual; if a leaf is accepted the *bonus* token is drawn from p at the leaf. The emitted tokens are
then distributed exactly as the target's own samples. The argument holds with one proposal law per child, as
long as each child's law given the children before it is known: the residual left by rejecting x_j is the law
the rest must produce whatever x_j was (it is 0 at x_j, since x_j is rejected only where q_j(x_j) > p(x_j)), so
the next child may be drawn from q with x_j removed, which never repeats a token the residual has just ruled
out. A point-mass child x (q = δ_x, a copied token) is accepted with probability p(x), and its rejection leaves
p with x removed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper


def logits_to_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """Next-token distribution after temperature and nucleus filtering, as `generate()` would sample it.

    `temperature == 0` means greedy; the plain softmax is returned for reporting p and q.
    """
    scores = logits.float()  # [..., V]
    shape = scores.shape
    scores = scores.reshape(-1, shape[-1])
    if temperature > 0:
        scores = TemperatureLogitsWarper(temperature)(None, scores)
        if top_p < 1.0:
            scores = TopPLogitsWarper(top_p)(None, scores)
    return torch.softmax(scores, dim=-1).reshape(shape)


def _invert(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The tokens at fractions `u` [R, k] in [0, 1) of each row's cumulative weights [R, V] (a wide float dtype)
    -> [R, k]: the first token whose cumulative weight exceeds u times the row's total. A u that rounds up to the
    total gets the last token of positive weight (the first to reach the total)."""
    cdf = weights.cumsum(-1)  # [R, V]
    total = cdf[:, -1:].contiguous()  # [R, 1]
    draws = torch.searchsorted(cdf, u * total, right=True)
    return torch.minimum(draws, torch.searchsorted(cdf, total))


def _wide(flat: torch.Tensor) -> torch.dtype:
    return torch.float32 if flat.device.type == "mps" else torch.float64


def sample(probs: torch.Tensor, num_samples: int, generator: torch.Generator | None) -> torch.Tensor:
    """i.i.d. draws (with replacement) from each row of `probs` (weights, not necessarily summing to 1):
    [..., V] -> [..., num_samples].

    Each draw inverts the row's cumulative distribution at a uniform number: one cumulative sum and a binary
    search a row. `torch.multinomial` draws a single sample by an exponential race instead, which costs V random
    numbers a draw (docs/benchmarks.md, "Sampling"). The sums are in float64, so each token's share of the sum
    is its weight up to float64 rounding (float32 on Apple's MPS, which has no float64).
    """
    flat = probs.reshape(-1, probs.shape[-1])
    weights = flat.to(_wide(flat))
    if not bool((weights.sum(-1) > 0).all()):
        raise ValueError("cannot sample from a row without positive weight")
    u = torch.rand(len(flat), num_samples, generator=generator, device=flat.device, dtype=weights.dtype)
    return _invert(weights, u).reshape(*probs.shape[:-1], num_samples)


def sample_distinct(probs: torch.Tensor, num_samples: int, generator: torch.Generator | None) -> torch.Tensor:
    """Draws without replacement from each row of `probs` (weights): [..., V] -> [..., num_samples] token ids,
    draw j from the row's weights with draws 0..j-1 removed; -1 where a row has fewer tokens of positive weight
    than draws.

    Each draw is `sample`'s, over the weights left: after a token that held nearly all the weight is drawn, what
    is left may be far below the first sum's rounding, so each draw sums afresh (a node has few children).
    """
    flat = probs.reshape(-1, probs.shape[-1])
    weights = flat.to(_wide(flat), copy=True)  # [R, V], drawn tokens zeroed as they are drawn
    if not bool((weights.sum(-1) > 0).all()):
        raise ValueError("cannot sample from a row without positive weight")
    rows = torch.arange(len(flat), device=flat.device)
    draws = torch.full((len(flat), num_samples), -1, dtype=torch.long, device=flat.device)
    for j in range(num_samples):
        left = weights.sum(-1) > 0  # [R] rows with a token of positive weight left
        u = torch.rand(len(flat), 1, generator=generator, device=flat.device, dtype=weights.dtype)
        x = _invert(weights, u)[:, 0]
        draws[:, j] = torch.where(left, x, -1)
        weights[rows[left], x[left]] = 0.0
    return draws.reshape(*probs.shape[:-1], num_samples)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): what is left of p after a rejected draft from q."""
    r = (p - q).clamp_min(0.0)
    total = r.sum(-1, keepdim=True)
    # total == 0 only when p == q, where a rejection has probability 0; keep p then.
    return torch.where(total > 0, r / total.clamp_min(1e-30), p)


@dataclass
class Acceptance:
    """Result of walking one draft tree."""

    path: list[int]  # accepted nodes from the root down, root (0) included
    next_token: int  # the target's token after the last accepted node
    is_bonus: bool  # True if the last accepted node is a leaf (bonus), False for a correction
    rejected: list[int]  # nodes the target tested and rejected
    tested_depths: int  # tree depths at which a drafted token was tested (for the acceptance rate)


def children_of(parents: list[int]) -> list[list[int]]:
    children: list[list[int]] = [[] for _ in parents]
    for node, parent in enumerate(parents):
        if parent >= 0:
            children[parent].append(node)
    return children


def accept_greedy(tokens: list[int], parents: list[int], p_argmax: list[int]) -> Acceptance:
    """Greedy: follow the child whose token equals the target's argmax; the argmax after the path is emitted."""
    children = children_of(parents)
    path, rejected, tested = [0], [], 0
    while children[path[-1]]:
        kids = children[path[-1]]
        tested += 1
        match = next((c for c in kids if tokens[c] == p_argmax[path[-1]]), None)
        rejected.extend(c for c in kids if c != match)
        if match is None:
            return Acceptance(path, p_argmax[path[-1]], False, rejected, tested)
        path.append(match)
    return Acceptance(path, p_argmax[path[-1]], True, rejected, tested)


def accept_node(p: torch.Tensor, q: torch.Tensor | None, xs: list[int], u: torch.Tensor,
                point: list[bool] | None = None) -> tuple[int | None, torch.Tensor]:
    """Multi-draft rejection sampling at one node.

    p: [V] target distribution, q: [V] drafter distribution (None when every child is a point mass), xs: the
    children's tokens (drawn from q without replacement, `sample_distinct`, except those with `point[j]`,
    proposed with a point mass), u: [len(xs)] uniforms. Returns (index into xs of the accepted child or None,
    distribution for the correction token, i.e. the final residual).
    """
    drawn: list[int] = []  # the tokens of the children drawn from q so far
    for j, x in enumerate(xs):
        if point and point[j]:
            q_j = _point_mass(p, x)
        else:  # [V] the law child j was drawn from: q itself, then q less the earlier draws
            q_j = q if not drawn else _without(q, drawn)
            drawn.append(x)
        if u[j] * q_j[x] < p[x]:  # u < min(1, p(x)/q_j(x)), without dividing by q_j(x)
            return j, p
        p = residual(p, q_j)
    return None, p


def _without(q: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """q with `tokens` removed, renormalised."""
    left = q.clone()  # [V]
    left[tokens] = 0.0
    return left / left.sum()


def _point_mass(like: torch.Tensor, x: int) -> torch.Tensor:
    delta = torch.zeros_like(like)  # [V]
    delta[x] = 1.0
    return delta


def accept_sampling(tokens: list[int], parents: list[int], p: torch.Tensor, q: torch.Tensor | None,
                    generator: torch.Generator | None, point: list[bool] | None = None) -> Acceptance:
    """Sampling: walk the tree from the root with `accept_node`, a node's children in node order.

    p, q: [n, V]; `point[i]`: node i was proposed with a point mass (a copied token), not drawn from q[parent].
    """
    children = children_of(parents)
    path, rejected, tested = [0], [], 0
    while children[path[-1]]:
        node, kids = path[-1], children[path[-1]]
        tested += 1
        u = torch.rand(len(kids), generator=generator, device=p.device)
        kid_point = [point[c] for c in kids] if point else None
        j, p_res = accept_node(p[node], q[node] if q is not None else None, [tokens[c] for c in kids], u, kid_point)
        if j is None:
            rejected.extend(kids)
            correction = int(sample(p_res, 1, generator))
            return Acceptance(path, correction, False, rejected, tested)
        rejected.extend(kids[:j])
        path.append(kids[j])
    bonus = int(sample(p[path[-1]], 1, generator))
    return Acceptance(path, bonus, True, rejected, tested)


def first_child_chances(tokens: list[int], parents: list[int], path: list[int], p: torch.Tensor,
                        q: torch.Tensor | None, point: list[bool] | None = None) -> list[float]:
    """For each node of an accepted `path`, the chance that its first child would be kept, averaged over what the
    drafter could have drawn there: sum_x min(p(x), q(x)) (one minus the distance between the two laws); p(x)
    for a child proposed with a point mass; 0 for a node with no children. The acceptance test draws a coin
    with this chance; the bandit learns from the chance itself, which varies far less from round to round.
    p, q: [n, V] as `accept_sampling` reads them."""
    children = children_of(parents)
    chances = [0.0] * len(path)
    drawn, copied = [], []  # positions in `path` whose first child was drawn from q / copied (a point mass)
    for i, node in enumerate(path):
        if children[node]:
            (copied if point and point[children[node][0]] else drawn).append(i)
    if drawn:
        rows = torch.tensor([path[i] for i in drawn], device=p.device)
        overlap = torch.minimum(p[rows], q[rows.to(q.device)].to(p.device)).sum(-1)
        for i, chance in zip(drawn, overlap.tolist()):
            chances[i] = chance
    if copied:
        nodes = [path[i] for i in copied]
        for i, chance in zip(copied, p[nodes, [tokens[children[n][0]] for n in nodes]].tolist()):
            chances[i] = chance
    return chances
