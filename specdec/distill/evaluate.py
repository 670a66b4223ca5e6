"""Stage (d): measure a trained drafter on held-out prompts that training never saw.

- teacher-forced greedy per-token acceptance on the target's held-out answers, per domain;
- coverage of the draft vocabulary V_d (no drafter can beat it under greedy decoding);
- through the engine (`specdec.engine.generate`, greedy, chain of 4): acceptance rate, mean accepted length,
  tokens/s against target-only decoding, and whether the outputs are identical (they must be);
- step latency at batch 1: the drafter's step (fp32 and bf16) against the target's decode step (fp32).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import PreTrainedModel

from specdec.config import GenerationConfig
from specdec.distill.corpus import read_prompts
from specdec.distill.export import save_drafter
from specdec.distill.teacher import Shard, load_shards
from specdec.distill.train import greedy_acceptance, load_run
from specdec.drafters.mamba import MambaDrafter, MambaState
from specdec.engine import generate
from specdec.kvcache import TreeLM
from specdec.models import LoadedModel, Models
from specdec.records import Summary


def coverage(shards: list[Shard], draft_ids: torch.Tensor) -> float:
    """Fraction of the target's greedy answer tokens that lie in V_d."""
    tokens = torch.cat([s["tokens"][1:][s["label"][:-1]] for s in shards]).long()
    return float(torch.isin(tokens, draft_ids).float().mean())


def _ms_per_call(step: Callable[[], object], warmup: int = 5, calls: int = 40) -> float:
    for _ in range(warmup):
        step()
    tick = time.perf_counter()
    for _ in range(calls):
        step()
    return (time.perf_counter() - tick) / calls * 1e3


@torch.inference_mode()
def step_latency_ms(model: PreTrainedModel, folder: Path | None, context: list[int]) -> float:
    """One batch-1 decode step after `context`: the engine's Mamba step, or a KV-cached forward of one token."""
    if model.config.model_type == "mamba":
        drafter = MambaDrafter.from_folder(model, model.config.vocab_size, str(folder) if folder else None)
        state, token = MambaState.zeros(model, 1), torch.tensor([context[-1]])
        return _ms_per_call(lambda: drafter.step(token, state))
    lm = TreeLM(model)
    lm.feed(context)
    return _ms_per_call(lambda: lm.feed([context[-1]]))


def run_engine(models: Models, method: str, prompts: list, max_new_tokens: int) -> list[Summary]:
    config = GenerationConfig(method=method, tree=None if method == "ar" else "4", temperature=0.0,
                              max_new_tokens=max_new_tokens)
    return [[r for r in generate(models, p.text, config) if isinstance(r, Summary)][0] for p in prompts]


def engine_report(models: Models, kind: str, prompts: list, max_new_tokens: int) -> dict:
    """Greedy chain-of-4 speculative decoding against target-only decoding on the same prompts."""
    method = {"mamba": "mamba-chain", "mamba-feat": "mamba-feat-chain"}.get(kind, "tf-chain")
    sd = run_engine(models, method, prompts, max_new_tokens)
    ar = run_engine(models, "ar", prompts, max_new_tokens)
    by_domain: dict[str, list[float]] = {}
    for prompt, summary in zip(prompts, sd):
        if summary.acceptance_rate is not None:
            by_domain.setdefault(prompt.domain, []).append(summary.acceptance_rate)
    sd_s, ar_s = sum(s.seconds for s in sd), sum(s.seconds for s in ar)
    sd_tokens, ar_tokens = sum(s.new_tokens for s in sd), sum(s.new_tokens for s in ar)
    return {
        "method": method, "tree": "4", "prompts": len(prompts), "max_new_tokens": max_new_tokens,
        "acceptance_rate": statistics.mean(r for rates in by_domain.values() for r in rates),
        "by_domain": {d: statistics.mean(r) for d, r in sorted(by_domain.items())},
        "mean_accepted_len": sum(s.new_tokens for s in sd) / sum(s.rounds for s in sd),
        "sd_tokens_per_s": sd_tokens / sd_s, "ar_tokens_per_s": ar_tokens / ar_s,
        "speedup": (sd_tokens / sd_s) / (ar_tokens / ar_s),
        "identical": all(a.token_ids == b.token_ids for a, b in zip(sd, ar)),
    }


def evaluate(target: LoadedModel, teacher: Path, run: Path, prompts_per_domain: int, max_new_tokens: int) -> dict:
    """Measure the run's last checkpoint; writes `run/eval.json` and the HF folder `run/hf` it was measured from."""
    model, draft_ids, counters = load_run(run)
    held_out = load_shards(teacher / "responses" / "eval")
    report = {"counters": {k: v for k, v in counters.items() if k != "config"},
              "teacher_forced": greedy_acceptance(model, held_out, draft_ids),
              "coverage": coverage(held_out, draft_ids)}
    folder = save_drafter(model, draft_ids, target.tokenizer, run / "hf")
    kind = "mamba" if model.config.model_type == "mamba" else "transformer"
    if kind == "transformer":  # what an engine that ignores draft_vocab.json would get
        report["teacher_forced_full_head"] = greedy_acceptance(model, held_out, torch.arange(model.config.vocab_size))
    drafter = LoadedModel(run.name, model.float().eval(), target.tokenizer, str(folder))  # reads draft_vocab.json
    context = held_out[0]["tokens"][:64].tolist()
    report["latency_ms"] = {"target_fp32": step_latency_ms(target.model, None, context),
                            "drafter_fp32": step_latency_ms(drafter.model, folder, context),
                            "drafter_bf16": step_latency_ms(model.to(torch.bfloat16), folder, context)}
    model.float()
    report["latency_ms"]["ratio_fp32"] = report["latency_ms"]["drafter_fp32"] / report["latency_ms"]["target_fp32"]
    prompts = [p for domain_prompts in _by_domain(read_prompts(teacher.parent / "corpus", "eval")).values()
               for p in domain_prompts[:prompts_per_domain]]
    models = Models.from_loaded(target, {"mamba" if kind == "mamba" else "transformer": drafter})
    report["engine"] = engine_report(models, kind, prompts, max_new_tokens) if prompts else None
    (run / "eval.json").write_text(json.dumps(report, indent=1))
    return report


def _by_domain(prompts: list) -> dict[str, list]:
    groups: dict[str, list] = {}
    for prompt in prompts:
        groups.setdefault(prompt.domain, []).append(prompt)
    return groups
