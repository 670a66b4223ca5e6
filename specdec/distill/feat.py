"""The feature recipe (`--arch mamba-feat`): the drafter that reads the target's hidden state
(`specdec.drafters.mamba_feat`), its data and its loss.

Data: the teacher shards (answers and labelled text) plus, beside each `shard_XXXXX.pt`, a `features_XXXXX.pt`
holding the target's last hidden state at every position, [N, D] bfloat16 (`add_features`). They are computed
once and cached (one target forward per token: for labelled text, the same pass that gives the labels, see
`teacher.label_text(..., features=True)`), since every training pass reads them again.

Loss, at every labelled position p (input x_p and the feature of p-1, output a guess f̂_p at the target's f_p):
    H(p, q)  with q = softmax(f̂_p H_d^T)                 the plug-in drafter's loss (recipe.distill_loss)
  + w · SmoothL1(f̂_p, f_p)                               the guess must be a feature the next step can read
Each step runs the window twice: once with the real features of p-1 at every position, then with the first
pass's own (detached) guesses in place of the real feature at a random half of the positions, which is what the
drafter reads below the root of a draft tree. Held-out acceptance is measured both ways: `real` (every input
feature is the target's: a depth-1 draft) and `guessed` (every input feature is the drafter's own guess).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase

from specdec.distill.recipe import Answer, Recipe, Stream, TrainConfig, choose_draft_vocab, distill_loss
from specdec.distill.teacher import Shard, features_path, save_shard, shards_of, target_hidden
from specdec.drafters.mamba_feat import FeatConfig, MambaFeatDrafter, MambaFeatModel
from specdec.drafters.mixer import blocks_forward
from specdec.models import LoadedModel
from specdec.probes import cpu_has_native_bf16
from specdec.vocab import load_draft_vocab

FEATURE_WEIGHT = 0.1  # w: the regression term's weight beside the cross-entropy
GUESS_SHARE = 0.5  # positions whose input feature is replaced by the drafter's own guess in the second pass


def bf16_is_fast(device: torch.device) -> bool:
    """Whether the output layer's matmul runs in bfloat16 in training: on a GPU, or a CPU that multiplies bf16
    natively (AMX, AVX512-BF16). Elsewhere bf16 is emulated, and slower than float32 (docs/training.md,
    "Precision", says which commands compare the two)."""
    return device.type != "cpu" or cpu_has_native_bf16()


# --- data ---------------------------------------------------------------------------------------------------------
@torch.inference_mode()
def add_features(model, folder: Path, batch_size: int = 8, minutes: float | None = None) -> int:
    """Write `features_XXXXX.pt` beside every shard of `folder` that has none (resumable). -> tokens done."""
    done, start = 0, time.monotonic()
    for path in tqdm(sorted(folder.glob("shard_*.pt")), desc=f"features {folder.name}", unit="shard"):
        out = features_path(path)
        if out.exists():
            continue
        if minutes is not None and time.monotonic() - start > minutes * 60:
            break
        shard = torch.load(path, weights_only=False)
        starts = shard["starts"].tolist()
        sequences = [shard["tokens"][a:b].long() for a, b in zip(starts[:-1], starts[1:])]
        features = []
        for _, batch in shards_of(sequences, batch_size):
            width = max(map(len, batch))
            ids = torch.zeros(len(batch), width, dtype=torch.long)  # right padding never reaches earlier positions
            for row, seq in enumerate(batch):
                ids[row, :len(seq)] = seq
            hidden = target_hidden(model, ids)
            features += [hidden[row, :len(seq)].to(torch.bfloat16) for row, seq in enumerate(batch)]
        save_shard(out, torch.cat(features))
        done += len(shard["tokens"])
    return done


def load_with_features(folder: Path) -> list[Shard]:
    """The shards of `folder` that have features, each with its `features` [N, D] attached."""
    shards = []
    for path in sorted(folder.glob("shard_*.pt")):
        if features_path(path).exists():
            shard = torch.load(path, weights_only=False)
            shard["features"] = torch.load(features_path(path), weights_only=False)
            shards.append(shard)
    return shards


class FeatStream(Stream):
    """`Stream` with features: each window also gets the feature of the position before its first token."""

    first = 1

    def __init__(self, shards: list[Shard]) -> None:
        super().__init__(shards)
        self.features = torch.cat([s["features"] for s in shards])  # [N, D] bf16

    def cut(self, index: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(ids, label, topk_ids, topk_logp, the features of p-1 [n, L, D], those of p [n, L, D])."""
        return *super().cut(index), self.features[index - 1].float(), self.features[index].float()


