"""Mamba drafter with batch-cache tree drafting (docs/method.md, "1. Draft a tree").

Glossary (Mamba paper / mamba-minimal):
    B       batch rows (one per tree node being stepped)
    d       model width (hidden_size)         d_in  inner width (expand * d)
    K       conv kernel width                 N     SSM state size
    s_t     the per-layer state: conv window [d_in, K] and SSM state [d_in, N] (`specdec.drafters.mixer`)

The whole context of a sequence is its state `s_t`, so a tree is drafted by copying the parent's state into
one batch row per child and stepping every node of a depth in one batched call. The state of every drafted
node is kept in buffers allocated once per generation (row 0 is the root), so catching up after
verification is a row selection plus the tokens the drafter has not fed yet: an accepted leaf and the target's
correction/bonus token. The drafter feeds them when it next drafts, not at commit: a round that drafts nothing
(the bandit's arm "0", where drafting does not pay) then costs what a plain target step costs, and the tokens of
several such rounds are fed in one sequence pass from the kept state (`mixer_sequence`) when drafting resumes;
the prompt is read the same way, from a zero state.

Each layer's mixer steps with `specdec.drafters.mixer.mixer_step_ref`, in readable PyTorch; on CUDA, when
`mamba_ssm` and `causal_conv1d` import, with its twin `mixer_step_kernel`, which runs their fused single-step
kernels (tests check the two agree where a GPU exists). On CUDA the step is replayed from CUDA graphs, one per
batch size (`specdec.drafters.cuda_graph`); `step_eager` is the reference, and `cuda_graphs=False` or
SPECDEC_CUDA_GRAPHS=0 turns the graphs off.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import MambaForCausalLM

from specdec.drafters.base import Drafter, DraftTree, Sampler, TreeBuilder
from specdec.drafters.cuda_graph import graphs_enabled, shared_graphs
from specdec.drafters.mixer import (kernels_available, mixer_sequence, mixer_step_kernel, mixer_step_ref,
                                    mixer_weights, rms_norm)
from specdec.models import LoadedModel, load_drafter_model
from specdec.packed import head_linear
from specdec.tree import TreeShape
from specdec.vocab import fit_vocab, load_draft_vocab, scatter_head

FEED_STEPS = 2  # `MambaDrafter.feed` steps up to this many tokens one by one, and runs longer runs as a sequence


@dataclass
class MambaState:
    """Per-layer states of B rows: conv [L, B, d_in, K] and ssm [L, B, d_in, N], float32."""

    conv: torch.Tensor
    ssm: torch.Tensor

    @classmethod
    def empty(cls, layers: int, rows: int, d_in: int, kernel: int, size: int, device: torch.device) -> MambaState:
        """Zero states of `rows` rows."""
        return cls(torch.zeros(layers, rows, d_in, kernel, device=device),
                   torch.zeros(layers, rows, d_in, size, device=device))

    @classmethod
    def zeros(cls, model: MambaForCausalLM, rows: int) -> MambaState:
        """Zero states of `rows` rows for a Hugging Face Mamba LM."""
        cfg = model.config
        return cls.empty(cfg.num_hidden_layers, rows, cfg.intermediate_size, cfg.conv_kernel, cfg.state_size,
                         model.device)

    def select(self, rows: torch.Tensor) -> MambaState:
        return MambaState(self.conv[:, rows], self.ssm[:, rows])  # copies

    def write(self, rows: torch.Tensor, other: MambaState) -> None:
        self.conv[:, rows] = other.conv
        self.ssm[:, rows] = other.ssm

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes


class MambaStack:
    """A drafter's Mamba blocks as its steps read them (per layer: the norm, the mixer's weights, whether the
    residual is kept in float32), shared by the plug-in and the feature drafter: state buffers, a batched step of
    one token per row, and a sequence pass from a kept state or from zero."""

    def __init__(self, blocks: Sequence[torch.nn.Module], state_size: int, conv_kernel: int) -> None:
        self.blocks = list(blocks)
        self.layers = [(b.norm.weight, b.norm.variance_epsilon, mixer_weights(b.mixer)) for b in self.blocks]
        self.fp32_residual = [b.residual_in_fp32 for b in self.blocks]
        self.state_shape = (self.blocks[0].mixer.intermediate_size, conv_kernel, state_size)  # d_in, K, N

    def zeros(self, rows: int, device: torch.device) -> MambaState:
        return MambaState.empty(len(self.blocks), rows, *self.state_shape, device)

    def step(self, h: torch.Tensor, state: MambaState, mixer_step: Callable = mixer_step_ref) -> torch.Tensor:
        """h [B, d], one token per row, through every layer (as MambaBlock.forward); the B rows of `state` are
        stepped in place -> the last layer's output [B, d]."""
        for layer, (norm, eps, weights) in enumerate(self.layers):
            x = rms_norm(h, norm, eps)
            residual = h.float() if self.fp32_residual[layer] else h
            h = residual + mixer_step(weights, x, state.conv[layer], state.ssm[layer])
        return h

    def sequence(self, h: torch.Tensor, state: MambaState | None = None) -> tuple[torch.Tensor, MambaState]:
        """h [1, l, d], a sequence, through every layer from `state` (one row, updated in place) or from zero (a new
        state) -> (the last layer's outputs [1, l, d], the state after the last token)."""
        conv, ssm = [], []
        for layer, block in enumerate(self.blocks):
            x = block.norm(h.to(block.norm.weight.dtype))
            residual = h.float() if block.residual_in_fp32 else h
            kept = None if state is None else (state.conv[layer], state.ssm[layer])
            out, (window, s) = mixer_sequence(block.mixer, x, state=kept)
            if state is None:
                conv.append(window)
                ssm.append(s)
            else:
                state.conv[layer].copy_(window)
                state.ssm[layer].copy_(s)
            h = residual + out
        return h, MambaState(torch.stack(conv), torch.stack(ssm)) if state is None else state


