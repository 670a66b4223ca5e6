"""What the bandit did, round by round: one `*-ucb` method and one fixed shape on the same prompts, at a temperature.

Prints each method's engine tokens per second, how many rounds each arm took, each arm's median round and how often
its first drafted token was kept, and the arms in order, one letter a round ("." for arm "0", no drafting; else the
arm name's first character). One bandit serves all the prompts, as the app keeps one per browser session.

    .venv/bin/python scripts/bandit_trace.py [--temperature 0.7] [--dtype auto] [--methods mamba-ucb,mamba-chain]
        [--prompts scripts/outside_prompts.jsonl]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec.bandit import UCBBandit  # noqa: E402
from specdec.config import GenerationConfig  # noqa: E402
from specdec.engine import generate  # noqa: E402
from specdec.models import Models  # noqa: E402
from specdec.records import Summary  # noqa: E402

PROMPTS = [  # everyday prompts; the first is also a bench prompt, the third a code task of the distillation corpus
    "Give me three tips for staying focused while studying at home.",
    "Explain how a refrigerator keeps food cold.",
    "Write a Python function that counts the vowels in a string.",
    "What are the main differences between a crocodile and an alligator?",
    "Write a short poem about autumn rain.",
    "How do I make a good cup of tea?",
]


def trace(models: Models, method: str, temperature: float, max_new_tokens: int, prompts: list[str]) -> None:
    config = GenerationConfig(method=method, temperature=temperature, max_new_tokens=max_new_tokens, seed=1)
    bandit = UCBBandit.for_config(config) if method.endswith("-ucb") else None
    round_ms, accepted, letters = collections.defaultdict(list), collections.defaultdict(list), []
    tokens = seconds = 0.0
    for prompt in prompts:
        for item in generate(models, prompt, config, bandit=bandit, details=False):
            if isinstance(item, Summary):
                tokens, seconds = tokens + item.new_tokens, seconds + item.engine_seconds
                continue
            round_ms[item.shape_name].append(item.round_ms)
            accepted[item.shape_name].append(item.accepted_len)
            letters.append(item.shape_name[0] if item.shape else ".")
    print(f"{method} at temperature {temperature}: {tokens / seconds:.1f} tok/s")
    print("| arm | rounds | median round ms | first drafted token kept | tokens a round | tok/s of its rounds |\n"
          "|---|---|---|---|---|---|")
    for arm, times in round_ms.items():
        kept = f"{sum(a > 0 for a in accepted[arm]) / len(times):.2f}" if arm != "none" else "-"
        per_round = 1 + statistics.mean(accepted[arm])
        rate = 1e3 * (len(times) + sum(accepted[arm])) / sum(times)
        print(f"| {arm} | {len(times)} | {statistics.median(times):.1f} | {kept} | {per_round:.2f} | {rate:.1f} |")
    print("".join(letters), "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="mamba-ucb,mamba-chain")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--prompts", type=Path, help="a JSONL file of {\"prompt\": ...} lines instead of PROMPTS")
    args = parser.parse_args()
    prompts = [json.loads(line)["prompt"] for line in args.prompts.read_text().splitlines()] if args.prompts else PROMPTS
    models = Models(dtype=args.dtype)
    models.load()
    for method in args.methods.split(","):
        trace(models, method, args.temperature, args.max_new_tokens, prompts)


if __name__ == "__main__":
    main()
