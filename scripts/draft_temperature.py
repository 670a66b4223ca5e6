"""How often a drafter's first guess would be kept under sampling, by the temperature it drafts at: on the
target's answers in a teacher folder, the chance that one draw from the drafter's q at T' is accepted by the
target's p at T, sum_x min(p_T(x), q_T'(x)), over the target's stored top-k (the rest of p is not stored, so
the figure is a lower bound), beside argmax drafting's p_T(argmax q). Speculative sampling stays exact at any T',
since acceptance uses the q the draft came from.

    .venv/bin/python scripts/draft_temperature.py --drafter assets/drafters/mamba-smollm2 \
        --answers data/scale/teacher/responses/train-t0.7-0 --temperature 0.7 --shards 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from specdec.distill.plugin import answer_scores  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.vocab import load_draft_vocab  # noqa: E402


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafter", required=True, help="a plug-in drafter folder (Mamba or Transformer)")
    parser.add_argument("--answers", required=True, help="a teacher folder of answer shards, e.g. responses/eval")
    parser.add_argument("--temperature", type=float, default=0.7, help="the target's, T")
    parser.add_argument("--draft-temperatures", default="0.4,0.5,0.6,0.7,0.8", help="T' to try")
    parser.add_argument("--shards", type=int, default=2, help="the first N shards of --answers")
    args = parser.parse_args()
    model = load_model(args.drafter, torch.device("cpu"), torch.float32, verified=False).model
    draft_ids = load_draft_vocab(args.drafter)  # None: the drafter's head scores every token
    temperatures = [float(t) for t in args.draft_temperatures.split(",")]
    kept, argmax_kept, positions = dict.fromkeys(temperatures, 0.0), 0.0, 0
    shards = [torch.load(path, weights_only=False) for path in sorted(Path(args.answers).glob("shard_*.pt"))[:args.shards]]
    for logits, slots, logp in answer_scores(model, shards, draft_ids):  # [n, |V_d|], [n, k], [n, k]
        p = torch.softmax(logp / args.temperature, -1)  # p_T on the top-k
        for t in temperatures:
            q = torch.softmax(logits / t, -1)
            kept[t] += torch.minimum(p, torch.where(slots >= 0, q.gather(1, slots.clamp_min(0)), 0.0)).sum().item()
        argmax_kept += (p * (slots == logits.argmax(-1, keepdim=True))).sum().item()
        positions += len(logits)
    print(f"{args.drafter} on {positions} answer positions of {args.answers} ({len(shards)} shards), "
          f"target at T={args.temperature:g}")
    print("| drafting | first guess kept |\n|---|---|")
    for t in temperatures:
        print(f"| sampled at T'={t:g} | {kept[t] / positions:.4f} |")
    print(f"| argmax | {argmax_kept / positions:.4f} |")


if __name__ == "__main__":
    main()
