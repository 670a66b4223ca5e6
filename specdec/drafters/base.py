"""The drafter interface and the draft tree it returns.

A drafter's life in one generation:
    start(context, max_nodes, features)
                                  consume the prompt; the last prompt token is the first round's root
    draft(shape, sampler)         propose a tree of shape T = (N1, ..., Nγ) below the root
    commit(path, next_token, unseen, features)
                                  the target accepted `path` (node indices, root first), then the tokens
                                  `unseen` (a branch another proposer grafted on, see `LookupBranch`), and
                                  emitted `next_token` (correction or bonus), which becomes the next root

Every drafter is handed the same observation; each takes what it needs. `features` are the target's last hidden
states: at `start`, those of the prompt's positions but the last ([len(context) - 1, D]); at `commit`, those of
the root, the accepted nodes and the unseen tokens, in order. Most drafters ignore them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.sampling import logits_to_probs, sample_distinct
from specdec.tree import TreeShape


@dataclass
class DraftTree:
    shape: TreeShape  # the shape actually drafted (prompt lookup may return a shorter chain)
    tokens: list[int]  # [n] node 0 is the root
    parents: list[int]  # [n] -1 for the root
    q_tok: list[float]  # [n] q of each node's token at its parent (1.0 for the root)
    q: torch.Tensor | None  # [n, V] drafter distribution at each node (sampling only; leaf rows unused)
    point: list[bool] | None = None  # [n] node proposed with a point mass (copied from the context), not from q
    sources: list[list[str] | None] | None = None  # [n] a drafter of another tokenizer: the text of its own tokens
    # (one piece per token) whose branch added the node


PREFILL_WINDOW = 512


@dataclass
class Sampler:
    """How drafted children are chosen: greedy takes the top-N distinct tokens, sampling draws N from q without
    replacement (`sample_distinct`).

    Two thresholds trim the tree by the drafter's confidence, both on a node's branch probability (the product
    of q along its branch, 1 at the root). `min_expand_q`: a node's children are drafted only if its branch
    probability is at least this (and at least `min_branch_q`), since each level drafted costs a drafter step.
    `min_branch_q`: under greedy decoding a child below it is dropped, since each node costs a verification row
    (any tree is exact under greedy decoding; under sampling a draw may not be dropped for its own value, since
    that would change what the verified children are distributed as). Both 0 keep every node of the shape.
    """

    temperature: float
    top_p: float
    generator: torch.Generator | None
    min_branch_q: float = 0.0
    min_expand_q: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def children(self, logits: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """logits: [m, V] at m nodes -> (children tokens [m, width], q [m, V]). Sampling draws a node's children
        from q without replacement (-1 where q has fewer tokens than `width`; no child is made for it)."""
        q = logits_to_probs(logits, self.temperature, self.top_p)  # [m, V]
        if self.greedy:  # a chain's one child by `max`, much cheaper than `topk` over a large vocabulary
            return logits.max(-1, keepdim=True).indices if width == 1 else logits.topk(width, dim=-1).indices, q
        return sample_distinct(q, width, self.generator), q  # [m, width]


class TreeBuilder:
    """Accumulates nodes level by level while a drafter expands a tree, trimmed as the `Sampler`'s thresholds say."""

    def __init__(self, root: int, sampler: Sampler) -> None:
        self.tokens, self.parents, self.q_tok = [root], [-1], [1.0]
        self.branch_q = [1.0]  # [n] the product of q along each node's branch
        self.q_rows: dict[int, torch.Tensor] = {}
        self.keep_q = not sampler.greedy
        self.drop_weak = sampler.greedy  # greedy: a child below the threshold is not added
        self.min_branch_q = sampler.min_branch_q
        self.min_expand_q = max(sampler.min_branch_q, sampler.min_expand_q)

    def add_level(self, frontier: list[int], kids: torch.Tensor, q: torch.Tensor, last: bool = False) -> list[int]:
        """frontier: m parent nodes; kids: [m, width] tokens; q: [m, V]. Returns the next frontier: the new nodes
        whose children are worth drafting (branch probability at least `min_expand_q`), none on the `last` level."""
        q_kid = q.gather(-1, kids.clamp_min(0))  # [m, width]
        new_nodes = []
        for row, parent in enumerate(frontier):
            if self.keep_q:
                self.q_rows[parent] = q[row]
            for token, q_value in zip(kids[row].tolist(), q_kid[row].tolist()):
                if token < 0:  # no token of q was left to draw
                    continue
                branch_q = self.branch_q[parent] * q_value
                if self.drop_weak and branch_q < self.min_branch_q:
                    continue
                new_nodes.append(len(self.tokens))
                self.tokens.append(token)
                self.parents.append(parent)
                self.q_tok.append(q_value)
                self.branch_q.append(branch_q)
        return [] if last else [node for node in new_nodes if self.branch_q[node] >= self.min_expand_q]

    def build(self, shape: TreeShape, vocab_size: int) -> DraftTree:
        q = None
        if self.keep_q and self.q_rows:  # rows of leaves stay zero: nothing was drawn from them
            some_row = next(iter(self.q_rows.values()))
            q = some_row.new_zeros(len(self.tokens), vocab_size)  # [n, V] on the drafter's device
            nodes = list(self.q_rows)
            q[nodes] = torch.stack([self.q_rows[node] for node in nodes]).to(q.dtype)
        return DraftTree(shape, self.tokens, self.parents, self.q_tok, q)


