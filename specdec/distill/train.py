"""Stage (c): train a drafter on the teacher shards by matching the target's next-token law `p`.

Glossary: `p` target distribution (its top-k, renormalised), `q` drafter distribution; the draft vocabulary
`V_d` is the set of ids the drafter's head scores (q = 0 elsewhere); `E` the target's token embedding.

Loss at every labelled position: cross-entropy H(p, q) = -Σ_{x ∈ top-k(p) ∩ V_d} p(x) log q(x), which holds the
target's argmax (what greedy drafting must hit) and the runner-up mass (what sampled drafting needs).
The run folder holds `ckpt.pt` (model, optimizer, counters: a stopped run resumes), `curve.jsonl` (held-out
greedy acceptance against teacher tokens seen), `draft_vocab.json` and `segments.jsonl`: one line each time the
run is started with a new budget or on more teacher data (a run can be continued that way), which the model card
turns into the exact commands that reproduce it.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM, MambaConfig, MambaForCausalLM, PreTrainedModel

from specdec.distill.teacher import Shard, folder_part, load_shards, sampled_temperature
from specdec.vocab import load_draft_vocab


@dataclass
class TrainConfig:
    arch: str = "mamba"  # "mamba" | "transformer"
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
    init: str | None = None  # mamba-feat: a fresh run starts from this exported drafter folder (weights, V_d, size)


def reuse_freed_memory() -> bool:
    """Ask glibc (`mallopt`) to serve every allocation from its heap and keep freed memory for reuse.

    A training step allocates and frees tensors of 100+ MB; above glibc's mmap threshold (32 MiB at most) each is
    a fresh mapping whose pages fault in one at a time, and on this CPU that doubled the step time. Process-wide,
    so it is called by the `train` stage's own process only. Returns False where there is no glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_max = -1, -4
    return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))


def build_drafter(config: TrainConfig, vocab_size: int) -> PreTrainedModel:
    """A small Mamba or Llama-style drafter with a tied embedding; the two have comparable parameter counts."""
    if config.arch == "mamba":
        return MambaForCausalLM(MambaConfig(vocab_size=vocab_size, hidden_size=config.hidden, state_size=16,
                                            num_hidden_layers=config.mamba_layers, expand=2, conv_kernel=4,
                                            use_mambapy=True, tie_word_embeddings=True, bos_token_id=1,
                                            eos_token_id=2, pad_token_id=2))
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, hidden_size=config.hidden,
                                        intermediate_size=2 * config.hidden, num_hidden_layers=config.tf_layers,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                                        rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1,
                                        eos_token_id=2, pad_token_id=2))


def project_embedding(target_embedding: torch.Tensor, dim: int, std: float = 0.02) -> torch.Tensor:
    """E V_dim: the target's [V, D] embedding on its top-`dim` right singular vectors, [V, dim], scaled to `std`.

    The geometry (which tokens are close) is the target's; the scale is a fresh model's, so the tied output
    head starts near uniform instead of confidently wrong.
    """
    weight = target_embedding.float()
    _, _, vh = torch.linalg.svd(weight, full_matrices=False)  # vh [D, D]
    projected = weight @ vh[:dim].T  # [V, dim]
    return projected * (std / projected.std())


def choose_draft_vocab(shards: list[Shard], size: int, vocab_size: int, specials: int = 17) -> torch.Tensor:
    """V_d: the `size` ids the target most often ranks first in the training data, plus the special tokens.

    Ids never seen ranked first fill the remaining slots in id order (BPE ids come roughly in frequency order).
    """
    if size <= 0 or size >= vocab_size:
        return torch.arange(vocab_size)
    counts = -torch.arange(vocab_size) / vocab_size  # the tie-break: lower id first
    for shard in shards:
        top1 = shard["topk_ids"][shard["label"], 0].long()
        counts += torch.bincount(top1, minlength=vocab_size).float()
    counts[:specials] = float("inf")
    return counts.topk(size).indices.sort().values