# --- the model's forward and loss -------------------------------------------------------------------------------
def guesses(model: MambaFeatModel, embedding: torch.Tensor, ids: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """Teacher-forced f̂ [B, L, D] for ids [B, L] with the input features `previous` [B, L, D] (trainable path)."""
    return model.read_out(blocks_forward(model.layers, model.fuse(embedding[ids], previous)))


def feat_loss(model: MambaFeatModel, embedding: torch.Tensor, head: torch.Tensor, batch: tuple,
              lut: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    ids, label, topk_ids, topk_logp, previous, own = batch
    guess = guesses(model, embedding, ids, previous)  # pass 1: real features everywhere

    def loss_of(g: torch.Tensor) -> torch.Tensor:
        with torch.autocast(g.device.type, dtype=torch.bfloat16, enabled=bf16_is_fast(g.device)):
            logits = g @ head.T  # [B, L, |V_d|]: the output layer, most of a step's work; the loss is float32
        return distill_loss(logits, label, topk_ids, topk_logp, lut) + \
            FEATURE_WEIGHT * F.smooth_l1_loss(g[label], own[label])

    shifted = torch.cat([previous[:, :1], guess.detach()[:, :-1]], dim=1)  # the guess of p-1, read at p
    swap = torch.rand(ids.shape, generator=generator) < GUESS_SHARE
    mixed = torch.where(swap[..., None], shifted, previous)
    return loss_of(guess) + loss_of(guesses(model, embedding, ids, mixed))  # pass 2: half of them guessed


# --- the recipe ---------------------------------------------------------------------------------------------------
class Features(Recipe):
    kind = "mamba-feat"
    reads_features = True
    reads_target = True
    headline = "real"
    acceptance_headers = ("acceptance, real feature", "acceptance, own guess")

    def __init__(self, target_embedding: torch.Tensor | None = None, target_head: torch.Tensor | None = None) -> None:
        """The target's E and H [V, D], float32, frozen: read at every training step and acceptance pass (never
        trained or saved), so training and measuring need them."""
        self.embedding, self.head = target_embedding, target_head

    # --- training ---------------------------------------------------------------------------------------------
    def load_shards(self, folder: Path) -> list[Shard]:
        return load_with_features(folder)

    def stream(self, shards: list[Shard]) -> Stream:
        return FeatStream(shards)

    def fresh(self, config: TrainConfig, shards: list[Shard], vocab_size: int) -> tuple[MambaFeatModel, torch.Tensor]:
        """From scratch, or with `config.init` a warm start: the exported drafter's weights, V_d and size."""
        D = self.embedding.shape[1]
        if not config.init:
            model = MambaFeatModel(FeatConfig(target_hidden=D, hidden=config.hidden, layers=config.mamba_layers))
            return model, choose_draft_vocab(shards, config.draft_vocab, vocab_size)
        model, draft_ids = MambaFeatModel.load(Path(config.init)), load_draft_vocab(config.init)
        feat = model.config
        if feat.target_hidden != D:
            raise SystemExit(f"{config.init} reads features of width {feat.target_hidden}, this target's are {D}")
        config.hidden, config.mamba_layers, config.draft_vocab = feat.hidden, feat.layers, len(draft_ids)
        return model, draft_ids

    def restore(self, saved: dict) -> MambaFeatModel:
        return MambaFeatModel(FeatConfig(**saved["feat"]))

    def saved_config(self, model: MambaFeatModel) -> dict:
        return {"feat": asdict(model.config)}

    def loss(self, model: MambaFeatModel, batch: tuple[torch.Tensor, ...], draft_ids: torch.Tensor,
             lut: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return feat_loss(model, self.embedding, self.head[draft_ids], batch, lut, generator)

    def greedy(self, model: MambaFeatModel, batch: list[Answer],
               draft_ids: torch.Tensor) -> Iterator[tuple[str, Answer, torch.Tensor]]:
        """`real` reads the target's feature of p-1 (the first token of a draft), `guessed` the drafter's own
        guess of it (any deeper token)."""
        head = self.head[draft_ids]  # [|V_d|, D]
        for answer in batch:
            ids, features = answer.tokens[None], answer.features[None]
            previous = torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], 1)
            real = guesses(model, self.embedding, ids, previous)
            own = guesses(model, self.embedding, ids, torch.cat([previous[:, :1], real[:, :-1]], 1))
            for name, g in (("real", real), ("guessed", own)):
                yield name, answer, draft_ids[(g[0, answer.drafted] @ head.T).argmax(-1)]

    # --- evaluation and export ----------------------------------------------------------------------------------
    def save(self, model: MambaFeatModel, draft_ids: torch.Tensor, folder: Path,
             tokenizer: PreTrainedTokenizerBase | None = None) -> Path:
        """Only the drafter's own weights: it reads the target's tokenizer, embedding and output layer."""
        model.save(folder, draft_ids)
        return folder

    def engine_drafter(self, model: MambaFeatModel, draft_ids: torch.Tensor, run: Path,
                       target: LoadedModel) -> LoadedModel:
        """The folder `run/export` as the engine loads it (its bfloat16 weights, in float32)."""
        folder = self.save(model, draft_ids, run / "export")
        return LoadedModel(run.name, MambaFeatModel.load(folder), None, str(folder))

    def decode_step(self, model: MambaFeatModel, folder: Path, target: LoadedModel,
                    context: list[int]) -> Callable[[], object]:
        drafter = MambaFeatDrafter(model, target.model, load_draft_vocab(str(folder)))
        state = drafter.stack.zeros(1, drafter.device)
        token, feature = torch.tensor([context[-1]]), torch.zeros(1, model.config.target_hidden)
        return lambda: drafter.step(token, feature, state)

    # --- the model card -----------------------------------------------------------------------------------------
    def describe(self, config: dict, vocab: int, params: int, size: int) -> str:
        feat = config["feat"]
        return f"""A Mamba drafter that reads the target's hidden state (`specdec.drafters.mamba_feat`), trained for
**SmolLM2-135M-Instruct**: input `W_in [norm(E x_p); norm(f_(p-1))]`, {feat['layers']} Mamba layers of width
{feat['hidden']}, output `f̂_p = W_out norm(h_p)` scored by the target's own output layer restricted to the
{vocab:,} ids of `draft_vocab.json`. `E` and the output layer are the target's, read at run time: the folder holds
{params / 1e6:.2f}M parameters in bfloat16 ({size / 2**20:.1f} MiB). It works with this target only (the loader
checks the hidden size)."""

    def describe_loss(self) -> str:
        return f"""Teacher data: the target's top-k on labelled text and answers, plus its last hidden state at
every position (`python -m specdec.distill features`, or `teacher --text-features`, cached beside the shards).
Loss: H(p, q) on the target's top-k plus {FEATURE_WEIGHT} x SmoothL1(f̂, f); each step runs twice, the second
time with the drafter's own guesses in place of the real feature at {GUESS_SHARE:.0%} of the positions (drafted
nodes read guesses)."""

    def teacher_forced_rows(self, acceptance: dict[str, float]) -> list[str]:
        return [f"| greedy acceptance, teacher-forced, real feature of p-1 (a draft's first token) "
                f"| {acceptance['real']:.3f} |",
                f"| the same with the drafter's own guess as input (deeper tokens) | {acceptance['guessed']:.3f} |"]

    def acceptance_cells(self, acceptance: dict[str, float]) -> list[str]:
        return [f"{acceptance.get(key, float('nan')):.3f}" for key in ("real", "guessed")]
