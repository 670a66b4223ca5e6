"""Where a GPU token's time goes: `ar`, `mamba-ucb` and `mamba-chain` interleaved on the random SmolLM2-shaped
target of the GPU check (CUDA graphs off), transformers' own decode step, then `ar` under the torch profiler
(the top operations by host time and by GPU time), in float32 and bfloat16.

    PYTHONPATH=. python3 scripts/gpu_profile.py            # on a CUDA machine, about a minute
    PYTHONPATH=. python3 scripts/gpu_profile.py --cpu      # dry run on a tiny target
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import torch
from torch.profiler import ProfilerActivity, profile

from specdec import gpu_check as check
from specdec.models import LoadedModel, Models


def gpu_clocks(device: torch.device) -> str:
    if device.type != "cuda":
        return ""
    query = ["nvidia-smi", "--query-gpu=clocks.sm,utilization.gpu", "--format=csv,noheader"]
    try:
        return "  clocks, utilisation: " + subprocess.run(query, capture_output=True, text=True).stdout.strip()
    except OSError:  # no nvidia-smi on this machine
        return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="dry run on a tiny target")
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    device = torch.device("cpu" if args.cpu else "cuda")
    shape = check.TINY_TARGETS["tiny-llama"] if args.cpu else check.TARGETS["smollm2-135m"]
    prompt = check.check_prompt(300)
    for dtype in (torch.float32, torch.bfloat16):
        drafter, folder = check.shipped_drafter("mamba-smollm2", device, dtype)
        target = check.random_target(shape, device, dtype)
        plan = check.Plan.for_mode(args.cpu, None)
        t0 = time.perf_counter()
        print(f"{dtype}: transformers step {check.transformers_step_ms(target, list(range(100, 400)), plan):.2f} ms",
              flush=True)
        models = Models.from_loaded(LoadedModel("random", target, check.ByteTokenizer(), "random"),
                                    {"mamba": LoadedModel("mamba-smollm2", drafter, None, folder)})
        models.cuda_graphs = False
        for method in ("ar", "mamba-ucb", "ar", "mamba-chain", "ar"):
            check.run_generation(models, method, 8, prompt)  # warm-up
            rounds, summary = check.run_generation(models, method, args.tokens, prompt)
            print(f"{dtype} {method}: {summary.tokens_per_s:.1f} tok/s, verify "
                  f"{statistics.fmean(r.verify_ms for r in rounds):.2f} ms/round, draft "
                  f"{statistics.fmean(r.draft_ms for r in rounds):.2f} ms/round{gpu_clocks(device)}", flush=True)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            check.run_generation(models, "ar", 12, prompt)
        table = prof.key_averages()
        print(f"{dtype}: ar, 12 tokens under the profiler ({time.perf_counter() - t0:.0f} s so far)")
        print(table.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=50), flush=True)
        if device.type == "cuda":
            print(table.table(sort_by="self_cuda_time_total", row_limit=10, max_name_column_width=50), flush=True)
        del models, target, drafter
        check.free_memory(device)


if __name__ == "__main__":
    main()
