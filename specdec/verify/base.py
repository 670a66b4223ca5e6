"""The verifier's interface, `TreeLM`, and its plain backend: one masked attention call per layer.

A `TreeLM` wraps a causal LM for one sequence. Its KV cache is a committed prefix of `length` tokens followed by
a *speculative region*: the tokens fed since the last `commit`, each attached to a parent inside the region (or
to the prefix, parent -1). A round uses four methods:

- `prefill(prompt)`: the prompt into an empty cache, one causal pass (every backend prefills alike);
- `extend(tokens, parents)`: a tree into the region, one pass; each token attends the prefix, its ancestors and
  itself, at position `length + depth` -> its logits [n, V];
- `hidden`: the last hidden states [n, D] of the last pass's tokens (what a feature-reading drafter reads);
- `commit(keep)`: keep the listed region entries, a chain from the prefix, and drop the rest.

This module is the plain backend, which CUDA and MPS run: the region lies in the cache in the order it was fed,
and each layer attends in one `scaled_dot_product_attention` call with an additive tree mask. `TreeLM(model)`
picks the backend once (`backend_for`); on a CPU that is one of `specdec.verify.cpu`, which changes how a pass
runs behind the same methods and can be skipped to understand a round.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from specdec.packed import head_linear
from specdec.vocab import scatter_head

ATTENTION = "specdec_tree"  # the attention implementation name the wrapped models are switched to
_GROWTH = 256  # buffer capacity grows in multiples of this many positions


def ancestor_matrix(parents: list[int]) -> torch.Tensor:
    """`anc[i, j]` is True when node j is node i or one of its ancestors (parents come before children)."""
    n = len(parents)
    anc = torch.eye(n, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            anc[i] |= anc[parent]
    return anc  # [n, n]


def tree_attention_mask(prefix_len: int, anc: torch.Tensor, rows: slice, dtype: torch.dtype,
                        device: torch.device) -> torch.Tensor:
    """Additive mask [1, 1, n_rows, prefix_len + S] for the region rows `rows` (anc: [S, S] ancestors)."""
    allowed = torch.cat([torch.ones(anc[rows].shape[0], prefix_len, dtype=torch.bool), anc[rows]], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)  # [1, 1, n_rows, prefix_len + S]


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading entries two branches share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@dataclass
class Pass:
    """The plain backend's plan for one forward: its rows are region entries `[start, end)`, their keys written
    after the prefix and the region fed before them."""

    length: int  # committed prefix
    start: int  # region index of the first new row
    end: int  # region entries once this pass's are added
    mask: torch.Tensor | None  # [1, 1, n, length + end] additive tree mask; None: causal (a prefill)

    @property
    def placed(self) -> list[int]:
        """The region entries in the buffer after the prefix once this pass has run, in position order."""
        return list(range(self.end))


class KVCache:
    """Per layer, keys and values [1, H_kv, capacity, d]: the committed prefix at `[0, length)`, then the `region`
    entries in the order they were fed, then scratch. A commit copies only the kept entries not in place already,
    so its cost grows with the accepted tokens, not with the context."""

    def __init__(self, num_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.length = 0  # committed positions
        self.region = 0  # region entries held

    def reserve(self, layer: int, k: torch.Tensor, v: torch.Tensor, needed: int, kept: int) -> None:
        """Room for `needed` positions in `layer`'s buffers (for keys like k, values like v); a buffer that grows
        takes its first `kept` positions along."""
        buffer = self.keys[layer]
        if buffer is None or buffer.shape[2] < needed:
            capacity = max(needed, 2 * buffer.shape[2] if buffer is not None else 0)
            capacity = -(-capacity // _GROWTH) * _GROWTH
            self.keys[layer] = _grown(buffer, k, capacity, kept)
            self.values[layer] = _grown(self.values[layer], v, capacity, kept)

    def update(self, layer: int, at: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a pass's keys and values [1, H_kv, n, d] at position `at` -> all keys and values up to them
        [1, H_kv, at + n, d] (views of the buffers)."""
        end = at + k.shape[2]
        self.reserve(layer, k, v, end, at)
        self.keys[layer][:, :, at:end] = k
        self.values[layer][:, :, at:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def write(self, layer: int, at: int, entries: list[int]) -> None:
        """Copy region entries into the buffer from position `at` on."""
        index = torch.tensor(entries, device=self.keys[layer].device) + self.length
        for buffer in (self.keys[layer], self.values[layer]):
            buffer[:, :, at: at + len(entries)] = buffer.index_select(2, index)

    def commit(self, keep: list[int]) -> None:
        """Move the kept region entries (a chain from the prefix) into place after the prefix; forget the region."""
        in_place = common_prefix(keep, list(range(self.region)))
        if keep[in_place:]:
            for layer in range(len(self.keys)):
                self.write(layer, self.length + in_place, keep[in_place:])
        self.length += len(keep)
        self.region = 0

    def nbytes(self) -> int:
        """Bytes of the keys and values held: the committed prefix and the region."""
        return sum(buffer.nbytes // buffer.shape[2] * (self.length + self.region)
                   for buffer in self.keys + self.values if buffer is not None)


def _grown(buffer: torch.Tensor | None, like: torch.Tensor, capacity: int, kept: int) -> torch.Tensor:
    grown = like.new_zeros(like.shape[0], like.shape[1], capacity, like.shape[3])  # [1, H_kv, capacity, d]
    if buffer is not None:
        grown[:, :, :kept] = buffer[:, :, :kept]
    return grown


def tree_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                   tree_attend=None, **kwargs) -> tuple[torch.Tensor, None]:
    """query [1, H, n, d], key/value [1, H_kv, n, d] of the n new tokens -> ([1, n, H, d], None).

    `tree_attend(layer, q, k, v, scaling)`: the attention of the verifier's pass, handed to the model's forward by
    `TreeLM._layers`. Without it (any other caller of the model, e.g. transformers' own `generate`) this is sdpa.
    """
    if tree_attend is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    return tree_attend(module.layer_idx, query, key, value, scaling), None


