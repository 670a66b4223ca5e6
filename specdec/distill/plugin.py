"""The plug-in recipes (`--arch mamba`, `--arch transformer`): a small LM of its own that reads tokens only.

The drafter is a Mamba or a Llama-style Transformer with a tied embedding, initialised from an SVD projection of
the target's `E`, trained on H(p, q) over its draft vocabulary V_d (`specdec.distill.recipe`), and saved as a
Hugging Face folder with `draft_vocab.json`, its embedding as int8 rows (`specdec.models.save_int8_embedding`;
`specdec.models.read_folder_model` loads it).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn
from transformers import (AutoConfig, LlamaConfig, LlamaForCausalLM, MambaConfig, MambaForCausalLM, PreTrainedModel,
                          PreTrainedTokenizerBase)
from transformers.models.llama.modeling_llama import LlamaDecoderLayer
from transformers.models.mamba.modeling_mamba import MambaBlock

from specdec.distill.recipe import Answer, Recipe, TrainConfig, choose_draft_vocab, distill_loss, vocab_lut
from specdec.distill.teacher import Shard
from specdec.drafters.mamba import MambaDrafter
from specdec.drafters.mixer import blocks_forward
from specdec.verify import TreeLM
from specdec.models import LoadedModel, read_folder_model, save_int8_embedding
from specdec.vocab import load_draft_vocab


def build_drafter(config: TrainConfig, vocab_size: int) -> PreTrainedModel:
    """A small Mamba or Llama-style drafter with a tied embedding; the two have comparable parameter counts."""
    if config.arch == "mamba":
        return MambaForCausalLM(MambaConfig(vocab_size=vocab_size, hidden_size=config.hidden,
                                            state_size=config.state_size,
                                            num_hidden_layers=config.mamba_layers, expand=2, conv_kernel=4,
                                            use_mambapy=True, tie_word_embeddings=True, bos_token_id=1,
                                            eos_token_id=2, pad_token_id=2))
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, hidden_size=config.hidden,
                                        intermediate_size=2 * config.hidden, num_hidden_layers=config.tf_layers,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                                        rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1,
                                        eos_token_id=2, pad_token_id=2))


def grow_layers(model: PreTrainedModel, extra: int) -> None:
    """Append `extra` layers to a Mamba or Llama-style drafter, each starting as the identity (its residual
    branch's output projection zero): the grown drafter computes what it did, and the new layers learn from
    there (`train --init FOLDER --grow-layers N`)."""
    layers = model.backbone.layers if model.config.model_type == "mamba" else model.model.layers
    first = len(layers)
    model.config.num_hidden_layers = first + extra
    reference = next(model.parameters())
    for index in range(first, first + extra):
        if model.config.model_type == "mamba":
            block = MambaBlock(model.config, layer_idx=index)
            block.mixer.init_mamba_weights()  # what transformers' `_init_weights` does for a mixer (A, D, Δ)
            outputs = [block.mixer.out_proj]
        else:
            block = LlamaDecoderLayer(model.config, layer_idx=index)
            outputs = [block.self_attn.o_proj, block.mlp.down_proj]
        with torch.no_grad():
            for linear in outputs:
                linear.weight.zero_()
        layers.append(block.to(reference.device, reference.dtype))


def grow_state(model: MambaForCausalLM, size: int, std: float = 0.02, seed: int = 0) -> None:
    """Widen every Mamba layer's SSM state from N to `size` channels (`train --init FOLDER --grow-state SIZE`).

    The new channels get the decay rates a fresh mixer would give channels N+1..size (A = -(N+1), ..., -size), a
    small random input projection B and a zero read-out C, so the widened drafter computes exactly what it did
    (its outputs read no new channel) while the new channels already carry the input: the gradient of C reads
    their states, and they learn from there. x_proj's rows are [Δ (R), B (N), C (N)]; each block grows in place.
    """
    old = model.config.state_size
    if size <= old:
        raise ValueError(f"--grow-state {size}: the drafter's state already has {old} channels")
    generator = torch.Generator().manual_seed(seed)
    model.config.state_size = size
    for block in model.backbone.layers:
        mixer = block.mixer
        rank, weight = mixer.time_step_rank, mixer.x_proj.weight.data  # [R + 2N, d_in]
        dt_rows, b_rows, c_rows = weight.split([rank, old, old])
        new_b = torch.randn(size - old, weight.shape[1], generator=generator).to(weight) * std
        x_proj = nn.Linear(weight.shape[1], rank + 2 * size, bias=False).to(weight)
        x_proj.weight.data.copy_(torch.cat([dt_rows, b_rows, new_b, c_rows, c_rows.new_zeros(size - old, c_rows.shape[1])]))
        channels = torch.arange(old + 1, size + 1, dtype=mixer.A_log.dtype, device=mixer.A_log.device)
        new_a = channels.log().expand(mixer.A_log.shape[0], -1)
        mixer.x_proj, mixer.ssm_state_size = x_proj, size
        mixer.A_log = nn.Parameter(torch.cat([mixer.A_log.data, new_a], dim=1))


def project_embedding(target_embedding: torch.Tensor, dim: int, std: float = 0.02) -> torch.Tensor:
    """E V_dim: the target's [V, D] embedding on its top-`dim` right singular vectors, [V, dim], scaled to `std`.

    The geometry (which tokens are close) is the target's; the scale is a fresh model's, so the tied output
    head starts near uniform instead of confidently wrong.
    """
    weight = target_embedding.float()
    _, _, vh = torch.linalg.svd(weight, full_matrices=False)  # vh [D, D]
    projected = weight @ vh[:dim].T  # [V, dim]
    return projected * (std / projected.std())


def mamba_hidden(model: MambaForCausalLM, input_ids: torch.Tensor) -> torch.Tensor:
    """Final hidden states [b, l, d] of a Mamba LM, as `model.backbone` computes them but trainable on a CPU."""
    backbone = model.backbone
    return backbone.norm_f(blocks_forward(backbone.layers, backbone.embeddings(input_ids)))


def final_hidden(model: PreTrainedModel, input_ids: torch.Tensor) -> torch.Tensor:
    """The drafter's last hidden state, [B, L, d]."""
    if model.config.model_type == "mamba":
        return mamba_hidden(model, input_ids)
    return model.base_model(input_ids=input_ids).last_hidden_state


def draft_logits(model: PreTrainedModel, input_ids: torch.Tensor, draft_ids: torch.Tensor) -> torch.Tensor:
    """Drafter logits over V_d only: final hidden state times the V_d rows of the tied embedding, [B, L, |V_d|]."""
    head = model.get_output_embeddings().weight[draft_ids]  # [|V_d|, d]
    return final_hidden(model, input_ids) @ head.T


def answer_scores(model: PreTrainedModel, shards: list[Shard],
                  draft_ids: torch.Tensor | None) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per answer of teacher shards, at each position whose next token is an answer token: (the drafter's logits
    over V_d [n, |V_d|], the slots in V_d of the target's stored top-k [n, k] (-1 outside V_d), their log-probs
    [n, k]). The drafter reads the answer from a zero state, with its prompt. `draft_ids` None: every token."""
    if draft_ids is None:
        draft_ids = torch.arange(model.config.vocab_size)
    lut = vocab_lut(draft_ids, model.config.vocab_size)
    for shard in shards:
        starts = shard["starts"].tolist()
        for a, b in zip(starts[:-1], starts[1:]):
            drafted = shard["label"][a:b][:-1].nonzero()[:, 0]  # positions whose next token is an answer token
            if len(drafted):
                tokens = shard["tokens"][a:b].long()[:int(drafted[-1]) + 1]
                yield (draft_logits(model, tokens[None], draft_ids)[0, drafted].float(),
                       lut[shard["topk_ids"][a:b][drafted].long()], shard["topk_logp"][a:b][drafted].float())


GUESS_BLOCK = 512  # positions scored at once by `draft_argmax`


def draft_argmax(model: PreTrainedModel, input_ids: torch.Tensor, draft_ids: torch.Tensor) -> torch.Tensor:
    """The drafter's greedy guess at every position, [B, L] token ids: `draft_logits`' argmax, scored a block of
    positions at a time, so a batch of long documents never holds its logits whole (with the full head, 8
    rows of 8k tokens would be 13 GB)."""
    hidden = final_hidden(model, input_ids)  # [B, L, d]
    head = model.get_output_embeddings().weight[draft_ids]  # [|V_d|, d]
    best = torch.cat([(hidden[:, i:i + GUESS_BLOCK] @ head.T).argmax(-1)
                      for i in range(0, hidden.shape[1], GUESS_BLOCK)], dim=1)
    return draft_ids[best]


def save_drafter(model: PreTrainedModel, draft_ids: torch.Tensor, tokenizer: PreTrainedTokenizerBase | None,
                 folder: Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the drafter in `dtype` (bf16 halves the folder; the engine casts to its run dtype) with its
    embedding as int8 rows (half again of what is most of a small drafter), the tokenizer when given (its
    `tokenizer.json` as compact JSON), and `draft_vocab.json` when the head scores fewer than all of the
    drafter's tokens."""
    folder.mkdir(parents=True, exist_ok=True)
    saved = copy.deepcopy(model).to(dtype)  # the caller's model keeps its precision
    saved.save_pretrained(folder)
    save_int8_embedding(saved, folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
        if hasattr(tokenizer, "backend_tokenizer"):  # a fast tokenizer: one line of JSON, not indented
            tokenizer.backend_tokenizer.save(str(folder / "tokenizer.json"), pretty=False)
    if len(draft_ids) < model.config.vocab_size:
        (folder / "draft_vocab.json").write_text(json.dumps({"token_ids": draft_ids.tolist()}, separators=(",", ":")))
    return folder


@torch.inference_mode()
def decode_step(model: PreTrainedModel, folder: Path | None, context: list[int]) -> Callable[[], object]:
    """One batch-1 decode step after `context`: the engine's Mamba step (its head from `folder`'s
    `draft_vocab.json`), or a KV-cached forward of one token."""
    if model.config.model_type == "mamba":
        drafter = MambaDrafter.from_folder(model, model.config.vocab_size, str(folder) if folder else None)
        state, token = drafter.stack.zeros(1, drafter.device), torch.tensor([context[-1]])
        return lambda: drafter.step(token, state)
    lm = TreeLM(model)
    lm.feed(context)
    return lambda: lm.feed([context[-1]])


class PlugIn(Recipe):
    eval_batch = 16
    pad_id = 2  # right padding of held-out answers (the target's end of text); it never reaches earlier positions
    acceptance_headers = ("held-out acceptance", "per domain")

    def __init__(self, kind: str, target_embedding: torch.Tensor | None = None) -> None:
        """`target_embedding`: the target's E, which initialises a fresh run's embedding (random without it)."""
        self.kind, self.target_embedding = kind, target_embedding
        self.full_head_figure = kind == "transformer"

    # --- training ---------------------------------------------------------------------------------------------
    def fresh(self, config: TrainConfig, shards: list[Shard], vocab_size: int) -> tuple[PreTrainedModel, torch.Tensor]:
        """From scratch, or with `config.init` a warm start: the exported drafter's weights, V_d and size."""
        if config.init:
            return self._warm_start(config, vocab_size)
        model = build_drafter(config, vocab_size)
        if self.target_embedding is not None:
            model.get_input_embeddings().weight.data.copy_(project_embedding(self.target_embedding, config.hidden))
        return model, choose_draft_vocab(shards, config.draft_vocab, vocab_size)

    def _warm_start(self, config: TrainConfig, vocab_size: int) -> tuple[PreTrainedModel, torch.Tensor]:
        cls = MambaForCausalLM if self.kind == "mamba" else LlamaForCausalLM
        found = AutoConfig.from_pretrained(config.init)
        if found.model_type != cls.config_class.model_type or found.vocab_size != vocab_size:
            raise SystemExit(f"{config.init} is not a {self.kind} drafter scoring this target's {vocab_size} tokens")
        model = read_folder_model(config.init, torch.float32)
        if config.grow_layers:
            grow_layers(model, config.grow_layers)
        if config.grow_state:
            if self.kind != "mamba":
                raise SystemExit("--grow-state widens a Mamba drafter's state; a Transformer has none")
            grow_state(model, config.grow_state, seed=config.seed)
        if self.kind == "mamba":
            config.state_size = model.config.state_size
        config.hidden = model.config.hidden_size
        config.mamba_layers = config.tf_layers = model.config.num_hidden_layers
        draft_ids = load_draft_vocab(config.init)
        config.draft_vocab = len(draft_ids) if draft_ids is not None else vocab_size
        return model, draft_ids if draft_ids is not None else torch.arange(vocab_size)

    def restore(self, saved: dict) -> PreTrainedModel:
        return build_drafter(TrainConfig(**{k: v for k, v in saved.items() if k != "vocab_size"}), saved["vocab_size"])

    def loss(self, model: PreTrainedModel, batch: tuple[torch.Tensor, ...], draft_ids: torch.Tensor,
             lut: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        ids, label, topk_ids, topk_logp = batch
        return distill_loss(draft_logits(model, ids, draft_ids), label, topk_ids, topk_logp, lut)

    def greedy(self, model: PreTrainedModel, batch: list[Answer],
               draft_ids: torch.Tensor) -> Iterator[tuple[str, Answer, torch.Tensor]]:
        """Per domain and over `all`."""
        ids = torch.full((len(batch), max(len(a.tokens) for a in batch)), self.pad_id, dtype=torch.long)  # [B, W]
        for row, answer in enumerate(batch):
            ids[row, :len(answer.tokens)] = answer.tokens
        guess = draft_argmax(model, ids, draft_ids)  # [B, W]
        for row, answer in enumerate(batch):
            yield answer.domain, answer, guess[row, answer.drafted]
            yield "all", answer, guess[row, answer.drafted]

    # --- evaluation and export ----------------------------------------------------------------------------------
    def save(self, model: PreTrainedModel, draft_ids: torch.Tensor, folder: Path,
             tokenizer: PreTrainedTokenizerBase | None = None) -> Path:
        return save_drafter(model, draft_ids, tokenizer, folder)

    def engine_drafter(self, model: PreTrainedModel, draft_ids: torch.Tensor, run: Path,
                       target: LoadedModel) -> LoadedModel:
        """The model in memory in float32, beside its HF folder `run/hf` (which carries the drafter's tokenizer)."""
        tokenizer = self.drafter_tokenizer(target)
        folder = self.save(model, draft_ids, run / "hf", tokenizer)
        return LoadedModel(run.name, model.float().eval(), tokenizer, str(folder))  # reads draft_vocab.json

    def drafter_tokenizer(self, target: LoadedModel) -> PreTrainedTokenizerBase:
        """The tokenizer the drafter reads: the target's."""
        return target.tokenizer

    def decode_step(self, model: PreTrainedModel, folder: Path, target: LoadedModel,
                    context: list[int]) -> Callable[[], object]:
        return decode_step(model, folder, context)

    def check_target(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, run: Path) -> None:
        """The drafter must score every one of the target tokenizer's tokens."""
        width = model.get_output_embeddings().weight.shape[0]
        if width < len(tokenizer):
            raise SystemExit(f"run {run.name!r} scores {width} tokens but the target's tokenizer has "
                             f"{len(tokenizer)}; it was not trained for this target")

    def layers(self, config: dict) -> int:
        return config["tf_layers"] if self.kind == "transformer" else config["mamba_layers"]

    # --- the model card -----------------------------------------------------------------------------------------
    def describe(self, config: dict, vocab: int, params: int, size: int) -> str:
        arch = "Mamba" if self.kind == "mamba" else "Llama-style Transformer"
        state = f", SSM state {config.get('state_size', 16)}" if self.kind == "mamba" else ""
        return f"""A {arch} drafter ({params / 1e6:.1f}M parameters: d_model {config['hidden']}, {self.layers(config)} layers{state},
tied embedding initialised from an SVD projection of the target's) distilled from **SmolLM2-135M-Instruct** for
speculative decoding with the `specdec` engine. The draft head scores {vocab:,} token ids (`draft_vocab.json`,
the target's most frequent greedy tokens); q is 0 elsewhere. Weights in bfloat16, the embedding as int8 rows
({size / 2**20:.1f} MiB folder)."""

    def describe_loss(self) -> str:
        return "Loss H(p, q) on the target's top-k (restricted to the draft vocabulary),"

    def teacher_forced_rows(self, acceptance: dict[str, float]) -> list[str]:
        domains = ", ".join(f"{d} {v:.3f}" for d, v in acceptance.items() if d != "all")
        return [f"| greedy per-token acceptance, teacher-forced on held-out answers | {acceptance['all']:.3f} "
                f"({domains}) |"]

    def acceptance_cells(self, acceptance: dict[str, float]) -> list[str]:
        return [f"{acceptance.get('all', float('nan')):.3f}",
                ", ".join(f"{d} {v:.3f}" for d, v in acceptance.items() if d != "all")]
