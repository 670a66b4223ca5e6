"""What drawing a token costs, `specdec.sampling.sample` (inverse CDF) against `torch.multinomial`, in the two
places that sample over the target's vocabulary: the engine's sampled rounds (drafting and acceptance) and the
teacher's sampled answers. The two samplers run interleaved in one process; the engine's and the teacher's output
for a seed differs between them (other random streams), its law does not.

    .venv/bin/python scripts/sampler_cost.py engine [--methods ar,mamba-chain] [--temperature 0.7] [--repeats 2]
    .venv/bin/python scripts/sampler_cost.py teacher [--prompts 64] [--max-new-tokens 64] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from specdec import sampling  # noqa: E402
from specdec.config import GenerationConfig  # noqa: E402
from specdec.distill import teacher  # noqa: E402
from specdec.distill.corpus import build_prompts  # noqa: E402
from specdec.drafters import base  # noqa: E402
from specdec.engine import generate  # noqa: E402
from specdec.models import DEFAULT_TARGET, LoadedModel, Models, load_model  # noqa: E402
from specdec.records import Summary  # noqa: E402


def multinomial(probs: torch.Tensor, num_samples: int, generator: torch.Generator | None) -> torch.Tensor:
    flat = probs.reshape(-1, probs.shape[-1])
    draws = torch.multinomial(flat, num_samples, replacement=True, generator=generator)
    return draws.reshape(*probs.shape[:-1], num_samples)


SAMPLERS: dict[str, Callable] = {"inverse-cdf": sampling.sample, "torch.multinomial": multinomial}


@contextmanager
def sampler(name: str):
    """Every module that draws tokens uses SAMPLERS[name] inside the block."""
    modules = (sampling, base, teacher)
    for module in modules:
        module.sample = SAMPLERS[name]
    try:
        yield
    finally:
        for module in modules:
            module.sample = SAMPLERS["inverse-cdf"]


def engine(models: Models, args) -> None:
    with open(args.prompts) as f:
        prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    speeds: dict[tuple[str, str], list[float]] = {}
    rounds: dict[tuple[str, str], list[tuple[float, float, float]]] = {}  # (draft, verify, rest) ms of each round
    for repeat in range(args.repeats):
        for prompt in prompts:
            for method in args.methods.split(","):
                for name in SAMPLERS:
                    config = GenerationConfig(method=method, temperature=args.temperature,
                                              max_new_tokens=args.max_new_tokens, seed=repeat)
                    with sampler(name):
                        records = list(generate(models, prompt, config, details=False))
                    speeds.setdefault((method, name), []).append(records[-1].tokens_per_s)
                    rounds.setdefault((method, name), []).extend(
                        (r.draft_ms, r.verify_ms, r.round_ms - r.draft_ms - r.verify_ms)
                        for r in records if not isinstance(r, Summary))
    print(f"engine, temperature {args.temperature}, {len(prompts)} prompts x {args.repeats}, "
          f"{args.max_new_tokens} new tokens. tok/s: the median prompt's; the tokens differ between the samplers "
          f"(other random streams), so its acceptance does too. ms a round: means over all rounds, the rest "
          f"being the round less drafting and verification")
    print("| method | sampler | tok/s | ms a round: draft | verify | the rest (acceptance, commits) |\n"
          "|---|---|---|---|---|---|")
    for method in args.methods.split(","):
        for name in SAMPLERS:
            draft, verify, rest = (statistics.mean(column) for column in zip(*rounds[method, name]))
            print(f"| {method} | {name} | {statistics.median(speeds[method, name]):.1f} | {draft:.2f} | "
                  f"{verify:.2f} | {rest:.2f} |")


def teacher_rate(target: LoadedModel, args) -> None:
    prompts = build_prompts(args.prompts // 4 + 1, 0, seed=11)[:args.prompts]
    ids = [teacher.prompt_tokens(target.tokenizer, p) for p in prompts]
    rates: dict[str, list[float]] = {}
    for repeat in range(args.repeats):
        for name in SAMPLERS:
            with sampler(name):
                t0 = time.perf_counter()
                rows = teacher.generate_batch(target.model, target.tokenizer, prompts, args.max_new_tokens, 8,
                                              temperature=args.temperature,
                                              generator=torch.Generator().manual_seed(repeat), prompt_ids=ids)
                seconds = time.perf_counter() - t0
            labelled = sum(int(r["known"].sum()) for r in rows)
            rates.setdefault(name, []).append(labelled / seconds)
    print(f"teacher, {len(prompts)} prompts in one batch, temperature {args.temperature}, "
          f"{args.max_new_tokens} new tokens at most: labelled tokens/s, mean of {args.repeats}")
    for name, values in rates.items():
        print(f"| {name} | {statistics.mean(values):.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("engine", "teacher"))
    parser.add_argument("--prompts", default=None, help="engine: a JSONL file; teacher: how many prompts")
    parser.add_argument("--methods", default="ar,mamba-chain")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", default="float32", help="the engine's target's; the teacher's is the "
                                                           "`teacher` stage's `auto`")
    args = parser.parse_args()
    if args.what == "engine":
        args.prompts = args.prompts or "scripts/outside_prompts.jsonl"
        args.max_new_tokens = args.max_new_tokens or 128
        engine(Models(dtype=args.dtype), args)
    else:
        args.prompts = int(args.prompts or 64)
        args.max_new_tokens = args.max_new_tokens or 64
        target = load_model(DEFAULT_TARGET, torch.device("cpu"), teacher.teacher_dtype("auto"))  # as `teacher` loads it
        teacher_rate(target, args)


if __name__ == "__main__":
    main()
