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

from specdec.distill.export import _reproduce, folder_bytes, segment_data
from specdec.distill.teacher import Shard, _pending, _shards_of, load_shards, save_shard, text_windows, top_k_logp, \
    _pack
from specdec.distill.train import (TrainConfig, _data_record, _log_segment, _progress, choose_draft_vocab,
                                   distill_loss, learning_rate, mixer_forward, response_folders, training_state,
                                   read_segments, vocab_lut)
from specdec.distill.train import _save as save_checkpoint
from specdec.drafters.mamba_feat import FeatConfig, MambaFeatModel
from specdec.models import cpu_has_native_bf16
from specdec.vocab import load_draft_vocab

FEATURE_WEIGHT = 0.1  # w: the regression term's weight beside the cross-entropy
GUESS_SHARE = 0.5  # positions whose input feature is replaced by the drafter's own guess in the second pass


def bf16_is_fast(device: torch.device) -> bool:
    """Whether the output layer's matmul runs in bfloat16 in training: on a GPU, or a CPU that multiplies bf16
    natively (AMX, AVX512-BF16). Elsewhere bf16 is emulated: on a 2-core AVX2 CPU (AMD EPYC, two threads) a
    training step took 105 s with it against 6.9 s without."""
    return device.type != "cpu" or cpu_has_native_bf16()


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
        with torch.autocast(g.device.type, dtype=torch.bfloat16, enabled=bf16_is_fast(g.device)):
            logits = g @ head.T  # [B, L, |V_d|]: the output layer, most of a step's work; the loss is float32
        return distill_loss(logits, label, topk_ids, topk_logp, lut) + \
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
    elif config.init:  # a warm start: the exported drafter's weights, V_d and size; a fresh optimizer
        model, ckpt, draft_ids = MambaFeatModel.load(Path(config.init)), None, load_draft_vocab(config.init)
        feat = model.config
        if feat.target_hidden != D:
            raise SystemExit(f"{config.init} reads features of width {feat.target_hidden}, this target's are {D}")
        config.hidden, config.mamba_layers, config.draft_vocab = feat.hidden, feat.layers, len(draft_ids)
    else:
        torch.manual_seed(config.seed)
        feat = FeatConfig(target_hidden=D, hidden=config.hidden, layers=config.mamba_layers)
        model, ckpt = MambaFeatModel(feat), None
        draft_ids = choose_draft_vocab(response_shards + text_shards, config.draft_vocab, vocab_size)
    if ckpt is None:
        (run / "draft_vocab.json").write_text(json.dumps({"token_ids": draft_ids.tolist()}))
        (run / "train_config.json").write_text(json.dumps({**asdict(config), "vocab_size": vocab_size,
                                                           "feat": asdict(feat)}, indent=1))
    head = target.get_output_embeddings().weight.detach().float()[draft_ids]  # [|V_d|, D], frozen
    lut = vocab_lut(draft_ids, vocab_size)
    optimizer, state, generator = training_state(model, config, ckpt)
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

    def check(loss: float | None) -> None:
        """A held-out point on the learning curve at the current step."""
        model.eval()
        acceptance = greedy_acceptance(model, embedding, head, draft_ids, held_out) if held_out else {}
        model.train()
        with open(run / "curve.jsonl", "a") as f:
            f.write(json.dumps({**state, "loss": loss, "acceptance": acceptance}) + "\n")

    if config.init and not (run / "curve.jsonl").exists():
        check(None)  # where the warm start begins, before its first step
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
            check(loss.item())
            save_checkpoint(run, model, optimizer, {**state, "generator": generator.get_state()})
    return model.eval()


def load_feat_run(run: Path) -> tuple[MambaFeatModel, torch.Tensor, dict]:
    """A run's last checkpoint: (drafter, V_d, counters and config)."""
    saved = json.loads((run / "train_config.json").read_text())
    model = MambaFeatModel(FeatConfig(**saved["feat"]))
    ckpt = torch.load(run / "ckpt.pt", weights_only=False)
    model.load_state_dict(ckpt["model"])
    counters = {key: ckpt[key] for key in ("step", "tokens", "labelled", "wall_s")}
    return model.eval(), load_draft_vocab(str(run)), {**counters, "config": saved}


def is_feat_run(run: Path) -> bool:
    path = run / "train_config.json"
    return path.exists() and "feat" in json.loads(path.read_text())


