"""A causal LM with a KV cache that can hold a speculative tree (used by the target and the Transformer drafter).

The cache is a committed prefix of `length` tokens followed by a *speculative region*: tokens fed since the
last `commit`, each attached to a parent inside the region (or to the prefix, parent -1). A forward over new
tokens gives each token the attention of the prefix, its ancestors and itself, at position `length + depth`.
`commit(keep)` keeps the listed region entries, which must form a chain from the prefix, and drops the rest.

Attention is the project's own function (`tree_attention`, registered with transformers' `AttentionInterface`),
in one of two layouts:

- **split** (the row-invariant layout, the default on CPU): a row at absolute position p attends its keys in two
  parts cut at a boundary that depends on p alone, `head_end(p)`, a multiple of `SPLIT_BLOCK` at least
  `SPLIT_MARGIN` positions back. The head `[0, head_end(p))` lies inside the committed prefix for every row up to
  `SPLIT_MARGIN` deep, so the rows of a pass that share a head attend it in one kernel call over a view of the
  prefix, their queries stacked where the CPU's kernel keeps each row's bits so, else each row its own batch
  element (`attention_mode`, probed per machine); the tail `[head_end(p), p]` (the rest of the prefix, the
  ancestors, itself) is a view of the buffer for a chain and gathered per row for a tree, `TAIL` slots masked
  after the row, and all rows attend their tails in a second call. The two parts are merged by their log-sum-exp,
  elementwise. A decode step at p cuts its keys at the same place and runs the same calls on the same numbers
  (the probe finds the calls, padded where need be, that compute a row alike whatever the other rows), so a tree
  row and the decode step that reaches its position get the same bits. With the projections and the output layer
  row-invariant too (packed linears, float32 or bfloat16, up to `MAX_INVARIANT_ROWS` rows, where the CPU passes
  `specdec.packed.probe_min_rows`), a tree's logits equal those of decoding each branch alone, bit for bit, with no
  kernel call per row.
- **block**: the whole region at once, one kernel call with a tree attention mask (CUDA, where cuBLAS is not
  row-invariant anyway, the Transformer drafter, and the prompt's prefill, which every method runs the same way).

Per layer the keys and values live in one buffer `[1, H_kv, capacity, d]`: the committed prefix at
`[0, length)`, then scratch. The region's own keys and values are kept beside it, so a commit copies only the
accepted entries into place: its cost grows with the accepted tokens, not with the context. Entries a pass left in
place already are not copied again: the block layout writes the region in order, the split layout writes the
first child's branch (a decode step's one token, a drafter's likeliest branch), so `ar`'s commit copies nothing.
"""

from __future__ import annotations

import copy
import threading
import warnings
import weakref

from dataclasses import dataclass, field
from functools import cache

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from specdec.models import dtype_name, kept, packed_min_rows
from specdec.packed import MAX_INVARIANT_ROWS, PACKED_DTYPES, fuse, head_linear, pack_linears
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


SPLIT_BLOCK = 64  # the split layout cuts a row's keys at multiples of this absolute position
SPLIT_MARGIN = 16  # ... at least this many positions before the row: rows up to this deep share heads in the prefix
TAIL = SPLIT_BLOCK + SPLIT_MARGIN  # the most keys a row's tail holds: every tail is padded to this many


