"""What a training recipe is, and the pieces every recipe shares.

A recipe is one way to distil a drafter, named by `--arch`: the plug-in Mamba or Transformer
(`specdec.distill.plugin`), or the Mamba that reads the target's features (`specdec.distill.feat`). The training
loop (`specdec.distill.train.train`), `evaluate` and `export` are written once and ask the recipe for what
differs: the teacher data it reads, how it builds, restores and saves its model, its loss, the greedy guesses its
acceptance is counted on, one decode step to time, and the lines of its model card.

Glossary: `p` target distribution (its top-k, renormalised), `q` drafter distribution; the draft vocabulary
`V_d` is the set of ids the drafter's head scores (q = 0 elsewhere); `E` the target's token embedding and `H` its
output layer, both [V, D].

Loss at every labelled position: cross-entropy H(p, q) = -Σ_{x ∈ top-k(p) ∩ V_d} p(x) log q(x), which holds the
target's argmax (what greedy drafting must hit) and the runner-up mass (what sampled drafting needs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specdec.distill.teacher import Shard, load_shards
from specdec.models import LoadedModel


@dataclass
class TrainConfig:
    arch: str = "mamba"  # the recipe: "mamba" | "transformer" | "mamba-feat"
    hidden: int = 256
    mamba_layers: int = 4
    tf_layers: int = 4
    minutes: float = 60.0  # wall-time budget (training steps only, summed over resumes)
    max_tokens: int | None = None  # token budget (window tokens fed to the drafter)
    seq_len: int = 256
    batch_size: int = 16
    lr: float = 2e-3
    warmup: int = 20
    response_share: float = 0.5  # fraction of each batch drawn from the target's own answers (vs labelled text)
    draft_vocab: int = 8192  # size of V_d; 0 keeps the full vocabulary
    seed: int = 0
    eval_every: int = 200
    threads: int | None = None
    init: str | None = None  # a fresh run starts from this exported drafter folder (weights, V_d, size)
    grow_layers: int = 0  # with `init`: layers appended to the folder's, each starting as the identity
    state_size: int = 16  # a Mamba drafter's SSM state channels N (a fresh run; a warm start keeps the folder's)
    grow_state: int = 0  # with `init`: widen a Mamba drafter's state to this many channels, outputs unchanged
    tokenizer: str | None = None  # the drafter's own tokenizer folder (a drafter for a target of another tokenizer)


def target_weights(model: PreTrainedModel) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's E and H, [V, D] each, float32 and detached: what the recipes read of it."""
    return (model.get_input_embeddings().weight.detach().float(),
            model.get_output_embeddings().weight.detach().float())


@dataclass
class Answer:
    """One held-out sequence of a teacher shard: a prompt and the target's greedy answer to it."""

    domain: str
    tokens: torch.Tensor  # [L] long
    label: torch.Tensor  # [L] bool: answer positions
    features: torch.Tensor | None  # [L, D] float32: the target's features, where the shard carries them

    @property
    def drafted(self) -> torch.Tensor:
        """The positions p whose next token p + 1 is an answer token: where a drafter's guess is counted."""
        return self.label[:-1].nonzero()[:, 0]


def answers(shards: list[Shard]) -> list[Answer]:
    return [Answer(s["domains"][i], s["tokens"][a:b].long(), s["label"][a:b],
                   s["features"][a:b].float() if "features" in s else None)
            for s in shards for i, (a, b) in enumerate(zip(s["starts"][:-1].tolist(), s["starts"][1:].tolist()))]


