"""A causal LM with a KV cache that can hold a speculative tree (used by the target and the Transformer drafter).

The cache is a committed prefix of `length` tokens followed by a *speculative region*: tokens fed since the
last `commit`, each attached to a parent inside the region (or to the prefix, parent -1). A forward over new
tokens gives each token the attention of the prefix, its ancestors and itself, at position `length + depth`.
`commit(keep)` keeps the listed region entries, which must form a chain from the prefix, and drops the rest.

Attention is the project's own function (`tree_attention`, registered with transformers' `AttentionInterface`),
in one of two layouts:

- **row-invariant** (the default on CPU): every query row is one call of `scaled_dot_product_attention` over
  exactly the keys of its own branch (prefix, ancestors, itself), laid out as a single decode step of `ar` lays
  them out. A tree row and the decode step that reaches the same position then run the very same kernel call on
  the very same numbers, so their outputs are bitwise equal. With the projections and the output layer
  row-invariant too (bfloat16 `F.linear` on a CPU with native bf16, up to `MAX_INVARIANT_ROWS` rows, see
  `bf16_is_row_invariant`), a tree's logits equal those of decoding each branch alone, bit for bit.
- **block**: the whole region at once, one kernel call with a tree attention mask (CUDA, where cuBLAS is not
  row-invariant anyway, and the prompt's prefill, which every method runs the same way).

Per layer the keys and values live in one buffer `[1, H_kv, capacity, d]`: the committed prefix at
`[0, length)`, then scratch. The region's own keys and values are kept beside it, so a commit copies only the
accepted entries into place: its cost grows with the accepted tokens, not with the context. Entries a pass left in
place already are not copied again: the block layout writes the region in order, the row layout leaves the first
child's branch (a decode step's one token, a drafter's likeliest branch) in the buffer; for `ar` that took the
commit from 1.2 to 0.14 ms a step (30 layers of two copies each).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from specdec.packed import PackedLinear, pack_linears, packing_available
from specdec.tree import ancestor_matrix
from specdec.vocab import scatter_head

ATTENTION = "specdec_tree"  # the attention implementation name the wrapped models are switched to
MAX_INVARIANT_ROWS = 32  # bf16 F.linear is row-invariant up to this many rows on this project's CPU (measured)
_GROWTH = 256  # buffer capacity grows in multiples of this many positions



def tree_attention_mask(prefix_len: int, anc: torch.Tensor, rows: slice, dtype: torch.dtype,
                        device: torch.device) -> torch.Tensor:
    """Additive mask [1, 1, n_rows, prefix_len + S] for the region rows `rows` (anc: [S, S] ancestors)."""
    allowed = torch.cat([torch.ones(anc[rows].shape[0], prefix_len, dtype=torch.bool), anc[rows]], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)  # [1, 1, n_rows, prefix_len + S]


@dataclass
class Pass:
    """What `tree_attention` needs to know about one forward: the committed length and each new row's branch."""

    length: int  # committed prefix
    start: int  # region index of the first new row
    paths: list[list[int]]  # per new row: region indices of its branch, root first, ending with the row itself
    row_invariant: bool
    mask: torch.Tensor | None = None  # block layout: [1, 1, n, length + S] additive tree mask (None: causal)
    plan: list[tuple[int, int, list[int] | slice | None, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # The row layout's work list, the same for every layer, so it is worked out once per pass: per row in
        # depth-first order (each row's branch then extends a prefix of the one before), (row, buffer position to
        # write at, region entries to write there or None, keys end). Later children are visited first, so the
        # branch left in the buffer is the first child's (a drafter's likeliest): a commit along it copies nothing.
        if not self.row_invariant:  # the block layout (and the prefill) needs no plan
            return
        written: list[int] = []  # region entries in the buffer after the prefix
        for r in sorted(range(len(self.paths)), key=lambda r: [-i for i in self.paths[r]]):
            path = self.paths[r]
            same = common_prefix(written, path)
            entries = path[same:]
            if entries and entries == list(range(entries[0], entries[0] + len(entries))):
                entries = slice(entries[0], entries[0] + len(entries))  # a view, not a gather
            self.plan.append((r, self.length + same, entries or None, self.length + len(path)))
            written = path

    @property
    def placed(self) -> list[int]:
        """The region entries in the buffer after the prefix once this pass has run, in position order."""
        if not self.row_invariant:  # the block layout writes the region in order
            return list(range(self.start + len(self.paths)))
        return self.paths[self.plan[-1][0]] if self.plan else []


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading entries two branches share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class TreeKV:
    """Per-layer key/value buffers (committed prefix, then scratch) and the region's own keys and values."""

    def __init__(self, num_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * num_layers  # [1, H_kv, capacity, d]
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.region_keys: list[torch.Tensor | None] = [None] * num_layers  # [1, H_kv, S, d]
        self.region_values: list[torch.Tensor | None] = [None] * num_layers
        self.length = 0
        self.step: Pass | None = None
        self.placed: list[int] = []  # region entries already at buffer positions length, length + 1, ...

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def add(self, layer: int, k: torch.Tensor, v: torch.Tensor, needed: int) -> None:
        """Append a forward's new keys/values [1, H_kv, n, d] to the region; make room for `needed` positions."""
        if self.region_keys[layer] is None:
            self.region_keys[layer], self.region_values[layer] = k, v
        else:
            self.region_keys[layer] = torch.cat([self.region_keys[layer], k], dim=2)
            self.region_values[layer] = torch.cat([self.region_values[layer], v], dim=2)
        buffer = self.keys[layer]
        if buffer is None or buffer.shape[2] < needed:
            capacity = max(needed, 2 * buffer.shape[2] if buffer is not None else 0)
            capacity = -(-capacity // _GROWTH) * _GROWTH
            self.keys[layer] = self._grown(buffer, k, capacity)
            self.values[layer] = self._grown(self.values[layer], v, capacity)

    def _grown(self, buffer: torch.Tensor | None, like: torch.Tensor, capacity: int) -> torch.Tensor:
        grown = like.new_zeros(like.shape[0], like.shape[1], capacity, like.shape[3])  # [1, H_kv, capacity, d]
        if buffer is not None:
            grown[:, :, : self.length] = buffer[:, :, : self.length]
        return grown

    def write(self, layer: int, at: int, region_index: list[int] | slice) -> None:
        """Copy region entries into the buffer from position `at` on."""
        k, v = self.region_keys[layer], self.region_values[layer]
        if isinstance(region_index, list):
            index = torch.tensor(region_index, device=k.device)
            k, v = k.index_select(2, index), v.index_select(2, index)
        else:
            k, v = k[:, :, region_index], v[:, :, region_index]
        self.keys[layer][:, :, at: at + k.shape[2]] = k
        self.values[layer][:, :, at: at + v.shape[2]] = v

    def commit(self, keep: list[int]) -> None:
        """Write the kept region entries (a chain from the prefix) after the prefix; forget the region. Entries a
        pass left in place already (`placed`) are not copied again."""
        in_place = common_prefix(keep, self.placed)
        for layer in range(len(self.keys)):
            if keep[in_place:] and self.region_keys[layer] is not None:
                self.write(layer, self.length + in_place, keep[in_place:])
            self.region_keys[layer] = self.region_values[layer] = None
        self.length += len(keep)
        self.placed = []

    def nbytes(self) -> int:
        """Bytes of the keys and values held: the committed prefix and the region."""
        held = 0
        for buffer, region in zip(self.keys + self.values, self.region_keys + self.region_values):
            if buffer is not None:
                per_position = buffer.nbytes // buffer.shape[2]
                held += per_position * (self.length + (region.shape[2] if region is not None else 0))
        return held


def tree_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                   tree_kv: TreeKV | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """query [1, H, n, d], key/value [1, H_kv, n, d] of the n new tokens -> ([1, n, H, d], None).

    Without `tree_kv` (any other caller of the model, e.g. transformers' own `generate`) this is plain sdpa.
    """
    if tree_kv is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    step, layer = tree_kv.step, module.layer_idx
    region = 0 if tree_kv.region_keys[layer] is None else tree_kv.region_keys[layer].shape[2]
    if step.row_invariant:
        tree_kv.add(layer, key, value, step.length + max(len(p) for p in step.paths))
        return _row_attention(tree_kv, layer, query, scaling), None
    tree_kv.add(layer, key, value, step.length + region + key.shape[2])
    tree_kv.write(layer, step.length + region, slice(region, region + key.shape[2]))
    end = step.length + region + key.shape[2]
    k, v = tree_kv.keys[layer][:, :, :end], tree_kv.values[layer][:, :, :end]  # [1, H_kv, end, d]
    causal = step.mask is None and step.length == 0 and region == 0
    out = F.scaled_dot_product_attention(query, k, v, attn_mask=step.mask, is_causal=causal, scale=scaling,
                                         enable_gqa=True)  # [1, H, n, d]
    return out.transpose(1, 2).contiguous(), None


def _row_attention(tree_kv: TreeKV, layer: int, query: torch.Tensor, scaling: float | None) -> torch.Tensor:
    """One kernel call per row over its own branch; rows go depth-first, so each writes one key into place."""
    step = tree_kv.step
    _, heads, n, d = query.shape
    groups = heads // tree_kv.region_keys[layer].shape[1]  # query heads per key/value head (GQA)
    rows = query[0].transpose(0, 1).reshape(n, -1, groups, d)  # [n, H_kv, groups, d], row r contiguous
    keys, values = tree_kv.keys[layer], tree_kv.values[layer]
    out = query.new_empty(1, n, heads, d)  # every row is written below
    for r, at, entries, end in step.plan:
        if entries is not None:
            tree_kv.write(layer, at, entries)
        out[0, r] = F.scaled_dot_product_attention(rows[r: r + 1], keys[:, :, :end], values[:, :, :end],
                                                   scale=scaling).reshape(heads, d)
    return out


AttentionInterface.register(ATTENTION, tree_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)  # other callers of the model get sdpa's masks


def _bf16_linear(weight: torch.Tensor) -> torch.nn.Module:
    """weight [out, in] (bf16) -> the linear layer a bf16 CPU model runs here: packed where oneDNN can
    (`specdec.packed`, what `load_model` and `TreeLM` install), else a plain `nn.Linear`."""
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype)
    linear.weight.data = weight
    linear.requires_grad_(False)
    return PackedLinear(linear) if packing_available() else linear


@cache
def bf16_is_row_invariant(rows: int = MAX_INVARIANT_ROWS) -> bool:
    """Whether this machine's bfloat16 matmuls give each row the same bits whatever the row count (1..`rows`).

    Probed once per process on random weights of a small target's shapes, with the linear layer the models run
    (`_bf16_linear`); a CPU without native bf16 (or a BLAS that changes kernels with the row count) fails it, and
    `--dtype auto` then keeps float32.
    """
    g = torch.Generator().manual_seed(0)
    for out_features, in_features in ((576, 576), (1536, 576), (576, 1536), (8192, 576)):
        linear = _bf16_linear((torch.randn(out_features, in_features, generator=g) * 0.05).bfloat16())
        x = torch.randn(rows, in_features, generator=g).bfloat16()
        single = torch.cat([linear(x[i: i + 1]) for i in range(rows)])  # [rows, out]
        if any(not torch.equal(linear(x[:n]), single[:n]) for n in range(2, rows + 1)):
            return False
    return True


def row_invariant_by_default(device: torch.device) -> bool:
    """The verifier's attention layout where none is asked for: row-invariant on CPU, one masked call elsewhere."""
    return device.type == "cpu"


class TreeLM:
    """Wraps a Hugging Face causal LM; one sequence (batch 1) per instance."""

    def __init__(self, model: PreTrainedModel, head_ids: torch.Tensor | None = None,
                 row_invariant: bool | None = None) -> None:
        """`head_ids`: score only these token ids (a reduced draft head); the returned logits are -inf elsewhere.

        `row_invariant`: the attention layout (module docstring); default: on CPU.
        """
        config = model.config
        layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
        if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True) or \
                layer_types != {"full_attention"}:
            raise ValueError(f"{config.model_type} uses sliding-window or non-attention layers; tree verification "
                             "here needs full attention in every layer")
        if config._attn_implementation != ATTENTION:
            model.set_attn_implementation(ATTENTION)
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.row_invariant = row_invariant_by_default(self.device) if row_invariant is None else row_invariant
        if self.row_invariant and self.dtype == torch.bfloat16 and self.device.type == "cpu":
            pack_linears(model)  # the row-invariant bf16 kernel `bf16_is_row_invariant` checked (no-op if done)
        self.head_ids = head_ids.to(self.device) if head_ids is not None else None
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        if self.head_ids is not None:
            self.head_weight = model.get_output_embeddings().weight[self.head_ids]  # [H, d]
        self.reset()

    def reset(self) -> None:
        self.cache = TreeKV(self.model.config.num_hidden_layers)
        self.parents: list[int] = []  # speculative region: parent of each entry (-1 = the prefix)
        self.depths: list[int] = []  # 0 for entries attached to the prefix
        self.paths: list[list[int]] = []  # each entry's branch in the region, root first
        self.hidden: torch.Tensor | None = None  # [n, D] the last hidden state of each token of the last pass

    @property
    def length(self) -> int:
        """Committed tokens in the cache."""
        return self.cache.length

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
        chunk = MAX_INVARIANT_ROWS if self.row_invariant else len(tokens)  # more rows: not row-invariant
        logits, hidden = zip(*(self._forward(tokens[i: i + chunk], start + i) for i in range(0, len(tokens), chunk)))
        self.hidden = torch.cat(hidden)  # [n, D]
        return torch.cat(logits)  # [n, V]

    def _forward(self, tokens: list[int], start: int, prefill: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """One model pass over region entries `start:start + len(tokens)`.

        -> (logits [len(tokens), V], the last hidden states [len(tokens), D] the output layer scored).
        """
        end = start + len(tokens)
        ids = torch.tensor([tokens], device=self.device)  # [1, n]
        positions = torch.tensor([[self.length + d for d in self.depths[start:end]]], device=self.device)  # [1, n]
        mask = None
        if not self.row_invariant and not prefill:
            mask = tree_attention_mask(self.length, ancestor_matrix(self.parents[:end]), slice(start, end),
                                       self.dtype, self.device)
        self.cache.step = Pass(self.length, start, self.paths[start:end], self.row_invariant and not prefill, mask)
        inputs = dict(input_ids=ids, position_ids=positions, tree_kv=self.cache, use_cache=False)
        self.cache.placed = []  # until the pass has run through: a failed one may have written part of the buffer
        try:
            h = self.model.base_model(**inputs).last_hidden_state  # [1, n, D]
            self.cache.placed = self.cache.step.placed
        finally:
            self.cache.step = None
        if self.head_ids is None:
            return self.model.get_output_embeddings()(h)[0], h[0]  # as the model's own forward scores it
        scores = (h[0] @ self.head_weight.T).float()  # [n, H]
        return scatter_head(scores, self.head_ids, self.vocab_size), h[0]  # [n, V_model]

    @torch.inference_mode()
    def prefill(self, tokens: list[int]) -> torch.Tensor:
        """Append a prompt to an empty cache in one causal pass (block layout). -> logits [n, V].

        Every method prefills the same way, so their caches agree bit for bit; rows after this are row-invariant.
        """
        if self.length or self.parents:
            raise ValueError("prefill needs an empty cache")
        self.parents, self.depths = list(range(-1, len(tokens) - 1)), list(range(len(tokens)))
        self.paths = [[]] * len(tokens)  # unused by the block layout
        logits, self.hidden = self._forward(tokens, 0, prefill=True)
        self.commit(list(range(len(tokens))))
        return logits

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

    @property
    def kv_bytes(self) -> int:
        """Bytes of the keys and values held (committed prefix and region; the buffers reserve up to 2x more)."""
        return self.cache.nbytes()