class Stream:
    """One flat token stream (a data source) from which random training windows are cut."""

    def __init__(self, shards: list[Shard]) -> None:
        self.tokens = torch.cat([s["tokens"] for s in shards]).long()  # [N]
        self.label = torch.cat([s["known"] for s in shards])  # [N] positions with a teacher top-k
        self.topk_ids = torch.cat([s["topk_ids"] for s in shards]).long()  # [N, k]
        self.topk_logp = torch.cat([s["topk_logp"] for s in shards]).float()  # [N, k]

    def windows(self, n: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        starts = torch.randint(0, len(self.tokens) - length, (n,), generator=generator)
        index = starts[:, None] + torch.arange(length)  # [n, L]
        return self.tokens[index], self.label[index], self.topk_ids[index], self.topk_logp[index]


class SelectiveScan(torch.autograd.Function):
    """Mamba's selective scan with its own backward, one time step at a time on [b, d_in, n] blocks.

    h_t = exp(Δ_t A) h_{t-1} + (Δ_t x_t) B_t,  y_t = h_t C_t,  from h_{-1} = 0. Inputs time-major: Δ, x
    [l, b, d_in], A [d_in, n], B, C [l, b, n] -> y [l, b, d_in]. Each step's Ā_t is made and used while its
    block is in cache, never stored for all l (a [l, b, d_in, n] tensor is ~134 MB at training sizes); only the
    states h are kept for the backward, which runs in reverse time with g_t = dL/dh_t = C_t dy_t + Ā_{t+1} g_{t+1}
    and reads every other gradient off g_t: dB_t = Σ_d g_t u_t, du_t = g_t B_t (u = Δ x), dC_t = Σ_d h_t dy_t,
    and through Ā_t = exp(Δ_t A) with r_t = g_t h_{t-1} Ā_t: dΔ_t += Σ_n r_t A, dA += Σ_b r_t Δ_t.
    """

    @staticmethod
    def forward(ctx, dt: torch.Tensor, x: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                C: torch.Tensor) -> torch.Tensor:
        length = len(dt)
        u = dt * x  # [l, b, d]
        h = torch.empty(*u.shape, A.shape[1], dtype=u.dtype, device=u.device)  # [l, b, d, n]
        y = torch.empty_like(u)
        for t in range(length):
            a = torch.mul(dt[t, :, :, None], A).exp_()  # Ā_t [b, d, n]
            if t:
                torch.mul(a, h[t - 1], out=h[t])
                h[t].addcmul_(u[t, :, :, None], B[t, :, None, :])
            else:
                torch.mul(u[0, :, :, None], B[0, :, None, :], out=h[0])
            torch.bmm(h[t], C[t, :, :, None], out=y[t, :, :, None])
        ctx.save_for_backward(dt, x, A, B, C, u, h)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, ...]:
        dt, x, A, B, C, u, h = ctx.saved_tensors
        dy = dy.contiguous()
        du, d_dt = torch.empty_like(u), torch.zeros_like(u)
        dB, dC = torch.empty_like(B), torch.empty_like(C)
        r_dt = torch.zeros_like(h[0])  # Σ_t r_t Δ_t [b, d, n], summed over b into dA at the end
        g = a_next = None
        for t in range(len(dt) - 1, -1, -1):
            g_t = torch.mul(dy[t, :, :, None], C[t, :, None, :])  # [b, d, n]
            if g is not None:
                g_t.addcmul_(a_next, g)
            torch.bmm(dy[t, :, None, :], h[t], out=dC[t, :, None, :])
            torch.bmm(g_t, B[t, :, :, None], out=du[t, :, :, None])
            torch.bmm(u[t, :, None, :], g_t, out=dB[t, :, None, :])
            a = torch.mul(dt[t, :, :, None], A).exp_()
            if t:
                r = (g_t * a).mul_(h[t - 1])  # dL/d(Δ_t A)
                r_dt.addcmul_(r, dt[t, :, :, None])
                torch.sum(r.mul_(A), -1, out=d_dt[t])
            g, a_next = g_t, a
        d_dt.addcmul_(du, x)
        return d_dt, du * dt, r_dt.sum(0), dB, dC


