"""Stage (c): train a drafter on the teacher shards by matching the target's next-token law `p`, by any recipe.

The loop is the same for every recipe (`specdec.distill.recipe`: the plug-in Mamba or Transformer, or the
feature-reading Mamba); the recipe gives the data it reads, its model and its loss.
The run folder holds `ckpt.pt` (model, optimizer, counters: a stopped run resumes), `curve.jsonl` (held-out
greedy acceptance against teacher tokens seen), `draft_vocab.json`, `train_config.json` (the TrainConfig, the
vocabulary size and what the recipe needs to rebuild its drafter) and `segments.jsonl`: one line each time the
run is started with a new budget or on more teacher data (a run can be continued that way), which the model card
turns into the exact commands that reproduce it.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from specdec.distill.feat import Features
from specdec.distill.plugin import PlugIn
from specdec.distill.recipe import Recipe, Stream, TrainConfig, greedy_acceptance, vocab_lut
from specdec.distill.teacher import Shard, folder_part, sampled_temperature
from specdec.vocab import load_draft_vocab

def reuse_freed_memory() -> bool:
    """Ask glibc (`mallopt`) to serve every allocation from its heap and keep freed memory for reuse.

    A training step allocates and frees large tensors; above glibc's mmap threshold each is a fresh mapping whose
    pages fault in one at a time, every step again. Process-wide, so it is called by the `train` and `teacher`
    stages' own processes only. Returns False where there is no glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_max = -1, -4
    return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))


RECIPES = {  # `--arch` -> the recipe, given the target's E and H
    "mamba": lambda embedding, head: PlugIn("mamba", embedding),
    "transformer": lambda embedding, head: PlugIn("transformer", embedding),
    "mamba-feat": lambda embedding, head: Features(embedding, head),
}


def recipe_for(arch: str, target_embedding: torch.Tensor | None = None, target_head: torch.Tensor | None = None,
               tokenizer: str | None = None, target_tokenizer=None) -> Recipe:
    """The recipe `--arch` (with `--tokenizer`) names, reading the target's E and H [V, D] where it needs them;
    a drafter with a `tokenizer` of its own reads the teacher's shards with the target's."""
    if tokenizer:
        if arch != "mamba":
            raise ValueError("a drafter with a tokenizer of its own is a Mamba (--arch mamba)")
        from specdec.distill.cross import CrossPlugIn

        return CrossPlugIn(tokenizer, target_embedding, target_tokenizer)
    if arch not in RECIPES:
        raise ValueError(f"no training recipe {arch!r}")
    return RECIPES[arch](target_embedding, target_head)


def learning_rate(config: TrainConfig, step: int, progress: float) -> float:
    """Linear warm-up, then cosine decay to 10% over the budget (progress in [0, 1])."""
    warm = min(1.0, (step + 1) / config.warmup)
    return config.lr * warm * (0.1 + 0.45 * (1 + math.cos(math.pi * min(progress, 1.0))))


def _progress(config: TrainConfig, wall_s: float, tokens: int) -> float:
    by_time = wall_s / (config.minutes * 60)
    return max(by_time, tokens / config.max_tokens) if config.max_tokens else by_time


# --- the run folder -----------------------------------------------------------------------------------------------
def _restore(run: Path) -> tuple[nn.Module, torch.Tensor, dict, dict]:
    """(drafter with the last checkpoint's weights, V_d, the checkpoint, the run's `train_config.json`)."""
    saved = json.loads((run / "train_config.json").read_text())
    model = recipe_for(saved["arch"], tokenizer=saved.get("tokenizer")).restore(saved)
    ckpt = torch.load(run / "ckpt.pt", weights_only=False)
    model.load_state_dict(ckpt["model"])
    return model, load_draft_vocab(str(run)), ckpt, saved


def load_run(run: Path) -> tuple[nn.Module, torch.Tensor, dict]:
    """The drafter of a run's last checkpoint, its V_d, and the run's counters (step, tokens, wall_s, ...) with
    its `config` (`train_config.json` less the vocabulary size)."""
    model, draft_ids, ckpt, saved = _restore(run)
    counters = {key: ckpt[key] for key in ("step", "tokens", "labelled", "wall_s")}
    config = {k: v for k, v in saved.items() if k != "vocab_size"}
    return model.eval(), draft_ids, {**counters, "config": config}


