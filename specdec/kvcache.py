"""A causal LM with a KV cache that can hold a speculative tree (used by the target and the Transformer drafter).

The cache is a committed prefix of `length` tokens followed by a *speculative region*: tokens fed since the
last `commit`, each attached to a parent inside the region (or to the prefix, parent -1). A forward over new
tokens uses a tree attention mask (each token sees the prefix, its ancestors and itself) and per-token
position ids `length + depth`. `commit(keep)` keeps the listed region entries, which must form a chain
from the prefix, and drops the rest.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

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


SLOW_HEAD_ROWS = {2: 4, 3: 4}  # on a CPU: rows fed to the output layer -> rows it is given instead


@contextmanager
def padded_rows(layer: torch.nn.Module, pad_to: dict[int, int]) -> Iterator[None]:
    """While active, `layer` (the output layer) sees an [..., n, d] input padded with zero rows to `pad_to[n]` rows,
    and its output is cut back to n rows. Only calls from the thread that entered are touched, so other threads
    may use the same model meanwhile.

    Measured on this project's 2-core CPU (MKL sgemm, AVX-512, fp32), the [rows, 576] x [576, 49152] output layer
    took 9.6 ms for 1 row, 22 ms for 2, 35 ms for 3 and 17 ms for 4, so verifying a 2-3-token tree cost more
    than a 4-token one. Padding through the model's own module keeps any logit post-processing (scales,
    soft-capping) the model's.
    """
    if not pad_to:
        yield
        return
    owner, rows = threading.get_ident(), []

    def pad(module, args):
        if threading.get_ident() != owner:
            return None
        x = args[0]
        rows.append(x.shape[-2])
        if rows[-1] not in pad_to:
            return None
        return (torch.nn.functional.pad(x, (0, 0, 0, pad_to[rows[-1]] - rows[-1])), *args[1:])

    def cut(module, args, output):
        if threading.get_ident() != owner:
            return None
        return output[..., : rows.pop(), :]

    handles = [layer.register_forward_pre_hook(pad), layer.register_forward_hook(cut)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class TreeLM:
    """Wraps a Hugging Face causal LM; one sequence (batch 1) per instance."""

    def __init__(self, model: PreTrainedModel, head_ids: torch.Tensor | None = None) -> None:
        """`head_ids`: score only these token ids (a reduced draft head); the returned logits are -inf elsewhere."""
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
        self.head_padding = SLOW_HEAD_ROWS if self.device.type == "cpu" else {}
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        if self.head_ids is not None:
            self.head_weight = model.get_output_embeddings().weight[self.head_ids]  # [H, d]
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.length = 0  # committed tokens in the cache
        self.parents: list[int] = []  # speculative region: parent of each entry (-1 = the prefix)
        self.depths: list[int] = []  # 0 for entries attached to the prefix

    @torch.inference_mode()
    def extend(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
        """Feed `tokens` into the speculative region; `parents` index the region (-1 = prefix). -> logits [n, V]."""
        start = len(self.parents)
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
            with padded_rows(self.model.get_output_embeddings(), self.head_padding):
                return self.model(**inputs).logits[0]  # [n, V]
        h = self.model.base_model(**inputs).last_hidden_state[0]  # [n, d]
        scores = (h @ self.head_weight.T).float()  # [n, H]
        return scatter_head(scores, self.head_ids, self.vocab_size)  # [n, V_model]

    def commit(self, keep: list[int]) -> None:
        """Keep region entries `keep` (a chain from the prefix, in order) and drop the rest of the region."""
        for i, node in enumerate(keep):
            expected_parent = keep[i - 1] if i else -1
            if self.parents[node] != expected_parent:
                raise ValueError(f"entries {keep} do not form a chain from the prefix")
        region = len(self.parents)
        if keep != list(range(len(keep))) or len(keep) != region:
            index = torch.tensor(list(range(self.length)) + [self.length + k for k in keep], device=self.device)
            for layer in self.cache.layers:
                layer.keys = layer.keys.index_select(-2, index)
                layer.values = layer.values.index_select(-2, index)
        self.length += len(keep)
        self.parents, self.depths = [], []

    def feed(self, tokens: list[int]) -> torch.Tensor:
        """Append a plain chain of tokens to the committed prefix. -> logits [n, V]."""
        logits = self.extend(tokens, list(range(-1, len(tokens) - 1)))
        self.commit(list(range(len(tokens))))
        return logits

    @property
    def kv_bytes(self) -> int:
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self.cache.layers
                   if getattr(layer, "keys", None) is not None)