def selective_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor) -> torch.Tensor:
    """y_t = C_t · h_t with h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t x_t (`SelectiveScan`, on time-major copies).

    x, dt (= Δ): [b, d_in, l]; A: [d_in, n]; B, C: [b, l, n] -> y [b, d_in, l].
    """
    y = SelectiveScan.apply(dt.permute(2, 0, 1).contiguous(), x.permute(2, 0, 1).contiguous(), A,
                            B.transpose(0, 1).contiguous(), C.transpose(0, 1).contiguous())  # [l, b, d_in]
    return y.permute(1, 2, 0)


def mixer_forward(mixer: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """A Hugging Face `MambaMixer` over a whole sequence (training path, no cache): [b, l, d] -> [b, l, d]."""
    length = hidden.shape[1]
    x, gate = mixer.in_proj(hidden).transpose(1, 2).chunk(2, dim=1)  # [b, d_in, l] each
    x = torch.nn.functional.silu(mixer.conv1d(x)[..., :length])  # causal depthwise conv
    step, B, C = torch.split(mixer.x_proj(x.transpose(1, 2)),
                             [mixer.time_step_rank, mixer.ssm_state_size, mixer.ssm_state_size], dim=-1)
    dt = torch.nn.functional.softplus(mixer.dt_proj(step)).transpose(1, 2)  # Δ [b, d_in, l]
    A = -torch.exp(mixer.A_log.float())  # [d_in, n]
    y = selective_scan(x, dt, A, B, C) + x * mixer.D[:, None]
    return mixer.out_proj((y * torch.nn.functional.silu(gate)).transpose(1, 2))


def mamba_hidden(model: MambaForCausalLM, input_ids: torch.Tensor) -> torch.Tensor:
    """Final hidden states [b, l, d] of a Mamba LM, as `model.backbone` computes them but trainable on a CPU."""
    backbone = model.backbone
    h = backbone.embeddings(input_ids)
    for block in backbone.layers:
        h = h + mixer_forward(block.mixer, block.norm(h))
    return backbone.norm_f(h)


def draft_logits(model: PreTrainedModel, input_ids: torch.Tensor, draft_ids: torch.Tensor) -> torch.Tensor:
    """Drafter logits over V_d only: final hidden state times the V_d rows of the tied embedding, [B, L, |V_d|]."""
    if model.config.model_type == "mamba":
        hidden = mamba_hidden(model, input_ids)  # [B, L, d]
    else:
        hidden = model.base_model(input_ids=input_ids).last_hidden_state  # [B, L, d]
    head = model.get_output_embeddings().weight[draft_ids]  # [|V_d|, d]
    return hidden @ head.T


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
def greedy_acceptance(model: PreTrainedModel, shards: list[Shard], draft_ids: torch.Tensor,
                      batch_size: int = 16) -> dict[str, float]:
    """Teacher-forced greedy per-token acceptance: how often argmax q equals the target's greedy token.

    On the target's own greedy answers the accepted prefix is always the target's text, so this is the chance a
    drafted token is accepted given that its prefix was.
    """
    hits: dict[str, list[int]] = {}
    sequences = [(s["domains"][i], s["tokens"][a:b].long(), s["label"][a:b])
                 for s in shards for i, (a, b) in enumerate(zip(s["starts"][:-1], s["starts"][1:]))]
    for start in range(0, len(sequences), batch_size):
        batch = sequences[start:start + batch_size]
        width = max(len(t) for _, t, _ in batch)
        ids = torch.full((len(batch), width), 2, dtype=torch.long)  # right padding never reaches earlier positions
        for row, (_, tokens, _) in enumerate(batch):
            ids[row, :len(tokens)] = tokens
        guess = draft_ids[draft_logits(model, ids, draft_ids).argmax(-1)]  # [B, W]
        for row, (domain, tokens, label) in enumerate(batch):
            pos = label[:-1].nonzero()[:, 0]
            correct = (guess[row, pos] == tokens[pos + 1]).long()
            counts = hits.setdefault(domain, [0, 0])
            counts[0] += int(correct.sum())
            counts[1] += len(pos)
    report = {domain: a / max(n, 1) for domain, (a, n) in sorted(hits.items())}
    report["all"] = sum(a for a, _ in hits.values()) / max(sum(n for _, n in hits.values()), 1)
    return report


def learning_rate(config: TrainConfig, step: int, progress: float) -> float:
    """Linear warm-up, then cosine decay to 10% over the budget (progress in [0, 1])."""
    warm = min(1.0, (step + 1) / config.warmup)
    return config.lr * warm * (0.1 + 0.45 * (1 + math.cos(math.pi * min(progress, 1.0))))


def _progress(config: TrainConfig, wall_s: float, tokens: int) -> float:
    by_time = wall_s / (config.minutes * 60)
    return max(by_time, tokens / config.max_tokens) if config.max_tokens else by_time


def _load_or_init(run: Path, config: TrainConfig, shards: list[Shard], target_embedding: torch.Tensor | None,
                  vocab_size: int) -> tuple[PreTrainedModel, torch.Tensor, dict | None]:
    """The run's checkpoint when there is one; else a fresh drafter, with V_d chosen from the training `shards`."""
    if (run / "ckpt.pt").exists():
        model, draft_ids, ckpt, _ = _restore(run)
        return model.train(), draft_ids, ckpt
    torch.manual_seed(config.seed)
    model = build_drafter(config, vocab_size)
    if target_embedding is not None:
        model.get_input_embeddings().weight.data.copy_(project_embedding(target_embedding, config.hidden))
    draft_ids = choose_draft_vocab(shards, config.draft_vocab, vocab_size)
    (run / "draft_vocab.json").write_text(json.dumps({"token_ids": draft_ids.tolist()}))
    (run / "train_config.json").write_text(json.dumps({**asdict(config), "vocab_size": vocab_size}, indent=1))
    return model, draft_ids, None


def _restore(run: Path) -> tuple[PreTrainedModel, torch.Tensor, dict, dict]:
    """(drafter with the last checkpoint's weights, V_d, the checkpoint, the run's saved TrainConfig fields)."""
    saved = json.loads((run / "train_config.json").read_text())
    model = build_drafter(TrainConfig(**{k: v for k, v in saved.items() if k != "vocab_size"}), saved["vocab_size"])
    ckpt = torch.load(run / "ckpt.pt", weights_only=False)
    model.load_state_dict(ckpt["model"])
    return model, load_draft_vocab(str(run)), ckpt, saved


def load_run(run: Path) -> tuple[PreTrainedModel, torch.Tensor, dict]:
    """The drafter of a run's last checkpoint, its V_d, and the run's counters (step, tokens, wall_s, ...)."""
    model, draft_ids, ckpt, saved = _restore(run)
    counters = {key: ckpt[key] for key in ("step", "tokens", "labelled", "wall_s")}
    config = {k: v for k, v in saved.items() if k != "vocab_size"}
    return model.eval(), draft_ids, {**counters, "config": config}


def _save(run: Path, model: PreTrainedModel, optimizer: torch.optim.Optimizer, state: dict) -> None:
    tmp = run / "ckpt.tmp"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), **state}, tmp)
    os.replace(tmp, run / "ckpt.pt")


