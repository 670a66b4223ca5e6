"""Stage (d): measure a trained drafter, of any recipe, on held-out prompts that training never saw.

- teacher-forced greedy per-token acceptance on the target's held-out answers (per domain, or with the real and
  the guessed feature for the feature recipe);
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

from specdec import registry
from specdec.config import WHOLE_SHAPES, GenerationConfig
from specdec.distill.corpus import read_prompts
from specdec.distill.plugin import decode_step
from specdec.distill.recipe import greedy_acceptance, target_weights
from specdec.distill.teacher import Shard
from specdec.distill.train import held_out_folders, load_run, recipe_for
from specdec.engine import generate
from specdec.models import LoadedModel, Models
from specdec.records import Summary


def coverage(shards: list[Shard], draft_ids: torch.Tensor) -> float:
    """Fraction of the target's greedy answer tokens that lie in V_d."""
    tokens = torch.cat([s["tokens"][1:][s["label"][:-1]] for s in shards]).long()
    return float(torch.isin(tokens, draft_ids).float().mean())


@torch.inference_mode()
def ms_per_call(step: Callable[[], object], warmup: int = 5, calls: int = 40) -> float:
    for _ in range(warmup):
        step()
    tick = time.perf_counter()
    for _ in range(calls):
        step()
    return (time.perf_counter() - tick) / calls * 1e3


def run_engine(models: Models, method: str, prompts: list, max_new_tokens: int) -> list[Summary]:
    config = GenerationConfig(method=method, tree=None if method == "ar" else "4", temperature=0.0,
                              max_new_tokens=max_new_tokens, **WHOLE_SHAPES)  # whole chains: the drafter's own rate
    return [[r for r in generate(models, p.text, config) if isinstance(r, Summary)][0] for p in prompts]


def engine_report(models: Models, kind: str, prompts: list, max_new_tokens: int) -> dict:
    """Greedy chain-of-4 speculative decoding against target-only decoding on the same prompts."""
    method = next(method for method, policy in registry.kind(kind).methods.items() if policy == "chain")
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
    """Measure the run's last checkpoint; writes `run/eval.json` and the drafter folder it was measured from (the
    recipe's `engine_drafter`)."""
    model, draft_ids, counters = load_run(run)
    recipe = recipe_for(counters["config"]["arch"], *target_weights(target.model),
                        tokenizer=counters["config"].get("tokenizer"), target_tokenizer=target.tokenizer)
    held_out = [shard for folder in held_out_folders(teacher) for shard in recipe.load_shards(folder)]
    report = {"counters": {k: v for k, v in counters.items() if k != "config"},
              "teacher_forced": greedy_acceptance(recipe, model, held_out, draft_ids),
              "teacher_forced_by_domain": {domain: greedy_acceptance(recipe, model, held_out, draft_ids, domain)
                                           for domain in sorted({d for s in held_out for d in s["domains"]})},
              "coverage": coverage(held_out, draft_ids)}
    if recipe.full_head_figure:  # what an engine that ignores draft_vocab.json would get
        report["teacher_forced_full_head"] = greedy_acceptance(recipe, model, held_out,
                                                               torch.arange(model.config.vocab_size))
    drafter = recipe.engine_drafter(model, draft_ids, run, target)
    context = held_out[0]["tokens"][:64].tolist()
    latency = {"target_fp32": ms_per_call(decode_step(target.model, None, context))}
    for name, dtype in (("drafter_fp32", torch.float32), ("drafter_bf16", torch.bfloat16)):
        latency[name] = ms_per_call(recipe.decode_step(model.to(dtype), Path(drafter.source), target, context))
    model.float()
    latency["ratio_fp32"] = latency["drafter_fp32"] / latency["target_fp32"]
    latency["ratio_bf16"] = latency["drafter_bf16"] / latency["target_fp32"]
    report["latency_ms"] = latency
    single_turn = [p for p in read_prompts(teacher.parent / "corpus", "eval") if not p.history]  # the engine's kind
    prompts = [p for domain_prompts in _by_domain(single_turn).values() for p in domain_prompts[:prompts_per_domain]]
    models = Models.from_loaded(target, {recipe.kind: drafter})
    report["engine"] = engine_report(models, recipe.kind, prompts, max_new_tokens) if prompts else None
    (run / "eval.json").write_text(json.dumps(report, indent=1))
    return report


def _by_domain(prompts: list) -> dict[str, list]:
    groups: dict[str, list] = {}
    for prompt in prompts:
        groups.setdefault(prompt.domain, []).append(prompt)
    return groups
