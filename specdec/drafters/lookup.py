"""Prompt lookup: draft by copying what followed the most recent earlier occurrence of the context's last n-gram.

Training-free and deterministic, so `q` is a point mass on the copied token: acceptance is then min(1, p(x)),
and a rejection leaves the residual p with x removed. One chain per round (siblings from a point mass would
all be equal, so trees bring nothing here).
"""

from __future__ import annotations

import torch

from specdec.drafters.base import Drafter, DraftTree, Sampler
from specdec.tree import TreeShape


def find_continuation(context: list[int], max_ngram: int, length: int) -> list[int]:
    """Tokens that followed the latest earlier match of the context's last n-gram (longest n first)."""
    for n in range(min(max_ngram, len(context) - 1), 0, -1):
        suffix = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start:start + n] == suffix:
                return context[start + n:start + n + length]
    return []


class LookupDrafter(Drafter):
    name = "lookup"

    def __init__(self, vocab_size: int, max_ngram: int = 3) -> None:
        self.vocab_size = vocab_size
        self.max_ngram = max_ngram

    def start(self, context: list[int], max_nodes: int) -> None:
        self.context = list(context)

    def draft(self, shape: TreeShape, sampler: Sampler) -> DraftTree:
        drafted = find_continuation(self.context, self.max_ngram, shape.depth)
        self.drafted = drafted
        tokens = [self.context[-1], *drafted]
        n = len(tokens)
        q = None
        if not sampler.greedy:
            q = torch.zeros(n, self.vocab_size)
            q[torch.arange(n - 1), torch.tensor(drafted, dtype=torch.long)] = 1.0  # point mass at each parent
        return DraftTree(TreeShape.chain(len(drafted)), tokens, list(range(-1, n - 1)), [1.0] * n, q)

    def commit(self, path: list[int], next_token: int) -> None:
        self.context.extend(self.drafted[: len(path) - 1] + [next_token])  # node k is drafted token k-1
