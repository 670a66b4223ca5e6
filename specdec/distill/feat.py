"""Training the drafter that reads the target's hidden state (`specdec.drafters.mamba_feat`), and its data.

Data: the teacher shards (answers and labelled text) plus, beside each `shard_XXXXX.pt`, a `features_XXXXX.pt`
holding the target's last hidden state at every position, [N, D] bfloat16 (`add_features`). They are computed
once and cached (one target forward per token: for labelled text, the same pass that gives the labels, see
`label_text_with_features`), since every training pass reads them again.

Loss, at every labelled position p (input x_p and the feature of p-1, output a guess f̂_p at the target's f_p):
    H(p, q)  with q = softmax(f̂_p H_d^T)                 the plug-in drafter's loss (train.distill_loss)
  + w · SmoothL1(f̂_p, f_p)                               the guess must be a feature the next step can read
Each step runs the window twice: once with the real features of p-1 at every position, then with the first
pass's own (detached) guesses in place of the real feature at a random half of the positions, which is what the
drafter reads below the root of a draft tree. Held-out acceptance is measured both ways: `real` (every input
feature is the target's: a depth-1 draft) and `guessed` (every input feature is the drafter's own guess).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from specdec.distill.teacher import Shard, _pending, _shards_of, load_shards, save_shard, text_windows, top_k_logp, \
    _pack
from specdec.distill.train import (TrainConfig, _data_record, _log_segment, _progress, choose_draft_vocab,
                                   distill_loss, learning_rate, mixer_forward, response_folders)
from specdec.drafters.mamba_feat import FeatConfig, MambaFeatModel
from specdec.vocab import load_draft_vocab

FEATURE_WEIGHT = 0.1  # w: the regression term's weight beside the cross-entropy
GUESS_SHARE = 0.5  # positions whose input feature is replaced by the drafter's own guess in the second pass


def features_path(shard: Path) -> Path:
    return shard.with_name(shard.name.replace("shard_", "features_"))


@torch.inference_mode()
def target_hidden(model, ids: torch.Tensor) -> torch.Tensor:
    """The target's last hidden state (what its output layer scores) of [B, L] ids -> [B, L, D]."""
    return model.base_model(input_ids=ids).last_hidden_state


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
        for _, batch in _shards_of(sequences, batch_size):
            width = max(map(len, batch))
            ids = torch.zeros(len(batch), width, dtype=torch.long)  # right padding never reaches earlier positions
            for row, seq in enumerate(batch):
                ids[row, :len(seq)] = seq
            hidden = target_hidden(model, ids)
            features += [hidden[row, :len(seq)].to(torch.bfloat16) for row, seq in enumerate(batch)]
        _save(out, torch.cat(features))
        done += len(shard["tokens"])
    return done


def _save(path: Path, tensor: torch.Tensor) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(tensor, tmp)
    os.replace(tmp, path)


@torch.inference_mode()
def label_text_with_features(model, tokenizer, corpus: Path, out: Path, window: int, batch_size: int,
                             shard_windows: int, k: int, minutes: float | None = None,
                             max_shards: int | None = None) -> int:
    """`teacher.label_text` that also keeps the target's features of the same pass: `out/text/shard_*.pt` and
    `features_*.pt`, resumable."""
    folder = out / "text"
    folder.mkdir(parents=True, exist_ok=True)
    windows = text_windows(tokenizer, corpus, window)
    start, written = time.monotonic(), 0
    shards = list(_shards_of(windows, shard_windows))[:max_shards]
    for path, group, bar in _pending(folder, shards, minutes, "teacher text labels + features"):
        sequences, features = [], []
        for _, batch in _shards_of(group, batch_size):
            hidden = target_hidden(model, torch.stack([w for _, w in batch]))  # [B, L, D]
            ids, logp = top_k_logp(model.get_output_embeddings()(hidden), k)
            everywhere = torch.ones(window, dtype=torch.bool)
            sequences += [{"tokens": w, "label": everywhere, "known": everywhere, "topk_ids": ids[i],
                           "topk_logp": logp[i], "domain": domain} for i, (domain, w) in enumerate(batch)]
            features += [h.to(torch.bfloat16) for h in hidden]
        _save(features_path(path), torch.cat(features))  # before the shard: a shard on disk has its features
        save_shard(path, _pack(sequences, "train", k))
        written += window * len(group)
        bar.set_postfix(tok_s=f"{written / (time.monotonic() - start):.0f}", labels=written)
    return written


