"""Time the verifier's passes with other `SPLIT_BLOCK` values, interleaved in one process: a decode step, chains of
5 and 7 tokens and a (2,1,1) tree (7 nodes), each at every position of 64 consecutive ones after the context, so
that passes straddling a cut are counted as often as decoding meets them. Prints ms per decode step and each pass in
decode steps of its own block size.

    .venv/bin/python scripts/split_block.py [--blocks 16,32,64] [--contexts 400,2000,7600] [--dtype auto]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import specdec.verify.split as split
from specdec.verify import TreeLM
from specdec.verify.split import SPLIT_MARGIN
from specdec.models import Models

PASSES = {"chain 5": list(range(-1, 4)), "chain 7": list(range(-1, 6)), "tree (2,1,1)": [-1, 0, 0, 1, 2, 3, 4]}
POSITIONS = 64


def use_block(block: int) -> None:
    """The split layout's cut for passes planned from now on (a pass reads the module's constants)."""
    split.SPLIT_BLOCK, split.TAIL = block, block + SPLIT_MARGIN


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", default="16,32,64")
    parser.add_argument("--contexts", default="400,2000,7600")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    blocks = [int(b) for b in args.blocks.split(",")]
    model = Models(dtype=args.dtype).target.model
    print(f"{str(model.dtype).removeprefix('torch.')}; mean over {POSITIONS} consecutive positions\n")
    print("| context | block | step ms | " + " | ".join(PASSES) + " |")
    print("|---|---|---|" + "---|" * len(PASSES))
    for context in map(int, args.contexts.split(",")):
        tokens = torch.randint(100, 40000, (context + POSITIONS + 8,), generator=torch.Generator().manual_seed(0))
        tokens = tokens.tolist()
        verifiers = {}
        for block in blocks:
            use_block(block)
            verifiers[block] = TreeLM(model)
            verifiers[block].prefill(tokens[:context])
        times = {block: {name: [] for name in ["step", *PASSES]} for block in blocks}
        for position in range(POSITIONS + 1):  # position 0 warms up
            for block, lm in verifiers.items():
                use_block(block)
                start = lm.length
                for name, parents in {"step": [-1], **PASSES}.items():
                    began = time.perf_counter()
                    lm.extend(tokens[start: start + len(parents)], parents)
                    lm.commit([])
                    if position:
                        times[block][name].append((time.perf_counter() - began) * 1e3)
                lm.feed(tokens[start: start + 1])
        for block in blocks:
            step = statistics.mean(times[block]["step"])
            print(f"| {context} | {block} | {step:.1f} | "
                  + " | ".join(f"{statistics.mean(times[block][name]) / step:.2f}" for name in PASSES) + " |")


if __name__ == "__main__":
    main()