SEGMENT_KEYS = ("minutes", "max_tokens", "seq_len", "batch_size", "lr", "response_share", "eval_every", "threads")


def response_folders(teacher: Path) -> list[Path]:
    """The training answers: `responses/train` (greedy), the greedy answers to later corpus parts
    `responses/train-part<K>`, then any sampled passes `responses/train-t<T>-<i>`."""
    return sorted(p for p in (teacher / "responses").glob("train*") if p.is_dir())


def _data_record(count: dict[str, int], text_shards: int) -> dict:
    """The data a segment trains on as the teacher's flags, from the shard count of each answer folder."""
    sampled = [name for name in count if name.startswith("train-t")]
    parts = {folder_part(name): n for name, n in count.items() if folder_part(name) is not None}
    record = {"response_shards": count.get("train", 0), "text_shards": text_shards}
    if parts:
        record["part_shards"] = {str(part): n for part, n in sorted(parts.items())}  # JSON keys are strings
    if sampled:
        record.update(sampled_passes=len(sampled), sampled_shards=sum(count[n] for n in sampled),
                      sampling_temperature=sampled_temperature(sampled[0]))
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


def _batch(streams: list[tuple[Stream, int]], config: TrainConfig, generator: torch.Generator) -> tuple:
    parts = [stream.windows(n, config.seq_len, generator) for stream, n in streams if n > 0]
    return tuple(torch.cat(group) for group in zip(*parts))


