"""A small causal Transformer drafting the same tree shapes (the paper's external-drafter baseline).

Each depth of the tree is one forward over that depth's nodes with a tree attention mask on the drafter's own
KV cache. Leaves are not fed (their KV is only needed if they are accepted); after verification the cache
keeps the accepted nodes that were fed, and the rest (an accepted leaf, the target's token) is fed at the
start of the next round. Unlike a Mamba state, this cache grows with the context.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from specdec.drafters.base import Drafter, DraftTree, Sampler, TreeBuilder
from specdec.verify import TreeLM
from specdec.models import LoadedModel, load_drafter_model
from specdec.tree import TreeShape
from specdec.vocab import fit_vocab, load_draft_vocab


class TransformerDrafter(Drafter):
    name = "transformer"

    def __init__(self, model: PreTrainedModel, vocab_size: int, head_ids: torch.Tensor | None = None) -> None:
        self.lm = TreeLM(model, head_ids, row_invariant=False)  # q need not be row-invariant: one masked call
        self.vocab_size = vocab_size
        self.max_input_id = model.get_input_embeddings().num_embeddings - 1
        self.max_context = getattr(model.config, "max_position_embeddings", None)

    @classmethod
    def from_folder(cls, model: PreTrainedModel, vocab_size: int, folder: str | None) -> TransformerDrafter:
        """Use `draft_vocab.json` beside the weights, when present, as the draft head."""
        return cls(model, vocab_size, load_draft_vocab(folder))

    @staticmethod
    def load(spec: str, device: torch.device, dtype: torch.dtype, target: LoadedModel) -> LoadedModel:
        return load_drafter_model(spec, device, dtype, target)

    @classmethod
    def build(cls, loaded: LoadedModel, target: LoadedModel, cuda_graphs: bool | None = None) -> TransformerDrafter:
        return cls.from_folder(loaded.model, target.vocab_size, loaded.source)

    def _inputs(self, tokens: list[int]) -> list[int]:
        """A target token the drafter has no embedding for only makes drafting worse, never inexact."""
        return [min(t, self.max_input_id) for t in tokens]

    def start(self, context: list[int], max_nodes: int, features: torch.Tensor | None = None) -> None:
        """Read the prompt's last `prefill_window` tokens, from position 0."""
        self.lm.reset()
        context = context[-self.prefill_window:]
        if len(context) > 1:
            self.lm.prefill(self._inputs(context[:-1]))  # one causal pass, no tree mask
        self.pending = [context[-1]]  # tokens not yet in the drafter's cache; the last one is the root

    def draft(self, shape: TreeShape, sampler: Sampler) -> DraftTree:
        logits = fit_vocab(self.lm.feed(self._inputs(self.pending))[-1:], self.vocab_size)  # [1, V] at the root
        root, self.pending = self.pending[-1], []
        builder = TreeBuilder(root, sampler)
        self.region_index = {}  # tree node -> index in the drafter's speculative cache region
        frontier = [0]
        for depth, width in enumerate(shape.widths):
            kids, q = sampler.children(logits, width)  # [m, width], [m, V]
            frontier = builder.add_level(frontier, kids, q, last=depth == shape.depth - 1)
            if not frontier:
                break  # leaves are not fed
            parents = [self.region_index.get(builder.parents[node], -1) for node in frontier]
            for node in frontier:
                self.region_index[node] = len(self.region_index)
            logits = fit_vocab(self.lm.extend(self._inputs([builder.tokens[node] for node in frontier]), parents),
                               self.vocab_size)  # [len(frontier), V]
        self.tree_tokens = builder.tokens
        return builder.build(shape, self.vocab_size)

    def commit(self, path: list[int], next_token: int, unseen: Sequence[int] = (),
               features: torch.Tensor | None = None) -> None:
        fed = [node for node in path[1:] if node in self.region_index]
        self.lm.commit([self.region_index[node] for node in fed])
        unfed = [self.tree_tokens[node] for node in path[1 + len(fed):]]  # at most an accepted leaf
        self.pending = [*unfed, *unseen, next_token]

    def state_bytes(self) -> int:
        return self.lm.kv_bytes
