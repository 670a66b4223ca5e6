"""The split layout: attention in which a row's bits do not depend on the other rows of its pass (CPU).

A row at absolute position p attends its keys in two parts cut at a boundary that depends on p alone,
`head_end(p)`, a multiple of `SPLIT_BLOCK` at least `SPLIT_MARGIN` positions back:

- the **head** `[0, head_end(p))` lies inside the committed prefix for every row up to `SPLIT_MARGIN` deep, so the
  rows of a pass that share a head attend it in one kernel call over a view of the prefix, their queries stacked
  where the CPU's kernel keeps each row's bits so, else each row its own batch element (`AttentionMode`, probed
  per machine by `specdec.probes.attention_mode`);
- the **tail** `[head_end(p), p]` (the rest of the prefix, the ancestors, itself) is a view of the buffer for a
  chain and gathered per row for a tree, `TAIL` slots masked after the row, and all rows attend their tails in a
  second call.

The two parts are merged by their log-sum-exp, elementwise. A decode step at p cuts its keys at the same place and
runs the same calls on the same numbers (the probe finds the calls, padded where need be, that compute a row alike
whatever the other rows), so a tree row and the decode step that reaches its position get the same bits.

Names: `n` rows in a pass, `H` query heads, `H_kv` key/value heads, `groups = H / H_kv`, `d` head width, `S`
region entries, `lse` a row's log-sum-exp over the keys it attended.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec import probes
from specdec.probes import AttentionMode
from specdec.verify.base import KVCache, common_prefix

SPLIT_BLOCK = 64  # the split layout cuts a row's keys at multiples of this absolute position
SPLIT_MARGIN = 16  # ... at least this many positions before the row: rows up to this deep share heads in the prefix
TAIL = SPLIT_BLOCK + SPLIT_MARGIN  # the most keys a row's tail holds: every tail is padded to this many


def head_end(position: int) -> int:
    """Where the split layout cuts the keys of a row at `position`: a function of the position alone."""
    return max(0, (position - SPLIT_MARGIN) // SPLIT_BLOCK * SPLIT_BLOCK)


@dataclass
class Head:
    """One head call of a split pass: the keys `[0, end)` for the rows `rows`."""

    end: int  # the rows' cut, `head_end` of their positions
    rows: torch.Tensor | None  # [m] the pass's rows that attend this head; None: all of them
    entries: list[int]  # region entries the head holds past the prefix (a row more than SPLIT_MARGIN deep)


@dataclass
class SplitPass:
    """The split layout's plan for one forward, the same for every layer, so it is worked out once per pass."""

    length: int  # committed prefix
    start: int  # region index of the first new row
    end: int  # region entries once this pass's are added
    branch: list[int] | slice  # region entries the pass writes after the prefix
    needed: int  # buffer positions the pass reads or writes, or a commit after it may write
    low: int  # the first committed position any tail reads
    tail_start: int | None  # a chain: every row's tail is the buffer's [tail_start, tail_start + TAIL), a view
    tail_index: torch.Tensor | None  # [n * TAIL] otherwise: each row's tail slots in the gather source
    tail_mask: torch.Tensor  # [n, 1, 1, TAIL] 0 for a key, -inf for padding
    heads: list[Head]

    @property
    def placed(self) -> list[int]:
        """The region entries in the buffer after the prefix once this pass has run, in position order."""
        branch = self.branch
        return list(range(branch.start, branch.stop)) if isinstance(branch, slice) else branch