def head_end(position: int) -> int:
    """Where the split layout cuts the keys of a row at `position`: a function of the position alone."""
    return max(0, (position - SPLIT_MARGIN) // SPLIT_BLOCK * SPLIT_BLOCK)


@dataclass
class Pass:
    """What `tree_attention` needs to know about one forward: the committed length and each new row's branch."""

    length: int  # committed prefix
    start: int  # region index of the first new row
    paths: list[list[int]]  # per new row: region indices of its branch, root first, ending with the row itself
    row_invariant: bool  # the split layout (else the block layout)
    mask: torch.Tensor | None = None  # block layout: [1, 1, n, length + S] additive tree mask (None: causal)
    device: torch.device = torch.device("cpu")
    # The split layout's plan, the same for every layer, so it is worked out once per pass (see `_plan_split`).
    low: int = 0  # the first committed position any tail reads
    tail_start: int | None = None  # every row's tail is the buffer's [tail_start, tail_start + TAIL): a view
    needed: int = 0  # buffer positions the pass reads or writes, or a commit after it may write
    tail_index: torch.Tensor | None = None  # [n * TAIL] per row, its tail's slots in the gather source
    tail_mask: torch.Tensor | None = None  # [n, 1, 1, TAIL] 0 for a key, -inf for padding
    heads: list[tuple[int, torch.Tensor | None, list[int]]] = field(default_factory=list)  # (end, rows, entries)
    branch: list[int] | slice = field(default_factory=list)  # region entries the pass writes after the prefix

    def __post_init__(self) -> None:
        if self.row_invariant:  # the block layout (and the prefill) needs no plan
            _plan_split(self)

    @property
    def placed(self) -> list[int]:
        """The region entries in the buffer after the prefix once this pass has run, in position order."""
        if not self.row_invariant:  # the block layout writes the region in order
            return list(range(self.start + len(self.paths)))
        return list(range(self.branch.start, self.branch.stop)) if isinstance(self.branch, slice) else self.branch


def _plan_split(step: Pass) -> None:
    """Each row's cut (`head_end`), its tail's slots in the gather source `[prefix[low:length], region, zero]`, and
    the rows grouped by their head: (head end, row indices or None for all rows, region entries the head holds
    beyond the prefix: empty for rows up to `SPLIT_MARGIN` deep)."""
    length, n = step.length, len(step.paths)
    region = step.start + n  # region entries once this pass's are added
    positions = [length + len(path) - 1 for path in step.paths]
    cuts = [head_end(p) for p in positions]
    step.low = min(min(cuts), length)
    # Later children first, as a depth-first walk would leave the buffer: the first child's branch (a drafter's
    # likeliest) is written after the prefix, so a commit along it copies nothing.
    branch = max(step.paths, key=lambda path: [-i for i in path])
    step.branch = slice(branch[0], branch[-1] + 1) if branch == list(range(branch[0], branch[-1] + 1)) else branch
    step.needed = length + max(map(len, step.paths))  # room for a commit of the deepest branch, placed or not
    if len(set(cuts)) == 1 and all(path == branch[: len(path)] for path in step.paths):
        # A chain (a decode step, a drafted chain): every row's keys lie in the buffer once the branch is written,
        # from the one cut on, so every tail is a view of the same TAIL positions, masked after the row.
        step.tail_start, step.needed = cuts[0], max(step.needed, cuts[0] + TAIL)
    zero = length - step.low + region  # the gather source's zero slot
    index, valid = [], []
    for path, p, cut in zip(step.paths, positions, cuts):
        valid.append(p + 1 - cut)
        if step.tail_start is None:
            index += [q - step.low if q < length else length - step.low + path[q - length] for q in range(cut, p + 1)]
            index += [zero] * (TAIL - valid[-1])
    step.tail_index = torch.tensor(index, device=step.device) if index else None
    mask = torch.zeros(n, TAIL)
    for r, count in enumerate(valid):
        mask[r, count:] = float("-inf")
    step.tail_mask = mask[:, None, None].to(step.device)  # [n, 1, 1, TAIL]
    groups: dict[tuple[int, ...], list[int]] = {}
    for r, (path, cut) in enumerate(zip(step.paths, cuts)):
        if cut:
            groups.setdefault((cut, *path[: max(0, cut - length)]), []).append(r)
    for (cut, *entries), rows in groups.items():
        which = None if len(rows) == n else torch.tensor(rows, device=step.device)
        step.heads.append((cut, which, entries if step.tail_start is None else []))  # a chain's are in the buffer


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
        tree_kv.add(layer, key, value, step.needed)
        tree_kv.write(layer, step.length, step.branch)
        return _split_attention(tree_kv, layer, query, scaling), None
    tree_kv.add(layer, key, value, step.length + region + key.shape[2])
    tree_kv.write(layer, step.length + region, slice(region, region + key.shape[2]))
    end = step.length + region + key.shape[2]
    k, v = tree_kv.keys[layer][:, :, :end], tree_kv.values[layer][:, :, :end]  # [1, H_kv, end, d]
    causal = step.mask is None and step.length == 0 and region == 0
    out = F.scaled_dot_product_attention(query, k, v, attn_mask=step.mask, is_causal=causal, scale=scaling,
                                         enable_gqa=True)  # [1, H, n, d]
    return out.transpose(1, 2).contiguous(), None


_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # (out, log-sum-exp); no dropout, no causal


def _split_attention(tree_kv: TreeKV, layer: int, query: torch.Tensor, scaling: float | None) -> torch.Tensor:
    """The split layout (module docstring): every row's tail in one call, each shared head in one call, merged."""
    step = tree_kv.step
    _, heads, n, d = query.shape
    region_k, region_v = tree_kv.region_keys[layer], tree_kv.region_values[layer]  # [1, H_kv, S, d]
    kv_heads = region_k.shape[1]
    q = query[0].transpose(0, 1).reshape(n, kv_heads, heads // kv_heads, d)  # [n, H_kv, groups, d]: GQA groups
    keys, values = tree_kv.keys[layer], tree_kv.values[layer]  # [1, H_kv, capacity, d]

    def tails(buffer: torch.Tensor, region: torch.Tensor) -> torch.Tensor:  # -> [n, H_kv, TAIL, d]
        zero = region.new_zeros(1, kv_heads, 1, d)
        source = torch.cat([buffer[:, :, step.low: step.length], region, zero], dim=2)[0]  # [H_kv, slots, d]
        return source.index_select(1, step.tail_index).view(kv_heads, n, TAIL, d).transpose(0, 1)

    if step.tail_start is not None:
        window = slice(step.tail_start, step.tail_start + TAIL)
        tail_k, tail_v = keys[:, :, window].expand(n, -1, -1, -1), values[:, :, window].expand(n, -1, -1, -1)
    else:
        tail_k, tail_v = tails(keys, region_k), tails(values, region_v)
    mode = attention_mode(q.dtype, q.shape[2], d)
    out, lse = _batched_flash(q, tail_k, tail_v, step.tail_mask, scaling,
                              mode.batch_min_rows)  # [n, H_kv, groups, d], [n, H_kv, groups]
    for end, rows, entries in step.heads:
        if entries:  # a row deeper than SPLIT_MARGIN: its head runs past the prefix into its own branch
            index = torch.tensor(entries, device=q.device)
            head_k = torch.cat([keys[:, :, : step.length], region_k.index_select(2, index)], dim=2)
            head_v = torch.cat([values[:, :, : step.length], region_v.index_select(2, index)], dim=2)
        else:
            head_k, head_v = keys[:, :, :end], values[:, :, :end]  # [1, H_kv, end, d], views of the prefix
        head_out, head_lse = _head_attention(q if rows is None else q[rows], head_k, head_v, scaling, mode)
        tail_out, tail_lse = (out, lse) if rows is None else (out[rows], lse[rows])
        # The head's weight e^lse_h / (e^lse_h + e^lse_t) = 1 / (1 + e^(lse_t - lse_h)); torch.exp and division
        # give every element the same bits whatever its place in the tensor (torch.sigmoid does not).
        share = torch.exp(tail_lse - head_lse).add_(1).reciprocal_()[..., None]  # [count, H_kv, groups, 1]
        tail_out = tail_out.float()
        merged = torch.addcmul(tail_out, head_out.float() - tail_out, share)  # [count, H_kv, groups, d]
        out = merged.to(out.dtype) if rows is None else out.index_copy(0, rows, merged.to(out.dtype))
    return out.reshape(n, heads, d)[None]  # [1, n, H, d]


def _batched_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                   scaling: float | None, min_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One kernel call, each row of q [m, H_kv, groups, d] its own batch element over k/v [m or 1, H_kv, keys, d];
    fewer than `min_rows` rows are padded with copies of the first (`AttentionMode.batch_min_rows`)."""
    m = q.shape[0]
    if m < min_rows:
        # Shared keys stay a view (the kernel is given the strides it is given for any batch of them).
        pad = lambda x: x.expand(min_rows, *x.shape[1:]) if x.shape[0] == 1 or x.stride(0) == 0 else \
            torch.cat([x, x[:1].expand(min_rows - m, *x.shape[1:])])  # noqa: E731
        q, k, v, mask = pad(q), pad(k), pad(v), None if mask is None else pad(mask)
    k, v = k.expand(q.shape[0], -1, -1, -1), v.expand(q.shape[0], -1, -1, -1)
    out, lse = _flash(q, k, v, 0.0, False, attn_mask=mask, scale=scaling)
    return out[:m], lse[:m]


def _head_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float | None,
                    mode: AttentionMode) -> tuple[torch.Tensor, torch.Tensor]:
    """q [m, H_kv, groups, d] over the same keys k/v [1, H_kv, end, d] -> (out [m, H_kv, groups, d], lse [m, H_kv,
    groups]), the way `mode` says: the queries of up to `mode.stack` rows stacked along one call's query axis,
    reading the keys once for them all, or (stack 0) each row its own batch element over the shared keys (a view),
    reading them once a row."""
    m, kv_heads, groups, d = q.shape
    if not mode.stack:
        return _batched_flash(q, k, v, None, scaling, mode.batch_min_rows)
    outs, lses = [], []
    for i in range(0, m, mode.stack):
        chunk = q[i: i + mode.stack]  # [c, H_kv, groups, d]
        c = chunk.shape[0]
        if c < mode.stack_min_rows:  # zero rows: the kernel takes the path it takes for larger stacks
            chunk = torch.cat([chunk, chunk.new_zeros(mode.stack_min_rows - c, kv_heads, groups, d)])
        out, lse = _flash(chunk.transpose(0, 1).reshape(1, kv_heads, -1, d), k, v, 0.0, False,
                          scale=scaling)  # [1, H_kv, c * groups, d], [1, H_kv, c * groups]
        outs.append(out[0].view(kv_heads, -1, groups, d).transpose(0, 1)[:c])
        lses.append(lse[0].view(kv_heads, -1, groups).transpose(0, 1)[:c])
    return (outs[0], lses[0]) if len(outs) == 1 else (torch.cat(outs), torch.cat(lses))


@dataclass(frozen=True)
class AttentionMode:
    """How the split layout calls the CPU's attention kernel so that a row's bits do not depend on the other rows of
    the call (`probe_attention_mode`).

    `batch_min_rows`: calls with one row a batch element hold at least this many (1, or 2 where a batch of one takes
    another path than larger batches). `stack`: rows of a shared head stacked along one call's query axis (0: each
    its own batch element instead); `stack_min_rows`: the fewest rows such a call holds (2: a lone row is padded).
    """

    batch_min_rows: int = 1
    stack: int = 0
    stack_min_rows: int = 1


@cache
def attention_mode(dtype: torch.dtype, groups: int, d: int) -> AttentionMode:
    """This machine's `AttentionMode` for a head layout, kept with its other kernel probes (`specdec.models.kept`):
    it decides bits greedy decoding prints."""
    return AttentionMode(**kept(f"attention {dtype_name(dtype)} {groups}x{d}",
                                lambda: vars(probe_attention_mode(dtype, groups, d))))


def probe_attention_mode(dtype: torch.dtype, groups: int, d: int) -> AttentionMode:
    """The cheapest row-invariant way to call this CPU's attention kernel, probed on random tensors as
    `specdec.packed.probe_min_rows` probes the linears: the fewest batch elements (1 or 2) from which each
    element's bits are the same whatever the batch, up to `MAX_INVARIANT_ROWS`; then whether a shared head's rows
    can be stacked, up to 32 queries a call (the kernel's query block), a row getting the same bits whatever the
    other rows of the call, from one row or (padded) from two."""
    g = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=g).to(dtype)  # noqa: E731
    rows = MAX_INVARIANT_ROWS
    batch_min_rows = 1  # 0: no batch is invariant
    for keys in (TAIL, 700):  # a tail's keys, a head's
        q, k, v = rand(rows, 3, groups, d), rand(rows, 3, keys, d), rand(rows, 3, keys, d)
        mask = torch.zeros(rows, 1, 1, keys)
        for r in range(rows):
            mask[r, ..., 1 + r * 7 % keys:] = float("-inf")

        def invariant(min_rows: int) -> bool:
            alone = [_batched_flash(q[i: i + 1], k[i: i + 1], v[i: i + 1], mask[i: i + 1], None, min_rows)
                     for i in range(rows)]
            return all(_same_rows(_batched_flash(q[:n], k[:n], v[:n], mask[:n], None, min_rows), alone)
                       for n in (2, 3, 5, 8, 16, rows))

        found = 1 if invariant(1) else 2 if invariant(2) else 0
        batch_min_rows = 0 if not found or not batch_min_rows else max(batch_min_rows, found)
    if not batch_min_rows:
        warnings.warn("this CPU's attention kernel gives a row other bits beside other rows (in float32 on x86:"
                      " MKL ran before specdec could set MKL_CBWR; import specdec first), so tree verification here"
                      " is not bit-exact: greedy output may differ from the target alone")
        return AttentionMode(2)
    most = 32 // groups
    if most >= 2:
        cases = [(rand(most, 3, groups, d), rand(1, 3, keys, d), rand(1, 3, keys, d)) for keys in (100, 700)]
        for min_rows in (1, 2):
            mode = AttentionMode(batch_min_rows, most, min_rows)
            if all(_same_rows(_head_attention(q[:n], k, v, None, mode),
                              [_head_attention(q[i: i + 1], k, v, None, mode) for i in range(most)])
                   for q, k, v in cases for n in range(2, most + 1)):
                return mode
    return AttentionMode(batch_min_rows)


def _same_rows(together: tuple[torch.Tensor, torch.Tensor], alone: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    """Whether each row of a call's (out, lse) has the bits that row got in a call of its own."""
    out, lse = together
    return all(torch.equal(out[i], alone[i][0][0]) and torch.equal(lse[i], alone[i][1][0]) for i in range(len(out)))


AttentionInterface.register(ATTENTION, tree_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)  # other callers of the model get sdpa's masks


def row_invariant_by_default(device: torch.device) -> bool:
    """The verifier's attention layout where none is asked for: row-invariant on CPU, one masked call elsewhere."""
    return device.type == "cpu"


def runs_direct(model: PreTrainedModel) -> bool:
    """Whether `TreeLM` runs `model`'s layers itself (`_llama_pass`): a transformers Llama built of its own classes
    exactly (a subclass may change what a layer computes), on a CPU. Any other model goes through its own
    `forward`, with `tree_attention` as its attention."""
    from transformers.models.llama import modeling_llama as llama

    base = model.base_model
    return next(model.parameters()).device.type == "cpu" and type(base) is llama.LlamaModel and \
        type(base.norm) is llama.LlamaRMSNorm and type(base.rotary_emb) is llama.LlamaRotaryEmbedding and \
        all(type(layer) is llama.LlamaDecoderLayer and type(layer.self_attn) is llama.LlamaAttention and
            type(layer.mlp) is llama.LlamaMLP for layer in base.layers)


_FUSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a Llama -> its layers' (qkv, gate-up) or Nones
_FUSING = threading.Lock()


def _fuse_projections(base: PreTrainedModel) -> None:
    """Fuse each layer's query, key and value projections and its gate and up projections (`specdec.packed.fuse`:
    where this CPU gives the fused outputs the same bits), once per model, for `_llama_pass`."""
    with _FUSING:
        if base not in _FUSED:
            _FUSED[base] = [(fuse([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]),
                             fuse([layer.mlp.gate_proj, layer.mlp.up_proj])) for layer in base.layers]


def _llama_pass(base: PreTrainedModel, ids: torch.Tensor, positions: torch.Tensor, tree_kv: TreeKV) -> torch.Tensor:
    """`LlamaModel.forward` over ids [1, n] at `positions` [1, n] with `tree_attention` -> last hidden [1, n, D].

    The same modules and functions in the same order as transformers' own forward, so the same bits (a test
    checks it), without what a general forward does around them on every call (argument checks, the causal mask
    that `tree_attention` does not read, output capture), which on a CPU is a sizeable part of a decode step; and
    the projections that read one input multiplied as one (`_fuse_projections`), where that keeps their bits.
    """
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    h = base.embed_tokens(ids)  # [1, n, D]
    cos, sin = base.rotary_emb(h, position_ids=positions)
    shape = (*ids.shape, -1, base.layers[0].self_attn.head_dim)  # [1, n, heads, d]
    layers = base.layers[: base.config.num_hidden_layers]
    for layer, (qkv, gate_up) in zip(layers, _FUSED.get(base) or [(None, None)] * len(layers)):
        attention, mlp = layer.self_attn, layer.mlp
        x = layer.input_layernorm(h)
        q, k, v = qkv(x) if qkv else (attention.q_proj(x), attention.k_proj(x), attention.v_proj(x))
        q, k = apply_rotary_pos_emb(q.view(shape).transpose(1, 2), k.view(shape).transpose(1, 2), cos, sin)
        v = v.view(shape).transpose(1, 2)  # q [1, H, n, d], k and v [1, H_kv, n, d]
        out, _ = tree_attention(attention, q, k, v, None, scaling=attention.scaling, tree_kv=tree_kv)
        h = h + attention.o_proj(out.reshape(*ids.shape, -1).contiguous())
        x = layer.post_attention_layernorm(h)
        if gate_up:  # as LlamaMLP.forward
            gate, up = gate_up(x)
            h = h + mlp.down_proj(mlp.act_fn(gate) * up)
        else:
            h = h + mlp(x)
    return base.norm(h)


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
        self.direct = runs_direct(model)  # the pass loops over the layers itself (`_llama_pass`)
        if self.device.type == "cpu" and self.dtype in PACKED_DTYPES:
            pack_linears(model, packed_min_rows(self.dtype))  # the kernel `probe_min_rows` checked (no-op if done)
            if self.direct:
                _fuse_projections(model.base_model)
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

        -> (logits [len(tokens), V], or [1, V] of the last token for a prefill; the last hidden states
        [len(tokens), D]).
        """
        end = start + len(tokens)
        ids = torch.tensor([tokens], device=self.device)  # [1, n]
        positions = torch.tensor([[self.length + d for d in self.depths[start:end]]], device=self.device)  # [1, n]
        mask = None
        if not self.row_invariant and not prefill:
            mask = tree_attention_mask(self.length, ancestor_matrix(self.parents[:end]), slice(start, end),
                                       self.dtype, self.device)
        self.cache.step = Pass(self.length, start, self.paths[start:end], self.row_invariant and not prefill, mask,
                               self.device)
        self.cache.placed = []  # until the pass has run through: a failed one may have written part of the buffer
        try:
            if self.direct:
                h = _llama_pass(self.model.base_model, ids, positions, self.cache)  # [1, n, D]
            else:
                h = self.model.base_model(input_ids=ids, position_ids=positions, tree_kv=self.cache,
                                          use_cache=False).last_hidden_state  # [1, n, D]
            self.cache.placed = self.cache.step.placed
        finally:
            self.cache.step = None
        scored = h[:, -1:] if prefill else h  # a prompt's other positions need no logits
        if self.head_ids is None:
            return self.model.get_output_embeddings()(scored)[0], h[0]  # as the model's own forward scores it
        scores = self.head(scored[0]).float()  # [n, H]
        return scatter_head(scores, self.head_ids, self.vocab_size), h[0]  # [n, V_model]

    @torch.inference_mode()
    def prefill(self, tokens: list[int]) -> torch.Tensor:
        """Append a prompt to an empty cache in one causal pass (block layout). -> the last token's logits [1, V].

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