def load_with_features(folder: Path) -> list[Shard]:
    """The shards of `folder` that have features, each with its `features` [N, D] attached."""
    shards = []
    for path in sorted(folder.glob("shard_*.pt")):
        if features_path(path).exists():
            shard = torch.load(path, weights_only=False)
            shard["features"] = torch.load(features_path(path), weights_only=False)
            shards.append(shard)
    return shards


class FeatStream:
    """A flat token stream with features, cut into random windows; each window also gets the feature of the
    position before its first token."""

    def __init__(self, shards: list[Shard]) -> None:
        self.tokens = torch.cat([s["tokens"] for s in shards]).long()
        self.label = torch.cat([s["known"] for s in shards])
        self.topk_ids = torch.cat([s["topk_ids"] for s in shards]).long()
        self.topk_logp = torch.cat([s["topk_logp"] for s in shards]).float()
        self.features = torch.cat([s["features"] for s in shards])  # [N, D] bf16

    def windows(self, n: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        starts = torch.randint(1, len(self.tokens) - length, (n,), generator=generator)
        index = starts[:, None] + torch.arange(length)  # [n, L]
        return (self.tokens[index], self.label[index], self.topk_ids[index], self.topk_logp[index],
                self.features[index - 1].float(), self.features[index].float())  # previous, own


def guesses(model: MambaFeatModel, embedding: torch.Tensor, ids: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """Teacher-forced f̂ [B, L, D] for ids [B, L] with the input features `previous` [B, L, D] (trainable path)."""
    h = model.fuse(embedding[ids], previous)
    for block in model.layers:
        h = h + mixer_forward(block.mixer, block.norm(h))
    return model.read_out(h)


def feat_loss(model: MambaFeatModel, embedding: torch.Tensor, head: torch.Tensor, batch: tuple,
              lut: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    ids, label, topk_ids, topk_logp, previous, own = batch
    guess = guesses(model, embedding, ids, previous)  # pass 1: real features everywhere

    def loss_of(g: torch.Tensor) -> torch.Tensor:
        return distill_loss(g @ head.T, label, topk_ids, topk_logp, lut) + \
            FEATURE_WEIGHT * F.smooth_l1_loss(g[label], own[label])

    shifted = torch.cat([previous[:, :1], guess.detach()[:, :-1]], dim=1)  # the guess of p-1, read at p
    swap = torch.rand(ids.shape, generator=generator) < GUESS_SHARE
    mixed = torch.where(swap[..., None], shifted, previous)
    return loss_of(guess) + loss_of(guesses(model, embedding, ids, mixed))  # pass 2: half of them guessed


@torch.no_grad()
def greedy_acceptance(model: MambaFeatModel, embedding: torch.Tensor, head: torch.Tensor, draft_ids: torch.Tensor,
                      shards: list[Shard]) -> dict[str, float]:
    """Teacher-forced greedy acceptance on the target's answers: `real` reads the target's feature of p-1 (the
    first token of a draft), `guessed` the drafter's own guess of it (any deeper token)."""
    hits = {"real": [0, 0], "guessed": [0, 0]}
    for shard in shards:
        starts = shard["starts"].tolist()
        for a, b in zip(starts[:-1], starts[1:]):
            ids = shard["tokens"][a:b].long()[None]
            features = shard["features"][a:b].float()[None]
            previous = torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], 1)
            real = guesses(model, embedding, ids, previous)
            own = guesses(model, embedding, ids, torch.cat([previous[:, :1], real[:, :-1]], 1))
            pos = shard["label"][a:b][:-1].nonzero()[:, 0]
            for name, g in (("real", real), ("guessed", own)):
                guess = draft_ids[(g[0, pos] @ head.T).argmax(-1)]
                hits[name][0] += int((guess == ids[0, pos + 1]).sum())
                hits[name][1] += len(pos)
    return {name: a / max(n, 1) for name, (a, n) in hits.items()}


def train_feat(teacher: Path, run: Path, config: TrainConfig, target) -> MambaFeatModel:
    """Train (or resume) a mamba-feat drafter on the shards with features; `target` is the target's HF model
    (its embedding and output layer are read, frozen, never trained or saved)."""
    if config.threads:
        torch.set_num_threads(config.threads)
    run.mkdir(parents=True, exist_ok=True)
    answers = {f.name: load_with_features(f) for f in response_folders(teacher)}
    response_shards = [s for shards in answers.values() for s in shards]
    text_shards = load_with_features(teacher / "text")
    held_out = load_with_features(teacher / "responses" / "eval")
    if not response_shards and not text_shards:
        raise SystemExit("no teacher shards with features: run the `features` stage first")
    embedding = target.get_input_embeddings().weight.detach().float()  # [V, D]
    vocab_size, D = embedding.shape
    if (run / "ckpt.pt").exists():
        saved = json.loads((run / "train_config.json").read_text())
        model = MambaFeatModel(FeatConfig(**saved["feat"]))
        ckpt = torch.load(run / "ckpt.pt", weights_only=False)
        model.load_state_dict(ckpt["model"])
        draft_ids = load_draft_vocab(str(run))
    else:
        torch.manual_seed(config.seed)
        feat = FeatConfig(target_hidden=D, hidden=config.hidden, layers=config.mamba_layers)
        model, ckpt = MambaFeatModel(feat), None
        draft_ids = choose_draft_vocab(response_shards + text_shards, config.draft_vocab, vocab_size)
        (run / "draft_vocab.json").write_text(json.dumps({"token_ids": draft_ids.tolist()}))
        (run / "train_config.json").write_text(json.dumps({**asdict(config), "vocab_size": vocab_size,
                                                           "feat": asdict(feat)}, indent=1))
    head = target.get_output_embeddings().weight.detach().float()[draft_ids]  # [|V_d|, D], frozen
    lut = torch.full((vocab_size,), -1, dtype=torch.long)
    lut[draft_ids] = torch.arange(len(draft_ids))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.01)
    state = {"step": 0, "tokens": 0, "labelled": 0, "wall_s": 0.0}
    generator = torch.Generator().manual_seed(config.seed)
    if ckpt:
        optimizer.load_state_dict(ckpt["optimizer"])
        state = {key: ckpt[key] for key in state}
        generator.set_state(ckpt["generator"])
    all_shards = response_shards + text_shards
    _log_segment(run, config, state, _data_record({n: len(s) for n, s in answers.items()}, len(text_shards)),
                 all_shards)
    streams = []
    n_resp = round(config.batch_size * config.response_share) if text_shards and response_shards else \
        (config.batch_size if response_shards else 0)
    if response_shards:
        streams.append((FeatStream(response_shards), n_resp))
    if text_shards:
        streams.append((FeatStream(text_shards), config.batch_size - n_resp))
    model.train()
    bar = tqdm(desc="train mamba-feat", unit="step", initial=state["step"])
    while _progress(config, state["wall_s"], state["tokens"]) < 1.0:
        tick = time.monotonic()
        parts = [stream.windows(n, config.seq_len, generator) for stream, n in streams if n > 0]
        batch = tuple(torch.cat(group) for group in zip(*parts))
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(config, state["step"], _progress(config, state["wall_s"], state["tokens"]))
        loss = feat_loss(model, embedding, head, batch, lut, generator)
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
        done = _progress(config, state["wall_s"], state["tokens"]) >= 1.0
        if state["step"] % config.eval_every == 0 or done:
            model.eval()
            acceptance = greedy_acceptance(model, embedding, head, draft_ids, held_out) if held_out else {}
            model.train()
            with open(run / "curve.jsonl", "a") as f:
                f.write(json.dumps({**state, "loss": loss.item(), "acceptance": acceptance}) + "\n")
            tmp = run / "ckpt.tmp"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), **state,
                        "generator": generator.get_state()}, tmp)
            os.replace(tmp, run / "ckpt.pt")
    return model.eval()


def load_feat_run(run: Path) -> tuple[MambaFeatModel, torch.Tensor, dict]:
    """A run's last checkpoint: (drafter, V_d, counters and config)."""
    saved = json.loads((run / "train_config.json").read_text())
    model = MambaFeatModel(FeatConfig(**saved["feat"]))
    ckpt = torch.load(run / "ckpt.pt", weights_only=False)
    model.load_state_dict(ckpt["model"])
    counters = {key: ckpt[key] for key in ("step", "tokens", "labelled", "wall_s")}
    return model.eval(), load_draft_vocab(str(run)), {**counters, "config": saved}
