"""A Mamba drafter that reads the target's own hidden state (`mamba-feat`).

The plug-in drafter (`specdec.drafters.mamba`) sees tokens only. This one also sees, at each position p, the
target's last hidden state `f` (after its final norm, the vector its output layer scores) of the position before:

    input_p  = W_in [norm(E x_p) ; norm(f_{p-1})]       E: the target's token embedding (not a copy: the target's)
    h_p      = Mamba layers (recurrent state s_p, fixed size)
    f̂_p      = W_out norm(h_p)                           a guess at the target's own f_p
    q_p      = softmax(f̂_p H_d^T)                        H_d: the target's output layer, draft-vocabulary rows

so the drafter predicts the target's feature and reuses the target's embedding and output layer: it ships only
W_in, the Mamba layers and W_out.

Which feature each step reads:
- the prompt and every accepted token: the target's real `f` of the position before. The verification pass
  computes `f` at every tree node anyway (`TreeLM.hidden`), so nothing extra runs on the target. At commit the
  drafter re-steps the accepted tokens with their real features (their drafted states had guessed ones) and then
  the target's correction/bonus token, the next root, with the last accepted node's real feature.
- drafted nodes: the target has not seen them yet, so a child reads its parent's guess f̂ instead. The drafter is
  trained for both (`specdec.distill.feat`: a second pass feeds its own detached guesses in place of real
  features at random positions).

Tree drafting is the plug-in drafter's batch-cache drafting unchanged: copy a parent's fixed-size state (and its
f̂) into one batch row per child, step a whole depth in one call; buffers are allocated once per generation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import MambaConfig
from transformers.models.mamba.modeling_mamba import MambaBlock, MambaRMSNorm

from specdec.drafters.base import Drafter, DraftTree, Sampler
from specdec.drafters.mamba import MambaStack, MambaState, deepest_stepped, draft_tree
from specdec.models import LoadedModel, ModelLoadError, drafter_folder
from specdec.packed import head_linear
from specdec.tree import TreeShape
from specdec.vocab import load_draft_vocab, scatter_head

MODEL_TYPE = "specdec-mamba-feat"


@dataclass
class FeatConfig:
    target_hidden: int  # D: the target's hidden size (its feature and embedding width)
    hidden: int = 256  # d: the Mamba layers' width
    layers: int = 4
    state_size: int = 16
    expand: int = 2
    conv_kernel: int = 4

    def mamba_config(self) -> MambaConfig:
        return MambaConfig(vocab_size=1, hidden_size=self.hidden, state_size=self.state_size,
                           num_hidden_layers=self.layers, expand=self.expand, conv_kernel=self.conv_kernel,
                           use_mambapy=True, residual_in_fp32=True)


class MambaFeatModel(nn.Module):
    """The drafter's own weights: W_in (with the two input norms), the Mamba layers, the final norm and W_out."""

    def __init__(self, config: FeatConfig) -> None:
        super().__init__()
        self.config = config
        mamba = config.mamba_config()
        D, d = config.target_hidden, config.hidden
        self.norm_token = MambaRMSNorm(D)
        self.norm_feature = MambaRMSNorm(D)
        self.w_in = nn.Linear(2 * D, d, bias=False)
        self.layers = nn.ModuleList(MambaBlock(mamba, layer_idx=i) for i in range(config.layers))
        self.norm_f = MambaRMSNorm(d)
        self.w_out = nn.Linear(d, D, bias=False)
        for block in self.layers:  # what transformers' `_init_weights` does for a Mamba mixer (S4D-real A, D = 1, Δ)
            block.mixer.init_mamba_weights()
            with torch.no_grad():
                if block.mixer.conv1d.bias is not None:
                    block.mixer.conv1d.bias.zero_()
                block.mixer.out_proj.weight /= config.layers ** 0.5
        nn.init.zeros_(self.w_out.weight)  # a fresh drafter guesses f̂ = 0: q starts uniform, not confidently wrong

    @property
    def dtype(self) -> torch.dtype:
        return self.w_in.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.w_in.weight.device

    def fuse(self, token_emb: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
        """[..., D] embedding of x_p and [..., D] feature of p-1 -> the first layer's input [..., d]."""
        x = torch.cat([self.norm_token(token_emb.to(self.dtype)), self.norm_feature(feature.to(self.dtype))], -1)
        return self.w_in(x)

    def read_out(self, h: torch.Tensor) -> torch.Tensor:
        """Last layer's output [..., d] -> f̂ [..., D]."""
        return self.w_out(self.norm_f(h.to(self.dtype)))

    # --- saving and loading (no transformers model class: the folder is not a stand-alone LM) --------------
    def save(self, folder: Path, draft_ids: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps({"model_type": MODEL_TYPE, **asdict(self.config)}, indent=1))
        save_file({k: v.detach().to(dtype).contiguous() for k, v in self.state_dict().items()},
                  str(folder / "model.safetensors"))
        (folder / "draft_vocab.json").write_text(json.dumps({"token_ids": draft_ids.tolist()}))

    @classmethod
    def load(cls, folder: Path) -> MambaFeatModel:
        config = json.loads((Path(folder) / "config.json").read_text())
        if config.pop("model_type", None) != MODEL_TYPE:
            raise ValueError(f"{folder} does not hold a {MODEL_TYPE} drafter")
        model = cls(FeatConfig(**config))
        model.load_state_dict({k: v.float() for k, v in load_file(str(Path(folder) / "model.safetensors")).items()})
        return model.eval()


def is_feat_folder(folder: str | Path) -> bool:
    path = Path(folder) / "config.json"
    try:
        return path.is_file() and json.loads(path.read_text()).get("model_type") == MODEL_TYPE
    except ValueError:
        return False


class MambaFeatDrafter(Drafter):
    name = "mamba-feat"
    reads_target = True

    def __init__(self, model: MambaFeatModel, target, head_ids: torch.Tensor | None = None) -> None:
        """`target`: the target's Hugging Face model (its embedding and output layer are read, never copied whole);
        `head_ids`: the draft vocabulary (default: all of the target's)."""
        self.model = model
        self.device = model.device
        embedding = target.get_input_embeddings()
        if embedding.embedding_dim != model.config.target_hidden:
            raise ValueError(f"this drafter reads features of width {model.config.target_hidden}, the target's are "
                             f"{embedding.embedding_dim}")
        head = target.get_output_embeddings().weight  # [V, D]
        self.vocab_size = head.shape[0]
        head_ids = torch.arange(self.vocab_size) if head_ids is None else head_ids
        if int(head_ids.max()) >= self.vocab_size:
            raise ValueError("draft_vocab.json names token ids beyond the target's vocabulary")
        self.embedding = embedding
        self.head_ids = head_ids.to(self.device)
        self.head = head_linear(head.detach()[self.head_ids].to(model.dtype))  # [H, D]: the draft vocabulary's rows
        self.zero_feature = torch.zeros(model.config.target_hidden, device=self.device)
        self.stack = MambaStack(model.layers, model.config.state_size, model.config.conv_kernel)

    @staticmethod
    def load(spec: str, device: torch.device, dtype: torch.dtype, target: LoadedModel) -> LoadedModel:
        return load_feat_drafter(spec, device, dtype, target)

    @classmethod
    def build(cls, loaded: LoadedModel, target: LoadedModel, cuda_graphs: bool | None = None) -> MambaFeatDrafter:
        return cls(loaded.model, target.model, load_draft_vocab(loaded.source))

    # --- one batched step -------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, features: torch.Tensor, state: MambaState,
             logits: bool = True) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Feed tokens [B] with the features [B, D] of their previous positions to B rows of `state` (in place).

        Returns (f̂ [B, D], logits [B, V] over the target's vocabulary, -inf outside the draft head) or None.
        """
        h = self.stack.step(self.model.fuse(self.embedding(tokens), features), state)  # [B, d]
        if not logits:
            return None
        guess = self.model.read_out(h)  # [B, D]
        scores = self.head(guess.to(self.head.weight.dtype)).float()  # [B, H]
        return guess, scores_to_logits(scores, self.head_ids, self.vocab_size)

    @torch.inference_mode()
    def prefill(self, context: list[int], features: torch.Tensor | None) -> tuple[MambaState, torch.Tensor,
                                                                                   torch.Tensor]:
        """Run the prompt from a zero state; `features` [P-1, D] are the target's at positions 0..P-2.

        -> (state of 1 row, f̂ of the last prompt token [D], logits [V]).
        """
        ids = torch.tensor(context, device=self.device)
        previous = torch.zeros(len(context), self.model.config.target_hidden, device=self.device)
        if features is not None and len(features):
            previous[1: len(features) + 1] = features[: len(context) - 1].to(previous.device)
        h, state = self.stack.sequence(self.model.fuse(self.embedding(ids), previous)[None])  # [1, P, d]
        guess = self.model.read_out(h[0, -1])
        scores = self.head(guess.to(self.head.weight.dtype)).float()
        return state, guess, scores_to_logits(scores, self.head_ids, self.vocab_size)

    # --- the Drafter interface ----------------------------------------------------------------------------
    def start(self, context: list[int], max_nodes: int, features: torch.Tensor | None = None) -> None:
        root_state, root_guess, self.root_logits = self.prefill(context, features)
        self.buffers = self.stack.zeros(max_nodes + 1, self.device)
        self.guesses = torch.zeros(max_nodes + 1, self.model.config.target_hidden, dtype=self.model.dtype,
                                   device=self.device)
        self.buffers.write(torch.tensor([0], device=self.device), root_state)
        self.guesses[0] = root_guess
        self.root, self.tokens = context[-1], [context[-1]]

    def draft(self, shape: TreeShape, sampler: Sampler) -> DraftTree:
        def step_level(kids, parent_rows, rows, state):  # a child reads its parent's guess of the target's feature
            self.guesses[rows], logits = self.step(kids, self.guesses[parent_rows], state)
            return logits

        tree, self.tokens, self.stepped = draft_tree(self.root, self.root_logits, self.buffers, shape, sampler,
                                                        self.vocab_size, step_level)
        return tree

    def commit(self, path: list[int], next_token: int, unseen: Sequence[int] = (),
               features: torch.Tensor | None = None) -> None:
        """`features` [len(path) + len(unseen), D]: the target's features at the root, the accepted nodes, then
        the unseen tokens, in order. Without them (a caller that has none) the drafted states are kept."""
        accepted = [self.tokens[node] for node in path[1:]] + list(unseen)
        if features is None:  # fall back to the drafted states, as the plug-in drafter does
            last, unfed = deepest_stepped(path, self.stepped, self.tokens)
            state = self.buffers.select(torch.tensor([last], device=self.device))
            previous = self.guesses[last]
            for token in [*unfed, *unseen]:
                previous = self.step(torch.tensor([token], device=self.device), previous[None], state)[0][0]
            feature = previous
        else:
            if len(features) != len(accepted) + 1:
                raise ValueError(f"{len(accepted) + 1} accepted positions but {len(features)} features")
            state = self.buffers.select(torch.tensor([0], device=self.device))  # the root's state: real features
            for token, feature in zip(accepted, features[:-1]):
                self.step(torch.tensor([token], device=self.device), feature[None], state, logits=False)
            feature = features[-1]
        guess, logits = self.step(torch.tensor([next_token], device=self.device), feature[None], state)
        self.buffers.write(torch.tensor([0], device=self.device), state)
        self.guesses[0] = guess[0]
        self.root, self.root_logits, self.tokens = next_token, logits[0], [next_token]

    def state_bytes(self) -> int:
        return self.buffers.nbytes + self.guesses.nbytes


def scores_to_logits(scores: torch.Tensor, head_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    return scatter_head(scores, head_ids, vocab_size)


def load_feat_drafter(spec: str, device: torch.device, dtype: torch.dtype, target: LoadedModel) -> LoadedModel:
    """A `mamba-feat` drafter from a preset, a local folder or a hub id; it must have been trained on `target`'s
    features (same hidden size, draft ids inside its vocabulary)."""
    folder = drafter_folder(spec, "mamba-feat")
    if not is_feat_folder(folder):
        raise ModelLoadError(f"{spec!r} is not a mamba-feat drafter (its config.json has another model_type); "
                             "train one with `python -m specdec.distill train --arch mamba-feat`")
    try:
        model = MambaFeatModel.load(folder)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise ModelLoadError(f"could not load drafter {spec!r}: {str(err).strip().splitlines()[0]}") from err
    if model.config.target_hidden != target.model.config.hidden_size:
        raise ModelLoadError(f"drafter {spec!r} reads features of width {model.config.target_hidden}, but target "
                             f"{target.name!r} has hidden size {target.model.config.hidden_size}")
    return LoadedModel(spec, model.to(device=device, dtype=dtype), None, str(folder))