AttentionInterface.register(ATTENTION, tree_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)  # other callers of the model get sdpa's masks


def backend_for(model: PreTrainedModel, row_invariant: bool | None = None) -> type[TreeLM]:
    """The verifier backend for a model, chosen once: this module's on CUDA and MPS, a CPU backend on a CPU
    (`specdec.verify.cpu.backend_for`: row-invariant where asked, or by default where this CPU's kernels are)."""
    if next(model.parameters()).device.type == "cpu":
        from specdec.verify import cpu  # the CPU backends build on this module

        return cpu.backend_for(model, row_invariant)
    if row_invariant:
        raise ValueError("the row-invariant verifier runs on a CPU; elsewhere it is one masked call per layer")
    return TreeLM


def check_full_attention(config) -> None:
    """Refuse a model with sliding-window or non-attention layers: a tree pass needs every layer to see every key."""
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True) or \
            layer_types != {"full_attention"}:
        raise ValueError(f"{config.model_type} uses sliding-window or non-attention layers; tree verification "
                         "here needs full attention in every layer")


class TreeLM:
    """A Hugging Face causal LM with a tree KV cache; one sequence (batch 1) per instance (module docstring)."""

    row_invariant = False  # whether every row gets the bits of decoding its branch alone
    direct = False  # whether a pass runs the model's layers itself rather than through its forward
    rows_per_pass: int | None = None  # the most rows one pass holds (longer extends are split); None: any
    Cache = KVCache

    def __new__(cls, model: PreTrainedModel | None = None, head_ids: torch.Tensor | None = None,
                row_invariant: bool | None = None) -> TreeLM:
        """`TreeLM(model)` is an instance of the backend `backend_for` picks (a copy keeps its class)."""
        if cls is TreeLM and model is not None:
            cls = backend_for(model, row_invariant)
        return super().__new__(cls)

    def __init__(self, model: PreTrainedModel, head_ids: torch.Tensor | None = None,
                 row_invariant: bool | None = None) -> None:
        """`head_ids`: score only these token ids (a reduced draft head); the returned logits are -inf elsewhere.

        `row_invariant`: whether every row must get the bits of decoding its branch alone (the verifier on a CPU);
        None: wherever this machine can (`backend_for`).
        """
        check_full_attention(model.config)
        if model.config._attn_implementation != ATTENTION:
            model.set_attn_implementation(ATTENTION)
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.head_ids = head_ids.to(self.device) if head_ids is not None else None
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        if self.head_ids is not None:
            self.head = head_linear(model.get_output_embeddings().weight[self.head_ids])  # [H, d]: the draft head
        self.reset()

    def fork(self) -> TreeLM:
        """A copy with a cache of its own that shares the model's weights (to decode branches from one prefix)."""
        shared = [self.model, *([self.head] if self.head_ids is not None else [])]
        return copy.deepcopy(self, {id(x): x for x in shared})

    def reset(self) -> None:
        self.cache = self.Cache(self.model.config.num_hidden_layers)
        self.parents: list[int] = []  # speculative region: parent of each entry (-1 = the prefix)
        self.depths: list[int] = []  # 0 for entries attached to the prefix
        self.paths: list[list[int]] = []  # each entry's branch in the region, root first
        self.hidden: torch.Tensor | None = None  # [n, D] the last hidden state of each token of the last pass

    @property
    def length(self) -> int:
        """Committed tokens in the cache."""
        return self.cache.length

    @property
    def kv_bytes(self) -> int:
        """Bytes of the keys and values held (committed prefix and region; the buffers reserve up to 2x more)."""
        return self.cache.nbytes()

    @torch.inference_mode()
    def prefill(self, tokens: list[int]) -> torch.Tensor:
        """Append a prompt to an empty cache in one causal pass. -> the last token's logits [1, V].

        Every backend prefills the same way, so the caches of all methods agree bit for bit.
        """
        if self.length or self.parents:
            raise ValueError("prefill needs an empty cache")
        self.parents, self.depths = list(range(-1, len(tokens) - 1)), list(range(len(tokens)))
        self.paths = [[]] * len(tokens)  # unused by a causal pass
        logits, self.hidden = self._forward(tokens, 0, prefill=True)
        self.commit(list(range(len(tokens))))
        return logits

    @torch.inference_mode()
    def extend(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
        """Feed `tokens` into the speculative region; `parents` index the region (-1 = prefix). -> logits [n, V]."""
        start, n = len(self.parents), len(tokens)
        if len(parents) != n:
            raise ValueError(f"{n} tokens but {len(parents)} parents")
        for i, parent in enumerate(parents):
            if parent >= start + i:
                raise ValueError("a token's parent must come before it")
            self.parents.append(parent)
            self.depths.append(0 if parent < 0 else self.depths[parent] + 1)
            self.paths.append([*(self.paths[parent] if parent >= 0 else []), start + i])
        chunk = self.rows_per_pass or n
        logits, hidden = zip(*(self._forward(tokens[i: i + chunk], start + i) for i in range(0, n, chunk)))
        self.hidden = torch.cat(hidden)  # [n, D]
        return torch.cat(logits)  # [n, V]

    @torch.inference_mode()
    def commit(self, keep: list[int]) -> None:
        """Keep region entries `keep` (a chain from the prefix, in order) and drop the rest of the region."""
        for i, node in enumerate(keep):
            expected_parent = keep[i - 1] if i else -1
            if self.parents[node] != expected_parent:
                raise ValueError(f"entries {keep} do not form a chain from the prefix")
        self.cache.commit(keep)
        self.parents, self.depths, self.paths = [], [], []

    def feed(self, tokens: list[int]) -> torch.Tensor:
        """Append a plain chain of tokens to the committed prefix. -> logits [n, V]."""
        logits = self.extend(tokens, list(range(-1, len(tokens) - 1)))
        self.commit(list(range(len(tokens))))
        return logits

    def _forward(self, tokens: list[int], start: int, prefill: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """One model pass over region entries `start:start + len(tokens)`.

        -> (logits [len(tokens), V], or [1, V] of the last token for a prefill; the last hidden states
        [len(tokens), D]).
        """
        end = start + len(tokens)
        ids = torch.tensor([tokens], device=self.device)  # [1, n]
        positions = torch.tensor([[self.length + d for d in self.depths[start:end]]], device=self.device)  # [1, n]
        h = self._pass(ids, positions, self._plan(start, end, prefill))  # [1, n, D]
        return self._logits(h[:, -1:] if prefill else h), h[0]  # a prompt's other positions need no logits

    def _plan(self, start: int, end: int, prefill: bool) -> Pass:
        """What the pass over region entries [start, end) attends: the tree mask (none for a prefill: causal)."""
        mask = None if prefill else tree_attention_mask(self.length, ancestor_matrix(self.parents[:end]),
                                                        slice(start, end), self.dtype, self.device)
        return Pass(self.length, start, end, mask)

    def _pass(self, ids: torch.Tensor, positions: torch.Tensor, plan: Pass) -> torch.Tensor:
        """ids [1, n] at positions [1, n] through the model as `plan` says -> last hidden [1, n, D]."""
        h = self._layers(ids, positions, partial(self._attend, plan))
        self.cache.region = plan.end
        return h

    def _layers(self, ids: torch.Tensor, positions: torch.Tensor, attend) -> torch.Tensor:
        """The model's own forward, `attend` its attention (`tree_attention`) -> last hidden [1, n, D]."""
        return self.model.base_model(input_ids=ids, position_ids=positions, tree_attend=attend,
                                     use_cache=False).last_hidden_state

    def _attend(self, plan: Pass, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                scaling: float | None) -> torch.Tensor:
        """q [1, H, n, d], k and v [1, H_kv, n, d] of the pass's rows -> [1, n, H, d]: one masked call over the
        prefix, the region fed before and the rows themselves."""
        keys, values = self.cache.update(layer, plan.length + plan.start, k, v)  # [1, H_kv, length + end, d]
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=plan.mask, is_causal=plan.mask is None,
                                             scale=scaling, enable_gqa=True)  # [1, H, n, d]
        return out.transpose(1, 2).contiguous()

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """Last hidden states [1, n, D] -> logits [n, V], as the model's own forward scores them (or the head's)."""
        if self.head_ids is None:
            return self.model.get_output_embeddings()(h)[0]
        scores = self.head(h[0]).float()  # [n, H]
        return scatter_head(scores, self.head_ids, self.vocab_size)  # [n, V_model]
