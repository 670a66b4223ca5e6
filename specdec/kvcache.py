"""A causal LM with a KV cache that can hold a speculative tree (used by the target and the Transformer drafter).

The cache is a committed prefix of `length` tokens followed by a *speculative region*: tokens fed since the
last `commit`, each attached to a parent inside the region (or to the prefix, parent -1). A forward over new
tokens uses a tree attention mask (each token sees the prefix, its ancestors and itself) and per-token
position ids `length + depth`. `commit(keep)` keeps the listed region entries, which must form a chain
from the prefix, and drops the rest.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from specdec.tree import ancestor_matrix
from specdec.vocab import scatter_head


def tree_attention_mask(prefix_len: int, anc: torch.Tensor, rows: slice, dtype: torch.dtype,
                        device: torch.device) -> torch.Tensor:
    """Additive mask [1, 1, n_rows, prefix_len + S] for the region rows `rows` (anc: [S, S] ancestors)."""
    allowed = torch.cat([torch.ones(anc[rows].shape[0], prefix_len, dtype=torch.bool), anc[rows]], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)  # [1, 1, n_rows, prefix_len + S]


# Measured on this project's 2-core CPU (fp32, MKL, AVX-512): one SmolLM2-135M pass over n new tokens after 400
# cached ones costs, in decode steps (n=1 is 56 ms): n=2 1.62, 3 1.97, 4 1.43, 5 1.33, 6 1.42, 7 1.71, 8 1.38,
# 9 1.51, 10 1.64, 11 1.77, 12 1.51, 13 1.61, 14 1.64, 15 1.73, 16 1.68. PyTorch's CPU matmuls take some row
# counts much faster than smaller ones, so a verifier on a CPU pads such blocks with throw-away tokens.
CPU_BLOCK_PADDING = {2: 5, 3: 5, 4: 5, 7: 8, 10: 12, 11: 12, 15: 16}


class TreeLM:
    """Wraps a Hugging Face causal LM; one sequence (batch 1) per instance."""

    def __init__(self, model: PreTrainedModel, head_ids: torch.Tensor | None = None,
                 pad_blocks: dict[int, int] | None = None) -> None:
        """`head_ids`: score only these token ids (a reduced draft head); the returned logits are -inf elsewhere.

        `pad_blocks` {n: m}: a block of n tokens that opens the speculative region is run as m tokens, the extra
        ones attached to the prefix and dropped at `commit` (see `CPU_BLOCK_PADDING`).
        """
        config = model.config
        layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
        if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True) or \
                layer_types != {"full_attention"}:
            raise ValueError(f"{config.model_type} uses sliding-window or non-attention layers; tree verification "
                             "here needs full attention in every layer")
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.head_ids = head_ids.to(self.device) if head_ids is not None else None
        self.pad_blocks = pad_blocks or {}
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        if self.head_ids is not None:
            self.head_weight = model.get_output_embeddings().weight[self.head_ids]  # [H, d]
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.length = 0  # committed tokens in the cache
        self.parents: list[int] = []  # speculative region: parent of each entry (-1 = the prefix)
        self.depths: list[int] = []  # 0 for entries attached to the prefix
        self.padding = 0  # throw-away entries at the end of the region

    @torch.inference_mode()
    def extend(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
        """Feed `tokens` into the speculative region; `parents` index the region (-1 = prefix). -> logits [n, V]."""
        if self.padding:
            raise ValueError("a padded block must be committed before more tokens are fed")
        start, n = len(self.parents), len(tokens)
        if start == 0 and n in self.pad_blocks:
            self.padding = self.pad_blocks[n] - n
            tokens, parents = [*tokens, *[tokens[0]] * self.padding], [*parents, *[-1] * self.padding]
        for i, parent in enumerate(parents):
            if parent >= start + i:
                raise ValueError("a token's parent must come before it")
            self.parents.append(parent)
            self.depths.append(0 if parent < 0 else self.depths[parent] + 1)
        ids = torch.tensor([tokens], device=self.device)  # [1, n]
        positions = torch.tensor([[self.length + d for d in self.depths[start:]]], device=self.device)  # [1, n]
        is_chain_from_prefix = start == 0 and all(p == i - 1 for i, p in enumerate(parents))
        mask = None
        if not is_chain_from_prefix:  # a causal chain needs no custom mask
            anc = ancestor_matrix(self.parents)  # [S, S]
            mask = tree_attention_mask(self.length, anc, slice(start, None), self.dtype, self.device)
        inputs = dict(input_ids=ids, position_ids=positions, attention_mask=mask, cache=self.cache, use_cache=True)
        if self.head_ids is None:
            return self.model(**inputs).logits[0, :n]  # [n, V]
        h = self.model.base_model(**inputs).last_hidden_state[0, :n]  # [n, d]
        scores = (h @ self.head_weight.T).float()  # [n, H]
        return scatter_head(scores, self.head_ids, self.vocab_size)  # [n, V_model]

    def commit(self, keep: list[int]) -> None:
        """Keep region entries `keep` (a chain from the prefix, in order) and drop the rest of the region."""
        for i, node in enumerate(keep):
            expected_parent = keep[i - 1] if i else -1
            if self.parents[node] != expected_parent:
                raise ValueError(f"entries {keep} do not form a chain from the prefix")
        region = len(self.parents)
        if any(k >= region - self.padding for k in keep):
            raise ValueError("padding entries cannot be kept")
        if keep == list(range(len(keep))):  # a prefix of the region: cut the tail
            if len(keep) != region:
                end = self.length + len(keep)
                for layer in self.cache.layers:
                    layer.keys, layer.values = layer.keys[..., :end, :], layer.values[..., :end, :]
        else:
            index = torch.tensor(list(range(self.length)) + [self.length + k for k in keep], device=self.device)
            for layer in self.cache.layers:
                layer.keys = layer.keys.index_select(-2, index)
                layer.values = layer.values.index_select(-2, index)
        self.length += len(keep)
        self.parents, self.depths, self.padding = [], [], 0

    def feed(self, tokens: list[int]) -> torch.Tensor:
        """Append a plain chain of tokens to the committed prefix. -> logits [n, V]."""
        logits = self.extend(tokens, list(range(-1, len(tokens) - 1)))
        self.commit(list(range(len(tokens))))
        return logits

    @property
    def kv_bytes(self) -> int:
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self.cache.layers
                   if getattr(layer, "keys", None) is not None)