def draft_tree(root: int, root_logits: torch.Tensor, buffers: MambaState, shape: TreeShape, sampler: Sampler,
               vocab_size: int, step_level: Callable) -> tuple[DraftTree, list[int], set[int]]:
    """Batch-cache tree drafting, shared by both Mamba drafters: per depth, copy each parent's state (row of
    `buffers`) once per child and step the children to be expanded in one call; leaves are not stepped (a commit
    steps the one it accepts). `step_level(kids [B], parent_rows [B], rows [B], state)` steps the copied rows in
    place and returns the new nodes' logits [B, V]. -> (tree, its node tokens, the nodes with a state row)."""
    builder = TreeBuilder(root, sampler)
    stepped = {0}  # the root's state is row 0
    frontier, frontier_logits = [0], root_logits  # [1, V] (None for the root alone: not computed yet)
    for depth, width in enumerate(shape.widths):
        kids, q = sampler.children(frontier_logits.view(len(frontier), -1), width)  # [m, width], [m, V]
        frontier = builder.add_level(frontier, kids, q, last=depth == shape.depth - 1)
        if not frontier:
            break
        device = root_logits.device
        rows = torch.tensor(frontier, device=device)
        parent_rows = torch.tensor([builder.parents[node] for node in frontier], device=device)
        state = buffers.select(parent_rows)  # copy each parent's state once per child
        frontier_logits = step_level(torch.tensor([builder.tokens[node] for node in frontier], device=device),
                                     parent_rows, rows, state)
        buffers.write(rows, state)
        stepped.update(frontier)
    return builder.build(shape, vocab_size), builder.tokens, stepped


def deepest_stepped(path: list[int], stepped: set[int], tokens: list[int]) -> tuple[int, list[int]]:
    """An accepted path -> (its deepest node with a stored state, the accepted tokens after it): an accepted leaf
    was never stepped, so its parent's state and the leaf's token."""
    if path[-1] not in stepped:
        return path[-2], [tokens[path[-1]]]
    return path[-1], []


