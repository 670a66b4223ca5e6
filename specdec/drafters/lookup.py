"""Prompt lookup: draft by copying what followed the most recent earlier occurrence of the context's last n-gram.

Training-free and deterministic, so each copied token is a point-mass proposal: acceptance is then min(1, p(x)),
and a rejection leaves the residual p with x removed. One chain per round (siblings from a point mass would
all be equal, so trees bring nothing here).

`LookupBranch` grafts such a chain onto a neural drafter's tree, for text that repeats its context (summaries,
code edits), where a small drafter is weakest.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.drafters.base import Drafter, DraftTree, Sampler
from specdec.sampling import children_of
from specdec.tree import TreeShape


def find_continuation(context: list[int], max_ngram: int, length: int, min_ngram: int = 1) -> list[int]:
    """Tokens that followed the latest earlier match of the context's last n-gram (longest n first)."""
    for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        suffix = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start:start + n] == suffix:
                return context[start + n:start + n + length]
    return []


class LookupDrafter(Drafter):
    name = "lookup"

    def __init__(self, max_ngram: int = 3) -> None:
        self.max_ngram = max_ngram

    def start(self, context: list[int], max_nodes: int, features: torch.Tensor | None = None) -> None:
        self.context = list(context)

    def draft(self, shape: TreeShape, sampler: Sampler) -> DraftTree:
        drafted = find_continuation(self.context, self.max_ngram, shape.depth)
        self.drafted = drafted
        tokens = [self.context[-1], *drafted]
        n = len(tokens)
        return DraftTree(TreeShape.chain(len(drafted)), tokens, list(range(-1, n - 1)), [1.0] * n, None,
                         point=[False] + [True] * len(drafted))

    def commit(self, path: list[int], next_token: int, unseen: Sequence[int] = (),
               features: torch.Tensor | None = None) -> None:
        self.context.extend([*self.drafted[: len(path) - 1], *unseen, next_token])  # node k is drafted token k-1


def graft(tree: DraftTree, chain: list[int], merge: bool) -> DraftTree:
    """`tree` plus the copied `chain` as a branch from the root; the new nodes are point-mass proposals.

    merge (greedy): the chain follows the nodes whose tokens it repeats and branches off where they differ,
    so no token is verified twice. Without merge (sampling) it hangs from the root as a branch of its own: a
    drafted node was drawn from q and cannot also count as a copy; a duplicate sibling is still exact.
    """
    tokens, parents, q_tok = list(tree.tokens), list(tree.parents), list(tree.q_tok)
    node, start = 0, 0
    if merge:
        children = children_of(parents)
        while start < len(chain):
            match = next((c for c in children[node] if tokens[c] == chain[start]), None)
            if match is None:
                break
            node, start = match, start + 1
    for token in chain[start:]:
        tokens.append(token)
        parents.append(node)
        q_tok.append(1.0)
        node = len(tokens) - 1
    added = len(tokens) - len(tree.tokens)
    if not added:
        return tree
    q = None
    if tree.q is not None:  # copied nodes' rows stay zero: their children are point masses too
        q = torch.cat([tree.q, tree.q.new_zeros(added, tree.q.shape[1])])  # [n, V]
    point = [*(tree.point or [False] * len(tree.tokens)), *[True] * added]
    sources = [*tree.sources, *[None] * added] if tree.sources else None
    return DraftTree(tree.shape, tokens, parents, q_tok, q, point, sources)


class LookupBranch(Drafter):
    """A drafter's tree plus, when the context's last 2-gram (or 3-gram) occurred before, up to `length` copied
    tokens as a branch. A single repeated token is a weak hint, not worth verification rows on a CPU; the 2-gram
    gate and 6 tokens are the variants that `bench` measured fastest.

    The branch must also earn its rows in this generation: `yield_` is a moving average of the copied tokens
    accepted per grafted round; while it is below `min_yield`, only every `probe_every`-th match is grafted, to
    notice when copying starts to pay again. The choice depends on past rounds only, so it cannot bias the output.
    """

    def __init__(self, inner: Drafter, length: int, max_ngram: int = 3, min_ngram: int = 2,
                 min_yield: float = 0.25, probe_every: int = 8, smoothing: float = 0.3) -> None:
        self.inner, self.length, self.max_ngram, self.min_ngram = inner, length, max_ngram, min_ngram
        self.min_yield, self.probe_every, self.smoothing = min_yield, probe_every, smoothing
        self.name = f"{inner.name}+lookup"
        self.reads_target, self.max_context = inner.reads_target, inner.max_context

    def start(self, context: list[int], max_nodes: int, features: torch.Tensor | None = None) -> None:
        self.context = list(context)
        self.yield_, self.skipped = 1.0, 0  # optimistic: copy until copying is seen to fail
        self.inner.start(context, max_nodes, features)

    def _wanted(self) -> bool:
        if self.yield_ >= self.min_yield:
            return True
        self.skipped += 1
        if self.skipped < self.probe_every:
            return False
        self.skipped = 0
        return True

    def draft(self, shape: TreeShape, sampler: Sampler) -> DraftTree:
        drafted = self.inner.draft(shape, sampler)
        self.inner_nodes = len(drafted.tokens)
        chain = []
        if shape.depth:  # arm "0" (no drafting) stays a plain target step
            chain = find_continuation(self.context, self.max_ngram, self.length, self.min_ngram)
        self.tree = graft(drafted, chain, merge=sampler.greedy) if chain and self._wanted() else drafted
        return self.tree

    @property
    def grafted(self) -> bool:
        """Whether the last drafted tree has copied nodes."""
        return len(self.tree.tokens) > self.inner_nodes

    def commit(self, path: list[int], next_token: int, unseen: Sequence[int] = (),
               features: torch.Tensor | None = None) -> None:
        inner_path = [node for node in path if node < self.inner_nodes]  # grafted nodes come last on a path
        copied = [self.tree.tokens[node] for node in path[len(inner_path):]]
        if self.grafted:
            self.yield_ += self.smoothing * (len(copied) - self.yield_)
        self.inner.commit(inner_path, next_token, [*copied, *unseen], features)  # features: path order
        self.context.extend([*(self.tree.tokens[node] for node in path[1:]), *unseen, next_token])

    def state_bytes(self) -> int:
        return self.inner.state_bytes()

    def mapping_ms(self) -> float | None:
        return self.inner.mapping_ms()
