"""Time one decode step of the verifier (`TreeLM.feed`, the split layout), of the same verifier in the block layout
(one masked attention call a layer, not row-invariant) and of transformers' own step (a `DynamicCache`) on the same
model at a given context, interleaved, and print the medians.

    .venv/bin/python scripts/decode_step.py [--dtype auto] [--context 400] [--steps 60]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

from specdec.verify import TreeLM
from specdec.models import Models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--context", type=int, default=400)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    model = Models(dtype=args.dtype).target.model
    prompt = torch.randint(100, 40000, (args.context,), generator=torch.Generator().manual_seed(0)).tolist()
    verifier, block = TreeLM(model), TreeLM(model, row_invariant=False)
    verifier.prefill(prompt)
    block.prefill(prompt)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True)

    def hf_step() -> None:
        with torch.inference_mode():
            model(input_ids=torch.tensor([[1234]]), past_key_values=cache, use_cache=True,
                  position_ids=torch.tensor([[cache.get_seq_length()]]))

    steps = {"TreeLM.feed (split layout)": lambda: verifier.feed([1234]),
             "TreeLM.feed (block layout)": lambda: block.feed([1234]), "transformers step": hf_step}
    times: dict[str, list[float]] = {name: [] for name in steps}
    for i in range(args.steps + 3):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            if i >= 3:  # warm-up
                times[name].append((time.perf_counter() - start) * 1e3)
    print(f"{str(model.dtype).removeprefix('torch.')}, {args.context} tokens of context, {args.steps} steps each")
    for name, ms in times.items():
        print(f"{name}: median {statistics.median(ms):.1f} ms, min {min(ms):.1f} ms")


if __name__ == "__main__":
    main()