class Drafter(ABC):
    """Proposes a tree each round (see the module docstring for the life of one generation)."""

    name: str = "drafter"
    reads_target: bool = False  # whether it uses the target's hidden states (shown in the app)
    max_context: int | None = None  # the longest context it can take, when it has a limit
    # The prompt tokens (the last ones) a plug-in drafter reads when a generation starts, so that a longer prompt
    # costs the drafter no more; its guesses lose nothing by it (docs/benchmarks.md, "The drafter's start on a long
    # prompt"), and what a drafter drafts never changes what is emitted.
    prefill_window: int = PREFILL_WINDOW

    @classmethod
    def build(cls, loaded, target, cuda_graphs: bool | None = None) -> Drafter:
        """A fresh drafter for one generation: `loaded` is its kind's `LoadedModel` (None for a kind without a
        model), `target` the target's; `cuda_graphs` False asks a drafter that replays CUDA graphs to step
        eagerly (None: its default). A kind with a model also provides `load(spec, device, dtype, target)`."""
        return cls()

    @abstractmethod
    def start(self, context: list[int], max_nodes: int, features: torch.Tensor | None = None) -> None: ...

    @abstractmethod
    def draft(self, shape: TreeShape, sampler: Sampler) -> DraftTree: ...

    @abstractmethod
    def commit(self, path: list[int], next_token: int, unseen: Sequence[int] = (),
               features: torch.Tensor | None = None) -> None: ...

    def state_bytes(self) -> int:
        return 0

    def for_decoding(self, greedy: bool) -> Drafter:
        """The drafter to use under greedy decoding or under sampling (itself, unless the two need different
        schemes, as a drafter with another tokenizer does)."""
        return self

    def mapping_ms(self) -> float | None:
        """The time the last round spent mapping tokens between tokenizers (None for a drafter that shares the
        target's)."""
        return None


class NoDrafter(Drafter):
    """Target-only decoding: every round is a tree with just the root."""

    name = "none"

    def start(self, context: list[int], max_nodes: int, features: torch.Tensor | None = None) -> None:
        self.root = context[-1]

    def draft(self, shape: TreeShape, sampler: Sampler) -> DraftTree:
        return DraftTree(TreeShape(()), [self.root], [-1], [1.0], None)

    def commit(self, path: list[int], next_token: int, unseen: Sequence[int] = (),
               features: torch.Tensor | None = None) -> None:
        self.root = next_token