def _load_or_init(run: Path, config: TrainConfig, recipe: Recipe, shards: list[Shard],
                  vocab_size: int) -> tuple[nn.Module, torch.Tensor, dict | None]:
    """The run's checkpoint when there is one; else the recipe's fresh drafter and V_d, written to the run."""
    if (run / "ckpt.pt").exists():
        model, draft_ids, ckpt, _ = _restore(run)
        return model, draft_ids, ckpt
    torch.manual_seed(config.seed)
    model, draft_ids = recipe.fresh(config, shards, vocab_size)
    (run / "draft_vocab.json").write_text(json.dumps({"token_ids": draft_ids.tolist()}, separators=(",", ":")))
    (run / "train_config.json").write_text(json.dumps({**asdict(config), "vocab_size": vocab_size,
                                                       **recipe.saved_config(model)}, indent=1))
    return model, draft_ids, None


def _save(run: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    tmp = run / "ckpt.tmp"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), **state}, tmp)
    os.replace(tmp, run / "ckpt.pt")


# --- segments: the budgets and data a run was trained under ---------------------------------------------------------
SEGMENT_KEYS = ("minutes", "max_tokens", "seq_len", "batch_size", "lr", "response_share", "eval_every", "threads")


def response_folders(teacher: Path) -> list[Path]:
    """The training answers: `responses/train` (greedy), the greedy answers to later corpus parts
    `responses/train-part<K>`, then any sampled passes `responses/train-t<T>-<i>`."""
    return sorted(p for p in (teacher / "responses").glob("train*") if p.is_dir())


def held_out_folders(teacher: Path) -> list[Path]:
    """The held-out answers: `responses/eval`, then those of later corpus parts `responses/eval-part<K>`."""
    return sorted(p for p in (teacher / "responses").glob("eval*") if p.is_dir())


def _data_record(count: dict[str, int], text_shards: int) -> dict:
    """The data a segment trains on as the teacher's flags, from the shard count of each answer folder."""
    sampled = [name for name, n in count.items() if name.startswith("train-t") and n]  # an empty folder: not read
    parts = {folder_part(name): n for name, n in count.items() if folder_part(name) is not None}
    record = {"response_shards": count.get("train", 0), "text_shards": text_shards}
    if parts:
        record["part_shards"] = {str(part): n for part, n in sorted(parts.items())}  # JSON keys are strings
    if sampled:  # one teacher invocation a temperature: its passes and their shards
        by_temperature: dict[float, list[str]] = {}
        for name in sampled:
            by_temperature.setdefault(sampled_temperature(name), []).append(name)
        record["sampled"] = [{"temperature": t, "passes": len(names), "shards": sum(count[n] for n in names)}
                             for t, names in sorted(by_temperature.items())]
    return record


def _log_segment(run: Path, config: TrainConfig, state: dict, data: dict, shards: list[Shard]) -> None:
    """Append the budget and data this invocation trains under, unless they are the last segment's (a plain resume)."""
    record = {**{key: getattr(config, key) for key in SEGMENT_KEYS}, **data,
              "unique_labelled": sum(int(s["known"].sum()) for s in shards)}
    path = run / "segments.jsonl"
    segments = read_segments(run)
    if segments and {k: segments[-1].get(k) for k in record} == record:
        return
    with open(path, "a") as f:
        f.write(json.dumps({"from_step": state["step"], "from_tokens": state["tokens"], **record}) + "\n")


def read_segments(run: Path) -> list[dict]:
    path = run / "segments.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# --- the loop -----------------------------------------------------------------------------------------------------