def plan_split(length: int, start: int, paths: list[list[int]], device: torch.device) -> SplitPass:
    """The plan of a pass whose rows have these branches (`paths`: region indices, root first, ending with the row):
    each row's cut, its tail (a view for a chain, else slots in the gather source `[prefix[low:length], region,
    zero]`), and the rows grouped by their head."""
    positions = [length + len(path) - 1 for path in paths]
    cuts = [head_end(p) for p in positions]
    low = min(min(cuts), length)
    branch = _placed_branch(paths)
    needed = length + max(map(len, paths))  # room for a commit of the deepest branch, placed or not
    # A chain (a decode step, a drafted chain): every row's keys lie in the buffer once the branch is written, from
    # the one cut on, so every tail is a view of the same TAIL positions, masked after the row.
    chain = len(set(cuts)) == 1 and all(path == branch[: len(path)] for path in paths)
    end = start + len(paths)
    index = [] if chain else [slot for path, p, cut in zip(paths, positions, cuts)
                              for slot in _tail_slots(length, low, length - low + end, path, p, cut)]
    return SplitPass(
        length, start, end,
        branch=slice(branch[0], branch[-1] + 1) if branch == list(range(branch[0], branch[-1] + 1)) else branch,
        needed=max(needed, cuts[0] + TAIL) if chain else needed, low=low, tail_start=cuts[0] if chain else None,
        tail_index=torch.tensor(index, device=device) if index else None,
        tail_mask=_tail_mask([p + 1 - cut for p, cut in zip(positions, cuts)], device),
        heads=_heads(length, paths, cuts, chain, device))


def _placed_branch(paths: list[list[int]]) -> list[int]:
    """The branch a pass writes after the prefix: later children first, as a depth-first walk would leave the
    buffer, so the first child's branch (a drafter's likeliest) is the one in place and a commit along it copies
    nothing."""
    return max(paths, key=lambda path: [-i for i in path])


def _tail_slots(length: int, low: int, zero: int, path: list[int], position: int, cut: int) -> list[int]:
    """A row's tail keys `[cut, position]` as slots of the gather source (prefix positions from `low`, then the
    region entries of its branch), padded to TAIL with the `zero` slot."""
    slots = [q - low if q < length else length - low + path[q - length] for q in range(cut, position + 1)]
    return slots + [zero] * (TAIL - len(slots))


def _tail_mask(valid: list[int], device: torch.device) -> torch.Tensor:
    """0 for each row's first `valid[r]` tail slots, -inf after -> [n, 1, 1, TAIL]."""
    mask = torch.zeros(len(valid), TAIL)
    for r, count in enumerate(valid):
        mask[r, count:] = float("-inf")
    return mask[:, None, None].to(device)


def _heads(length: int, paths: list[list[int]], cuts: list[int], chain: bool, device: torch.device) -> list[Head]:
    """The rows grouped by what their head holds: its cut and the region entries it reaches past the prefix
    (none for rows up to SPLIT_MARGIN deep, and none to gather for a chain, whose branch is in the buffer)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for r, (path, cut) in enumerate(zip(paths, cuts)):
        if cut:
            groups.setdefault((cut, *path[: max(0, cut - length)]), []).append(r)
    return [Head(cut, None if len(rows) == len(paths) else torch.tensor(rows, device=device), [] if chain else entries)
            for (cut, *entries), rows in groups.items()]


class SplitCache(KVCache):
    """`KVCache` with the region's own keys and values kept beside the buffer: a split pass writes one branch after
    the prefix (`placed`), so a commit of another copies the kept entries into place from here."""

    def __init__(self, num_layers: int) -> None:
        super().__init__(num_layers)
        self.region_keys: list[torch.Tensor | None] = [None] * num_layers  # [1, H_kv, S, d]
        self.region_values: list[torch.Tensor | None] = [None] * num_layers
        self.placed: list[int] = []  # region entries already at buffer positions length, length + 1, ...

    def add(self, layer: int, k: torch.Tensor, v: torch.Tensor, needed: int) -> None:
        """Append a forward's new keys/values [1, H_kv, n, d] to the region; make room for `needed` positions."""
        if self.region_keys[layer] is None:
            self.region_keys[layer], self.region_values[layer] = k, v
        else:
            self.region_keys[layer] = torch.cat([self.region_keys[layer], k], dim=2)
            self.region_values[layer] = torch.cat([self.region_values[layer], v], dim=2)
        self.reserve(layer, k, v, needed, self.length)

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
        self.region = 0
        self.placed = []


