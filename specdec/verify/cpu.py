"""The verifier's CPU backends: the plain backend's rounds, with the CPU's fast paths and, for the target, the bits
of decoding each branch alone.

- `CpuTreeLM`: the block layout (one masked call per layer), its linears packed once for oneDNN
  (`specdec.packed`) and, for a transformers Llama, its layers run by `llama_pass` with the projections that read
  one input fused. The Transformer drafter runs it (its `q` need not be row-invariant), and so does a target on a
  CPU whose packed linears fail the row-invariance probe.
- `RowInvariantTreeLM`: the same, attending in the split layout (`specdec.verify.split`), up to
  `MAX_INVARIANT_ROWS` rows a pass. With the projections and the output layer row-invariant too (packed linears,
  float32 or bfloat16, where this CPU passes `specdec.probes.linear_min_rows` for the model's shapes), a tree's
  logits equal those of decoding each branch alone, bit for bit, with no kernel call per row. Its prefill is the
  block layout's, as every backend's is.

`backend_for` picks one, once, when the `TreeLM` is made.
"""

from __future__ import annotations

import threading
import weakref

import torch
from transformers import PreTrainedModel

from specdec import probes
from specdec.packed import fuse, pack_linears
from specdec.probes import MAX_INVARIANT_ROWS, PACKED_DTYPES
from specdec.verify.base import Pass, TreeLM
from specdec.verify.split import SplitCache, SplitPass, plan_split, split_attention


def backend_for(model: PreTrainedModel, row_invariant: bool | None) -> type[TreeLM]:
    """The row-invariant backend where asked, or by default (None) where this CPU's packed linears of the model's
    dtype and shapes are row-invariant; else the block layout."""
    if row_invariant is None:
        row_invariant = probes.model_min_rows(model) is not None
    return RowInvariantTreeLM if row_invariant else CpuTreeLM


class CpuTreeLM(TreeLM):
    """The block layout on a CPU, with packed (and fused) linears and, for a transformers Llama, `llama_pass`."""

    def __init__(self, model: PreTrainedModel, head_ids: torch.Tensor | None = None,
                 row_invariant: bool | None = None) -> None:
        super().__init__(model, head_ids, row_invariant)
        self.direct = runs_direct(model)  # the pass loops over the layers itself (`llama_pass`)
        if self.dtype in PACKED_DTYPES:
            pack_linears(model, probes.model_min_rows(model) or 1)  # no-op where the loader packed them
            if self.direct:
                fuse_projections(model.base_model)

    def _layers(self, ids: torch.Tensor, positions: torch.Tensor, attend) -> torch.Tensor:
        if self.direct:
            return llama_pass(self.model.base_model, ids, positions, attend)
        return super()._layers(ids, positions, attend)


class RowInvariantTreeLM(CpuTreeLM):
    """`CpuTreeLM` attending in the split layout: every row gets the bits of decoding its branch alone."""

    row_invariant = True
    rows_per_pass = MAX_INVARIANT_ROWS  # more rows: the packed linears are not probed row-invariant
    Cache = SplitCache

    def _plan(self, start: int, end: int, prefill: bool) -> Pass | SplitPass:
        if prefill:
            return super()._plan(start, end, prefill)
        return plan_split(self.length, start, self.paths[start:end], self.device)

    def _pass(self, ids: torch.Tensor, positions: torch.Tensor, plan: Pass | SplitPass) -> torch.Tensor:
        self.cache.placed = []  # until the pass has run through: a failed one may have written part of the buffer
        h = super()._pass(ids, positions, plan)
        self.cache.placed = plan.placed
        return h

    def _attend(self, plan: Pass | SplitPass, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                scaling: float | None) -> torch.Tensor:
        if isinstance(plan, Pass):  # a prefill
            return super()._attend(plan, layer, q, k, v, scaling)
        return split_attention(self.cache, plan, layer, q, k, v, scaling)


def runs_direct(model: PreTrainedModel) -> bool:
    """Whether `llama_pass` can run `model`'s layers: a transformers Llama built of its own classes exactly (a
    subclass may change what a layer computes), on a CPU. Any other model goes through its own `forward`, with
    `tree_attention` as its attention."""
    from transformers.models.llama import modeling_llama as llama

    base = model.base_model
    return next(model.parameters()).device.type == "cpu" and type(base) is llama.LlamaModel and \
        type(base.norm) is llama.LlamaRMSNorm and type(base.rotary_emb) is llama.LlamaRotaryEmbedding and \
        all(type(layer) is llama.LlamaDecoderLayer and type(layer.self_attn) is llama.LlamaAttention and
            type(layer.mlp) is llama.LlamaMLP for layer in base.layers)


_FUSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a Llama -> its layers' (qkv, gate-up) or Nones
_FUSING = threading.Lock()


def fuse_projections(base: PreTrainedModel) -> None:
    """Fuse each layer's query, key and value projections and its gate and up projections (`specdec.packed.fuse`:
    where this CPU gives the fused outputs the same bits), once per model, for `llama_pass`."""
    with _FUSING:
        if base not in _FUSED:
            _FUSED[base] = [(fuse([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]),
                             fuse([layer.mlp.gate_proj, layer.mlp.up_proj])) for layer in base.layers]


def llama_pass(base: PreTrainedModel, ids: torch.Tensor, positions: torch.Tensor, attend) -> torch.Tensor:
    """`LlamaModel.forward` over ids [1, n] at `positions` [1, n], `attend(layer, q, k, v, scaling)` its attention
    -> last hidden [1, n, D].

    The same modules and functions in the same order as transformers' own forward, so the same bits (a test
    checks it), without what a general forward does around them on every call (argument checks, the causal mask
    that the verifier does not read, output capture), which on a CPU is a sizeable part of a decode step; and the
    projections that read one input multiplied as one (`fuse_projections`), where that keeps their bits.
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
        out = attend(attention.layer_idx, q, k, v, attention.scaling)  # [1, n, H, d]
        h = h + attention.o_proj(out.reshape(*ids.shape, -1).contiguous())
        x = layer.post_attention_layernorm(h)
        if gate_up:  # as LlamaMLP.forward
            gate, up = gate_up(x)
            h = h + mlp.down_proj(mlp.act_fn(gate) * up)
        else:
            h = h + mlp(x)
    return base.norm(h)