def evaluate_feat(target, teacher: Path, run: Path, prompts_per_domain: int, max_new_tokens: int) -> dict:
    """The run's last checkpoint, measured: teacher-forced acceptance (real and guessed input features),
    draft-vocabulary coverage, the engine (greedy chain of 4 vs target alone, identical outputs) and the step
    latency of drafter and target at batch 1. Writes `run/eval.json`."""
    from specdec.distill.evaluate import _by_domain, _ms_per_call, coverage, engine_report, step_latency_ms
    from specdec.distill.corpus import read_prompts
    from specdec.drafters.mamba import MambaState
    from specdec.drafters.mamba_feat import MambaFeatDrafter
    from specdec.models import LoadedModel, Models

    model, draft_ids, counters = load_feat_run(run)
    held_out = load_with_features(teacher / "responses" / "eval")
    embedding = target.model.get_input_embeddings().weight.detach().float()
    head = target.model.get_output_embeddings().weight.detach().float()[draft_ids]
    report = {"counters": {k: v for k, v in counters.items() if k != "config"},
              "teacher_forced": greedy_acceptance(model, embedding, head, draft_ids, held_out),
              "coverage": coverage(held_out, draft_ids)}
    context = held_out[0]["tokens"][:64].tolist()
    latency = {"target_fp32": step_latency_ms(target.model, None, context)}
    for name, dtype in (("drafter_fp32", torch.float32), ("drafter_bf16", torch.bfloat16)):
        drafter = MambaFeatDrafter(model.to(dtype), target.model, draft_ids)
        cfg = model.config
        state = MambaState(torch.zeros(cfg.layers, 1, cfg.hidden * cfg.expand, cfg.conv_kernel),
                           torch.zeros(cfg.layers, 1, cfg.hidden * cfg.expand, cfg.state_size))
        token, feature = torch.tensor([context[-1]]), torch.zeros(1, cfg.target_hidden)
        latency[name] = _ms_per_call(lambda: drafter.step(token, feature, state))
    model.float()
    latency["ratio_fp32"] = latency["drafter_fp32"] / latency["target_fp32"]
    latency["ratio_bf16"] = latency["drafter_bf16"] / latency["target_fp32"]
    report["latency_ms"] = latency
    folder = run / "export"
    model.save(folder, draft_ids)
    prompts = [p for group in _by_domain(read_prompts(teacher.parent / "corpus", "eval")).values()
               for p in group[:prompts_per_domain]]
    models = Models.from_loaded(target, {"mamba-feat": LoadedModel(run.name, MambaFeatModel.load(folder), None,
                                                                str(folder))})
    report["engine"] = engine_report(models, "mamba-feat", prompts, max_new_tokens) if prompts else None
    (run / "eval.json").write_text(json.dumps(report, indent=1))
    return report


def model_card(name: str, run: Path, report: dict, counters: dict, size: int) -> str:
    config, tf, engine, lat = counters["config"], report["teacher_forced"], report.get("engine") or {}, \
        report["latency_ms"]
    feat = config["feat"]
    params = sum(p.numel() for p in load_feat_run(run)[0].parameters())
    rows = ["| step | window tokens seen | wall min | loss | acceptance, real feature | acceptance, own guess |",
            "|---:|---:|---:|---:|---:|---:|"]
    for line in (run / "curve.jsonl").read_text().splitlines():
        point = json.loads(line)
        acc = point["acceptance"]
        loss = "-" if point["loss"] is None else f"{point['loss']:.3f}"  # None: a warm start's first point
        rows.append(f"| {point['step']} | {point['tokens']:,} | {point['wall_s'] / 60:.1f} | {loss} "
                    f"| {acc.get('real', float('nan')):.3f} | {acc.get('guessed', float('nan')):.3f} |")
    segments = read_segments(run)
    engine_line = (f"engine `mamba-feat-chain` (chain of 4, greedy, {engine['prompts']} held-out prompts, "
                   f"{engine['max_new_tokens']} new tokens): acceptance {engine['acceptance_rate']:.3f}, "
                   f"{engine['mean_accepted_len']:.2f} tokens per round, {engine['speedup']:.2f}x the fp32 target alone, "
                   f"outputs identical: {engine['identical']}") if engine else "engine: not measured"
    return f"""# {name}

A Mamba drafter that reads the target's hidden state (`specdec.drafters.mamba_feat`), trained for
**SmolLM2-135M-Instruct**: input `W_in [norm(E x_p); norm(f_(p-1))]`, {feat['layers']} Mamba layers of width
{feat['hidden']}, output `f̂_p = W_out norm(h_p)` scored by the target's own output layer restricted to the
{len(json.loads((run / 'draft_vocab.json').read_text())['token_ids']):,} ids of `draft_vocab.json`. `E` and the
output layer are the target's, read at run time: the folder holds {params / 1e6:.2f}M parameters in bfloat16
({size / 2**20:.1f} MiB). It works with this target only (the loader checks the hidden size).

## Training
Teacher data: the target's top-k on labelled text and answers, plus its last hidden state at every position
(`python -m specdec.distill features`, or `teacher --text-features`, cached beside the shards). Loss: H(p, q) on
the target's top-k plus {FEATURE_WEIGHT} x SmoothL1(f̂, f); each step runs twice, the second time with the
drafter's own guesses in place of the real feature at {GUESS_SHARE:.0%} of the positions (drafted nodes read
guesses). AdamW, lr {config['lr']}, batch {config['batch_size']} x {config['seq_len']}, on a 2-core CPU shared with
other jobs; per segment: {'; '.join(segment_data(s) for s in segments)}.
Spent: {counters['step']:,} steps, {counters['tokens']:,} window tokens, {counters['wall_s'] / 60:.1f} min.

## Measured (held-out answers and prompts, never trained on)
| measure | value |
|---|---|
| greedy acceptance, teacher-forced, real feature of p-1 (a draft's first token) | {tf['real']:.3f} |
| the same with the drafter's own guess as input (deeper tokens) | {tf['guessed']:.3f} |
| draft-vocabulary coverage of the target's greedy tokens | {report['coverage']:.3f} |
| {engine_line} | |
| step latency, batch 1: drafter fp32 / bf16 vs target fp32 | {lat['drafter_fp32']:.2f} / {lat['drafter_bf16']:.2f} ms vs {lat['target_fp32']:.2f} ms |

## Learning curve
{chr(10).join(rows)}

## Reproduce
One `teacher` / `features` / `train` group per training segment (a resumed run continues with more data):
```
{_reproduce(name, config, segments)}
python -m specdec.distill evaluate --name {name}
python -m specdec.distill export --name {name}
```
"""


def export_feat(run: Path, folder: Path) -> Path:
    """The run's drafter (bfloat16) and its card into `folder` (e.g. assets/drafters/mamba-feat-smollm2)."""
    model, draft_ids, counters = load_feat_run(run)
    model.save(folder, draft_ids)
    report = json.loads((run / "eval.json").read_text())
    (folder / "README.md").write_text(model_card(folder.name, run, report, counters, folder_bytes(folder)))
    return folder