def split_attention(cache: SplitCache, plan: SplitPass, layer: int, query: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor, scaling: float | None) -> torch.Tensor:
    """query [1, H, n, d], key/value [1, H_kv, n, d] of the pass's rows -> [1, n, H, d]: the keys into the cache,
    then every row's tail in one call and each shared head in one call, merged."""
    cache.add(layer, key, value, plan.needed)
    cache.write(layer, plan.length, plan.branch)
    _, heads, n, d = query.shape
    kv_heads = key.shape[1]
    q = query[0].transpose(0, 1).reshape(n, kv_heads, heads // kv_heads, d)  # [n, H_kv, groups, d]: GQA groups
    tail_k, tail_v = _tails(cache, plan, layer, n)  # [n, H_kv, TAIL, d]
    mode = probes.attention_mode(q.dtype, q.shape[2], d)
    out, lse = _batched_flash(q, tail_k, tail_v, plan.tail_mask, scaling,
                              mode.batch_min_rows)  # [n, H_kv, groups, d], [n, H_kv, groups]
    for head in plan.heads:
        head_k, head_v = _head_keys(cache, plan, layer, head)  # [1, H_kv, keys, d]
        head_out, head_lse = _head_attention(q if head.rows is None else q[head.rows], head_k, head_v, scaling, mode)
        out = _merged(out, lse, head_out, head_lse, head.rows)
    return out.reshape(n, heads, d)[None]  # [1, n, H, d]


def _tails(cache: SplitCache, plan: SplitPass, layer: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row's tail keys and values [n, H_kv, TAIL, d]: a view of the buffer for a chain, else gathered."""
    keys, values = cache.keys[layer], cache.values[layer]  # [1, H_kv, capacity, d]
    if plan.tail_start is not None:
        window = slice(plan.tail_start, plan.tail_start + TAIL)
        return keys[:, :, window].expand(n, -1, -1, -1), values[:, :, window].expand(n, -1, -1, -1)
    return (_gathered(keys, cache.region_keys[layer], plan, n),
            _gathered(values, cache.region_values[layer], plan, n))


def _gathered(buffer: torch.Tensor, region: torch.Tensor, plan: SplitPass, n: int) -> torch.Tensor:
    """Each row's tail slots of `[buffer[low:length], region, zero]` -> [n, H_kv, TAIL, d]."""
    _, kv_heads, _, d = region.shape
    zero = region.new_zeros(1, kv_heads, 1, d)
    source = torch.cat([buffer[:, :, plan.low: plan.length], region, zero], dim=2)[0]  # [H_kv, slots, d]
    return source.index_select(1, plan.tail_index).view(kv_heads, n, TAIL, d).transpose(0, 1)


def _head_keys(cache: SplitCache, plan: SplitPass, layer: int, head: Head) -> tuple[torch.Tensor, torch.Tensor]:
    """A head's keys and values [1, H_kv, end, d]: views of the prefix, or for a row deeper than SPLIT_MARGIN, the
    prefix and the entries of its own branch the head runs into."""
    keys, values = cache.keys[layer], cache.values[layer]
    if not head.entries:
        return keys[:, :, : head.end], values[:, :, : head.end]
    index = torch.tensor(head.entries, device=keys.device)
    return (torch.cat([keys[:, :, : plan.length], cache.region_keys[layer].index_select(2, index)], dim=2),
            torch.cat([values[:, :, : plan.length], cache.region_values[layer].index_select(2, index)], dim=2))


def _merged(out: torch.Tensor, lse: torch.Tensor, head_out: torch.Tensor, head_lse: torch.Tensor,
            rows: torch.Tensor | None) -> torch.Tensor:
    """The tails' out [n, H_kv, groups, d] with a head's part merged into its rows (all where `rows` is None)."""
    tail_out, tail_lse = (out, lse) if rows is None else (out[rows], lse[rows])
    # The head's weight e^lse_h / (e^lse_h + e^lse_t) = 1 / (1 + e^(lse_t - lse_h)); torch.exp and division give
    # every element the same bits whatever its place in the tensor (torch.sigmoid does not).
    share = torch.exp(tail_lse - head_lse).add_(1).reciprocal_()[..., None]  # [count, H_kv, groups, 1]
    tail_out = tail_out.float()
    merged = torch.addcmul(tail_out, head_out.float() - tail_out, share)  # [count, H_kv, groups, d]
    return merged.to(out.dtype) if rows is None else out.index_copy(0, rows, merged.to(out.dtype))


_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # (out, log-sum-exp); no dropout, no causal


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