def vocab_lut(draft_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[V] slot of each token id in V_d, -1 outside it."""
    lut = torch.full((vocab_size,), -1, dtype=torch.long)
    lut[draft_ids] = torch.arange(len(draft_ids))
    return lut


def training_state(model: torch.nn.Module, config: TrainConfig,
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


def train(teacher: Path, run: Path, config: TrainConfig, target_embedding: torch.Tensor | None,
          vocab_size: int) -> PreTrainedModel:
    """Train (or resume) until the wall-time or token budget is spent; returns the drafter."""
    if config.threads:
        torch.set_num_threads(config.threads)
    run.mkdir(parents=True, exist_ok=True)
    answers = {folder.name: load_shards(folder) for folder in response_folders(teacher)}
    response_shards = [shard for shards in answers.values() for shard in shards]
    text_shards = load_shards(teacher / "text")
    data = _data_record({name: len(shards) for name, shards in answers.items()}, len(text_shards))
    model, draft_ids, ckpt = _load_or_init(run, config, response_shards + text_shards, target_embedding, vocab_size)
    lut = vocab_lut(draft_ids, vocab_size)
    optimizer, state, generator = training_state(model, config, ckpt)
    _log_segment(run, config, state, data, response_shards + text_shards)
    responses = Stream(response_shards)
    n_resp = round(config.batch_size * config.response_share) if text_shards else config.batch_size
    streams = [(responses, n_resp)] + ([(Stream(text_shards), config.batch_size - n_resp)] if text_shards else [])
    held_out = load_shards(teacher / "responses" / "eval")
    model.train()
    bar = tqdm(desc=f"train {config.arch}", unit="step", initial=state["step"])
    while _progress(config, state["wall_s"], state["tokens"]) < 1.0:
        tick = time.monotonic()
        ids, label, topk_ids, topk_logp = _batch(streams, config, generator)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(config, state["step"], _progress(config, state["wall_s"], state["tokens"]))
        loss = distill_loss(draft_logits(model, ids, draft_ids), label, topk_ids, topk_logp, lut)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        state["step"] += 1
        state["tokens"] += ids.numel()
        state["labelled"] += int(label.sum())
        state["wall_s"] += time.monotonic() - tick
        bar.update()
        bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{state['tokens'] / state['wall_s']:.0f}")
        done = _progress(config, state["wall_s"], state["tokens"]) >= 1.0
        if state["step"] % config.eval_every == 0 or done:
            _checkpoint(run, model, optimizer, state, generator, held_out, draft_ids, loss.item())
    model.eval()
    return model


def _checkpoint(run: Path, model: PreTrainedModel, optimizer: torch.optim.Optimizer, state: dict,
                generator: torch.Generator, held_out: list[Shard], draft_ids: torch.Tensor, loss: float) -> None:
    """Measure held-out greedy acceptance (the learning curve), then save everything needed to resume."""
    model.eval()
    acceptance = greedy_acceptance(model, held_out, draft_ids) if held_out else {}
    model.train()
    with open(run / "curve.jsonl", "a") as f:
        f.write(json.dumps({**state, "loss": loss, "acceptance": acceptance}) + "\n")
    _save(run, model, optimizer, {**state, "generator": generator.get_state()})
