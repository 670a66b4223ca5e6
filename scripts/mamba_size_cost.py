"""What a Mamba drafter's size costs on this machine, before training one: for fresh drafters of the given state
sizes (and width, depth), the seconds of one training step (forward, backward and AdamW on a batch of windows,
as `distill train` runs it), the drafter's pass over a prompt (what `MambaDrafter.start` runs) and one batched
step of a few tree rows. Medians of --repeats timings, one thread by default.

    .venv/bin/python scripts/mamba_size_cost.py --state-sizes 16,32,64
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from specdec.distill.plugin import build_drafter, draft_logits  # noqa: E402
from specdec.distill.recipe import TrainConfig  # noqa: E402
from specdec.drafters.mamba import MambaDrafter  # noqa: E402

VOCAB = 49152  # SmolLM2's


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-sizes", default="16,32,64")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--draft-vocab", type=int, default=16384, help="the head's tokens")
    parser.add_argument("--train-batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=512, help="tokens of the drafter's pass over a prompt")
    parser.add_argument("--rows", type=int, default=4, help="tree rows stepped at once")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"| state | train step (s) | pass over {args.prompt} prompt tokens (ms) | step of {args.rows} rows (ms) |")
    print("|---|---|---|---|")
    for size in (int(n) for n in args.state_sizes.split(",")):
        torch.manual_seed(0)
        config = TrainConfig(arch="mamba", hidden=args.hidden, mamba_layers=args.layers, state_size=size)
        model = build_drafter(config, VOCAB)
        ids = torch.randint(0, VOCAB, (args.train_batch, args.seq_len))
        head = torch.arange(args.draft_vocab)
        optimizer = torch.optim.AdamW(model.parameters())

        def train_step() -> None:
            draft_logits(model, ids, head).logsumexp(-1).mean().backward()
            optimizer.step()
            optimizer.zero_grad()

        train_s = median_seconds(train_step, args.repeats)
        model.eval()
        drafter = MambaDrafter(model, VOCAB, head_ids=head)
        prompt = torch.randint(0, VOCAB, (args.prompt,)).tolist()
        prefill_s = median_seconds(lambda: drafter.prefill(prompt), args.repeats)
        state = drafter.stack.zeros(args.rows, drafter.device)
        tokens = torch.tensor(prompt[:args.rows])
        step_s = median_seconds(lambda: drafter.step(tokens, state), 10 * args.repeats)
        print(f"| {size} | {train_s:.2f} | {prefill_s * 1e3:.0f} | {step_s * 1e3:.2f} |", flush=True)


if __name__ == "__main__":
    main()