class Stream:
    """One flat token stream (a data source) from which random training windows are cut."""

    first = 0  # the first position a window may start at

    def __init__(self, shards: list[Shard]) -> None:
        self.tokens = torch.cat([s["tokens"] for s in shards]).long()  # [N]
        self.label = torch.cat([s["known"] for s in shards])  # [N] positions with a teacher top-k
        self.topk_ids = torch.cat([s["topk_ids"] for s in shards]).long()  # [N, k]
        self.topk_logp = torch.cat([s["topk_logp"] for s in shards]).float()  # [N, k]

    def windows(self, n: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        starts = torch.randint(self.first, len(self.tokens) - length, (n,), generator=generator)
        return self.cut(starts[:, None] + torch.arange(length))  # index [n, L]

    def cut(self, index: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The windows at `index` [n, L]: (ids, label, topk_ids, topk_logp)."""
        return self.tokens[index], self.label[index], self.topk_ids[index], self.topk_logp[index]


def choose_draft_vocab(shards: list[Shard], size: int, vocab_size: int, specials: int = 17) -> torch.Tensor:
    """V_d: the `size` ids the target most often ranks first in the training data, plus the special tokens.

    Ids never seen ranked first fill the remaining slots in id order (BPE ids come roughly in frequency order).
    """
    return most_frequent([shard["topk_ids"][shard["label"], 0] for shard in shards], size, vocab_size, specials)


def most_frequent(samples: list[torch.Tensor], size: int, vocab_size: int, specials: int) -> torch.Tensor:
    """The first `specials` ids and the most frequent ids in `samples`, `size` in all, in id order (all ids when
    `size` is 0 or not smaller than `vocab_size`); ties and ids never seen go to the lower id."""
    if size <= 0 or size >= vocab_size:
        return torch.arange(vocab_size)
    counts = -torch.arange(vocab_size) / vocab_size  # the tie-break: lower id first
    for ids in samples:
        counts += torch.bincount(ids.long(), minlength=vocab_size).float()
    counts[:specials] = float("inf")
    return counts.topk(size).indices.sort().values


def vocab_lut(draft_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[V] slot of each token id in V_d, -1 outside it."""
    lut = torch.full((vocab_size,), -1, dtype=torch.long)
    lut[draft_ids] = torch.arange(len(draft_ids))
    return lut


def distill_loss(logits: torch.Tensor, label: torch.Tensor, topk_ids: torch.Tensor, topk_logp: torch.Tensor,
                 lut: torch.Tensor) -> torch.Tensor:
    """H(p, q) averaged over labelled positions; p = top-k of the target restricted to V_d and renormalised."""
    log_q = torch.log_softmax(logits.float(), dim=-1)  # [B, L, |V_d|]
    slot = lut[topk_ids]  # [B, L, k], -1 outside V_d
    p = topk_logp.exp() * (slot >= 0)  # [B, L, k]
    keep = label & (p.sum(-1) > 0)  # [B, L]
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-9)
    cross = -(p * log_q.gather(-1, slot.clamp_min(0))).sum(-1)  # [B, L]
    return cross[keep].mean()


@torch.no_grad()
def greedy_acceptance(recipe: Recipe, model: nn.Module, shards: list[Shard], draft_ids: torch.Tensor,
                      domain: str | None = None) -> dict[str, float]:
    """Teacher-forced greedy per-token acceptance: how often argmax q equals the target's greedy token.

    On the target's own greedy answers the accepted prefix is always the target's text, so this is the chance a
    drafted token is accepted given that its prefix was. One figure per name the recipe's `greedy` gives; over the
    answers of one `domain` only, when given.
    """
    hits: dict[str, list[int]] = {}
    held_out = [a for a in answers(shards) if domain is None or a.domain == domain]
    for start in range(0, len(held_out), recipe.eval_batch):
        for name, answer, guess in recipe.greedy(model, held_out[start:start + recipe.eval_batch], draft_ids):
            counts = hits.setdefault(name, [0, 0])
            counts[0] += int((guess == answer.tokens[answer.drafted + 1]).sum())
            counts[1] += len(guess)
    return {name: a / max(n, 1) for name, (a, n) in sorted(hits.items())}


class Recipe:
    """One way to train a drafter: what the loop, `evaluate`, `export` and the model card ask of it."""

    kind: str  # the `--arch` name, also the engine's drafter kind
    reads_features = False  # its teacher data carries the target's features (the `features` stage)
    reads_target = False  # it reads the target's E and H at every step (else E at most, to start a fresh run)
    text_from_teacher = True  # its raw text is the teacher's labelled text shards (`text_shards`)
    eval_batch = 1  # held-out sequences per teacher-forced pass
    headline = "all"  # the acceptance figure the model card's status reads
    full_head_figure = False  # `evaluate` also measures acceptance with the drafter's full head, beside V_d's
    acceptance_headers: tuple[str, ...] = ()  # the learning curve's acceptance columns

    # --- training ---------------------------------------------------------------------------------------------
    def load_shards(self, folder: Path) -> list[Shard]:
        return load_shards(folder)

    def text_shards(self, teacher: Path) -> list[Shard]:
        """The raw text it trains on beside the answers: the teacher's labelled text."""
        return self.load_shards(teacher / "text")

    def stream(self, shards: list[Shard]) -> Stream:
        return Stream(shards)

    def fresh(self, config: TrainConfig, shards: list[Shard], vocab_size: int) -> tuple[nn.Module, torch.Tensor]:
        """A new run's drafter and its V_d, chosen from the training `shards`; may set `config`'s size fields."""
        raise NotImplementedError

    def restore(self, saved: dict) -> nn.Module:
        """A drafter of the size a run's `train_config.json` (`saved`) records, untrained."""
        raise NotImplementedError

    def saved_config(self, model: nn.Module) -> dict:
        """What `train_config.json` keeps beside the TrainConfig fields to `restore` the drafter."""
        return {}

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, ...], draft_ids: torch.Tensor, lut: torch.Tensor,
             generator: torch.Generator) -> torch.Tensor:
        raise NotImplementedError

    def greedy(self, model: nn.Module, batch: list[Answer],
               draft_ids: torch.Tensor) -> Iterator[tuple[str, Answer, torch.Tensor]]:
        """(figure name, answer, the drafter's greedy guess at each of `answer.drafted`) for `greedy_acceptance`."""
        raise NotImplementedError

    # --- evaluation and export ----------------------------------------------------------------------------------
    def save(self, model: nn.Module, draft_ids: torch.Tensor, folder: Path,
             tokenizer: PreTrainedTokenizerBase | None = None) -> Path:
        """The drafter folder the engine loads, in bfloat16 with `draft_vocab.json`."""
        raise NotImplementedError

    def engine_drafter(self, model: nn.Module, draft_ids: torch.Tensor, run: Path, target: LoadedModel) -> LoadedModel:
        """The drafter `evaluate` runs through the engine, saved under `run` first."""
        raise NotImplementedError

    def decode_step(self, model: nn.Module, folder: Path, target: LoadedModel,
                    context: list[int]) -> Callable[[], object]:
        """One batch-1 drafting step of `model` (saved in `folder`) after `context`, ready to time."""
        raise NotImplementedError

    def check_target(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, run: Path) -> None:
        """Refuse a run that does not fit the target (`export`); every run fits by default."""

    def layers(self, config: dict) -> int:
        return config["mamba_layers"]

    # --- the model card -----------------------------------------------------------------------------------------
    def describe(self, config: dict, vocab: int, params: int, size: int) -> str:
        """The card's first paragraph: what the drafter is."""
        raise NotImplementedError

    def describe_loss(self) -> str:
        """The card's sentence on the loss (and what the teacher data holds beyond the top-k)."""
        raise NotImplementedError

    def describe_text(self) -> str:
        """The card's words on the raw text it trained on."""
        return "raw text is standard-library source and documentation labelled with one target pass."

    def teacher_forced_rows(self, acceptance: dict[str, float]) -> list[str]:
        """The card's rows of measured teacher-forced acceptance."""
        raise NotImplementedError

    def acceptance_cells(self, acceptance: dict[str, float]) -> list[str]:
        """One learning-curve point's cells under `acceptance_headers`."""
        raise NotImplementedError