class MambaDrafter(Drafter):
    name = "mamba"

    def __init__(self, model: MambaForCausalLM, vocab_size: int, head_ids: torch.Tensor | None = None,
                 use_kernels: bool | None = None, cuda_graphs: bool | None = None) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.device = model.device
        if model.config.hidden_act != "silu":
            raise ValueError("the Mamba drafter step supports the silu activation only")
        self.mixer_step = mixer_step_kernel if (kernels_available(self.device) if use_kernels is None
                                                else use_kernels) else mixer_step_ref
        backbone = model.backbone
        self.stack = MambaStack(backbone.layers, model.config.state_size, model.config.conv_kernel)
        self.norm_f = (backbone.norm_f.weight, backbone.norm_f.variance_epsilon)
        weight = model.get_output_embeddings().weight  # [V_d, d]
        if head_ids is not None and int(head_ids.max()) >= min(len(weight), vocab_size):
            raise ValueError("draft_vocab.json names token ids beyond the drafter's or the target's vocabulary")
        self.max_input_id = model.get_input_embeddings().num_embeddings - 1
        self.head_ids = head_ids.to(self.device) if head_ids is not None else None
        self.head = head_linear(weight[self.head_ids] if head_ids is not None else weight)  # reduced draft head
        self.graphs = None  # CUDA graphs of `step_eager`, shared with other drafters of the same model and head
        if graphs_enabled(self.device, cuda_graphs):
            head_key = tuple(self.head_ids.tolist()) if self.head_ids is not None else None
            self.graphs = shared_graphs(model, (vocab_size, head_key, self.mixer_step), self.step_eager)

    @classmethod
    def from_folder(cls, model: MambaForCausalLM, vocab_size: int, folder: str | None,
                    cuda_graphs: bool | None = None) -> MambaDrafter:
        """Use `draft_vocab.json` beside the weights, when present, as the draft head."""
        return cls(model, vocab_size, load_draft_vocab(folder), cuda_graphs=cuda_graphs)

    @staticmethod
    def load(spec: str, device: torch.device, dtype: torch.dtype, target: LoadedModel) -> LoadedModel:
        return load_drafter_model(spec, device, dtype, target, model_type="mamba")

    @classmethod
    def build(cls, loaded: LoadedModel, target: LoadedModel, cuda_graphs: bool | None = None) -> MambaDrafter:
        return cls.from_folder(loaded.model, target.vocab_size, loaded.source, cuda_graphs)

    # --- the batched step -------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, state: MambaState, logits: bool = True) -> torch.Tensor | None:
        """Feed tokens [B] to B rows of `state` (updated in place). Returns logits [B, V] (target width) or None."""
        if self.graphs is not None:
            return self.graphs(tokens, state, logits)
        return self.step_eager(tokens, state, logits)

    @torch.inference_mode()
    def step_eager(self, tokens: torch.Tensor, state: MambaState, logits: bool = True) -> torch.Tensor | None:
        """`step` in plain PyTorch, kernel by kernel: the reference the CUDA graphs record and are checked against."""
        # a target token the drafter has no embedding for only makes drafting worse, never inexact
        h = self.model.backbone.embeddings(tokens.clamp_max(self.max_input_id))  # [B, d]
        h = self.stack.step(h, state, self.mixer_step)
        return self._logits(h) if logits else None

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """The last layer's output h [B, d] -> logits [B, V] (target width)."""
        h = rms_norm(h, *self.norm_f).to(self.head.weight.dtype)
        scores = self.head(h).float()  # [B, V_head]
        if self.head_ids is not None:
            return scatter_head(scores, self.head_ids, self.vocab_size)
        return fit_vocab(scores, self.vocab_size)

    @torch.inference_mode()
    def feed(self, tokens: list[int], state: MambaState) -> torch.Tensor:
        """Feed a sequence of tokens to one row of `state` (updated in place) -> the last token's logits [V]: a step
        a token for up to `FEED_STEPS` tokens, else one sequence pass of every layer from the state
        (`mixer_sequence`), whose fixed cost pays from three tokens on."""
        if len(tokens) <= FEED_STEPS:
            for token in tokens[:-1]:
                self.step(torch.tensor([token], device=self.device), state, logits=False)
            return self.step(torch.tensor(tokens[-1:], device=self.device), state)[0]
        ids = torch.tensor([tokens], device=self.device).clamp_max(self.max_input_id)
        h, _ = self.stack.sequence(self.model.backbone.embeddings(ids), state)  # [1, l, d]
        return self._logits(h[:, -1])[0]

    @torch.inference_mode()
    def prefill(self, context: list[int]) -> tuple[MambaState, torch.Tensor]:
        """Run the prompt from a zero state (`feed`: one sequence pass of every layer) -> (state of 1 row, logits
        [V])."""
        state = self.stack.zeros(1, self.device)
        return state, self.feed(context, state)

    # --- the Drafter interface ----------------------------------------------------------------------------
    def start(self, context: list[int], max_nodes: int, features: torch.Tensor | None = None) -> None:
        """Read the prompt's last `prefill_window` tokens from a zero state."""
        root_state, self.root_logits = self.prefill(context[-self.prefill_window:])
        self.buffers = self.stack.zeros(max_nodes + 1, self.device)  # row i = state after node i's token
        self.buffers.write(torch.tensor([0], device=self.device), root_state)
        self.root = context[-1]
        self.unfed: list[int] = []  # accepted tokens row 0's state has not seen, the root last (empty: up to date)

    def draft(self, shape: TreeShape, sampler: Sampler) -> DraftTree:
        if shape.depth:
            self.catch_up()
        tree, self.tree_tokens, self.stepped = draft_tree(  # depth 0: the root alone, no logits needed
            self.root, self.root_logits, self.buffers, shape, sampler, self.vocab_size,
            lambda kids, parent_rows, rows, state: self.step(kids, state))
        return tree

    def catch_up(self) -> None:
        """Feed row 0 the accepted tokens it has not seen (`unfed`); the root's logits follow from it."""
        if self.unfed:
            root = MambaState(self.buffers.conv[:, :1], self.buffers.ssm[:, :1])  # row 0 itself, fed in place
            self.root_logits = self.feed(self.unfed, root)
            self.unfed = []

    def commit(self, path: list[int], next_token: int, unseen: Sequence[int] = (),
               features: torch.Tensor | None = None) -> None:
        """Keep the deepest stepped node's state in row 0 and note the accepted tokens it has not fed; they are fed
        when the drafter next drafts (`catch_up`)."""
        if self.unfed:  # the round drafted nothing: row 0 is still the state before `unfed`
            self.unfed += [*unseen, next_token]
        else:
            last, unfed = deepest_stepped(path, self.stepped, self.tree_tokens)
            if last:
                self.buffers.write(torch.tensor([0], device=self.device),
                                   self.buffers.select(torch.tensor([last], device=self.device)))
            self.unfed = [*unfed, *unseen, next_token]  # accepted tokens this drafter never stepped, the root
        self.root, self.root_logits = next_token, None

    def state_bytes(self) -> int:
        return self.buffers.nbytes