def training_state(model: nn.Module, config: TrainConfig,
                   ckpt: dict | None) -> tuple[torch.optim.Optimizer, dict, torch.Generator]:
    """The optimizer, counters and data generator of a fresh run, or as a checkpoint left them."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.01)
    state = {"step": 0, "tokens": 0, "labelled": 0, "wall_s": 0.0}
    generator = torch.Generator().manual_seed(config.seed)
    if ckpt:
        optimizer.load_state_dict(ckpt["optimizer"])
        state = {key: ckpt[key] for key in state}
        generator.set_state(ckpt["generator"])
    return optimizer, state, generator


def _streams(recipe: Recipe, config: TrainConfig, answers: list[Shard],
             text: list[Shard]) -> list[tuple[Stream, int]]:
    """Each data source with its rows per batch: `response_share` of the batch from the answers, the rest text."""
    n_answers = round(config.batch_size * config.response_share) if answers and text else \
        (config.batch_size if answers else 0)
    return [(recipe.stream(shards), n) for shards, n in ((answers, n_answers), (text, config.batch_size - n_answers))
            if shards]


def _batch(streams: list[tuple[Stream, int]], config: TrainConfig, generator: torch.Generator) -> tuple:
    parts = [stream.windows(n, config.seq_len, generator) for stream, n in streams if n > 0]
    return tuple(torch.cat(group) for group in zip(*parts))


def _teacher_data(teacher: Path, recipe: Recipe) -> tuple[dict[str, list[Shard]], list[Shard], list[Shard]]:
    """(the training answers by folder, the labelled text, the held-out answers) as `recipe` reads them; exits
    with a sentence when there is nothing to train on."""
    answers = {folder.name: recipe.load_shards(folder) for folder in response_folders(teacher)}
    text_shards = recipe.text_shards(teacher)
    if not any(answers.values()) and not text_shards:
        missing = "teacher shards with features: run the `features`" if recipe.reads_features else \
            "teacher shards: run the `teacher`"
        raise SystemExit(f"no {missing} stage first")
    held_out = [shard for folder in held_out_folders(teacher) for shard in recipe.load_shards(folder)]
    return answers, text_shards, held_out


def train(teacher: Path, run: Path, config: TrainConfig, target_embedding: torch.Tensor | None, vocab_size: int,
          target_head: torch.Tensor | None = None, target_tokenizer=None) -> nn.Module:
    """Train (or resume) the recipe `config.arch` until the wall-time or token budget is spent; returns the drafter.

    `target_embedding` and `target_head`: the target's E and H [V, D] (`recipe.target_weights`). The plug-in
    recipes read E to initialise a fresh run (None: a random embedding) and H never; the feature recipe reads
    both at every step.
    """
    recipe = recipe_for(config.arch, target_embedding, target_head, config.tokenizer, target_tokenizer)
    if config.threads:
        torch.set_num_threads(config.threads)
    run.mkdir(parents=True, exist_ok=True)
    answers, text_shards, held_out = _teacher_data(teacher, recipe)
    response_shards = [shard for shards in answers.values() for shard in shards]
    shards = response_shards + text_shards
    model, draft_ids, ckpt = _load_or_init(run, config, recipe, shards, vocab_size)
    lut = vocab_lut(draft_ids, vocab_size)
    optimizer, state, generator = training_state(model, config, ckpt)
    data = _data_record({name: len(s) for name, s in answers.items()},
                        len(text_shards) if recipe.text_from_teacher else 0)
    _log_segment(run, config, state, data, shards)
    streams = _streams(recipe, config, response_shards, text_shards)

    def checkpoint(loss: float | None) -> None:
        """A held-out point on the learning curve at the current step, then everything needed to resume."""
        model.eval()
        acceptance = greedy_acceptance(recipe, model, held_out, draft_ids) if held_out else {}
        model.train()
        with open(run / "curve.jsonl", "a") as f:
            f.write(json.dumps({**state, "loss": loss, "acceptance": acceptance}) + "\n")
        _save(run, model, optimizer, {**state, "generator": generator.get_state()})

    if config.init and not (run / "curve.jsonl").exists():
        checkpoint(None)  # where a warm start begins, before its first step
    model.train()
    bar = tqdm(desc=f"train {config.arch}", unit="step", initial=state["step"])
    while _progress(config, state["wall_s"], state["tokens"]) < 1.0:
        tick = time.monotonic()
        batch = _batch(streams, config, generator)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(config, state["step"], _progress(config, state["wall_s"], state["tokens"]))
        loss = recipe.loss(model, batch, draft_ids, lut, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        state["step"] += 1
        state["tokens"] += batch[0].numel()
        state["labelled"] += int(batch[1].sum())
        state["wall_s"] += time.monotonic() - tick
        bar.update()
        bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{state['tokens'] / state['wall_s']:.0f}")
        if state["step"] % config.eval_every == 0 or _progress(config, state["wall_s"], state["tokens"]) >= 1.0:
            checkpoint(loss.item())
    return model.eval()
