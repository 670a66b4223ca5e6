"""How often a node with two drafted children keeps one of them under sampling, when the second child is drawn
independently of the first (with replacement) and when it is drawn from q with the first child's token removed
(without replacement, what the engine does). Offline, over the target's answers in a teacher folder: per
position, with p the target's law at T on its stored top-k (the rest of p is not stored, so the figures are lower
bounds) and q the drafter's at the same T,

    first child kept     a1 = sum_x min(p(x), q(x))
    either, independent  a1 + (1 - a1) sum_x min(r(x), q(x)),              r = norm(max(0, p - q))
    either, distinct     a1 + sum_a max(0, q(a) - p(a)) sum_x min(r(x), q(x) / (1 - q(a)))   (x != a)

(a first child a is rejected with probability max(0, q(a) - p(a)) of drawing it and failing its test; r is 0
at a, and the second child comes from q less a).

    .venv/bin/python scripts/sibling_acceptance.py --drafter assets/drafters/mamba-smollm2 \
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

CHUNK = 32  # positions whose [positions, |V_d|, k] terms are formed at once


def node_chances(p: torch.Tensor, q_full: torch.Tensor, ids: torch.Tensor) -> tuple[float, float, float]:
    """p [n, k] on the target's top-k `ids` [n, k]; q_full [n, W] the drafter's law over its head's W tokens, with
    `ids` given as positions in that head (-1 where a top-k token is outside it) -> the three sums over n."""
    q = torch.where(ids >= 0, q_full.gather(1, ids.clamp_min(0)), 0.0)  # [n, k]
    a1 = torch.minimum(p, q).sum(-1)  # [n]
    r = (p - q).clamp_min(0.0)
    r = r / r.sum(-1, keepdim=True).clamp_min(1e-30)  # [n, k]; where p == q nothing is ever rejected
    independent = a1 + (1 - a1) * torch.minimum(r, q).sum(-1)
    # the first child a ranges over the whole head: where a is one of the top-k, q(a) - p(a); elsewhere p(a) = 0
    p_full = torch.zeros_like(q_full).scatter_add_(1, ids.clamp_min(0), torch.where(ids >= 0, p, 0.0))
    rejected = (q_full - p_full).clamp_min(0.0)  # [n, W] chance of drawing a and rejecting it
    scale = 1.0 / (1.0 - q_full).clamp_min(1e-12)  # [n, W] q(x) / (1 - q(a)) for the second child
    second = torch.minimum(r[:, None, :], q[:, None, :] * scale[:, :, None])  # [n, W, k]
    second = second - torch.where(ids[:, None, :] == torch.arange(q_full.shape[1])[None, :, None], second, 0.0)
    distinct = a1 + (rejected * second.sum(-1)).sum(-1)
    return float(a1.sum()), float(independent.sum()), float(distinct.sum())


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafter", required=True, help="a plug-in drafter folder (Mamba or Transformer)")
    parser.add_argument("--answers", required=True, help="a teacher folder of answer shards, e.g. responses/eval")
    parser.add_argument("--temperature", type=float, default=0.7, help="the target's and the drafter's, T")
    parser.add_argument("--shards", type=int, default=2, help="the first N shards of --answers")
    args = parser.parse_args()
    model = load_model(args.drafter, torch.device("cpu"), torch.float32, verified=False).model
    draft_ids = load_draft_vocab(args.drafter)  # None: the drafter's head scores every token
    sums, positions = [0.0, 0.0, 0.0], 0
    shards = [torch.load(path, weights_only=False) for path in sorted(Path(args.answers).glob("shard_*.pt"))[:args.shards]]
    for logits, slots, logp in answer_scores(model, shards, draft_ids):  # [n, |V_d|], [n, k], [n, k]
        q = torch.softmax(logits / args.temperature, -1)
        p = torch.softmax(logp / args.temperature, -1)
        for i in range(0, len(q), CHUNK):
            for j, value in enumerate(node_chances(p[i:i + CHUNK], q[i:i + CHUNK], slots[i:i + CHUNK])):
                sums[j] += value
        positions += len(q)
    print(f"{args.drafter} on {positions} answer positions of {args.answers} ({len(shards)} shards), T={args.temperature:g}")
    print("| a node's children | kept |\n|---|---|")
    for label, value in zip(("one child", "two, the second independent", "two, the second distinct"), sums):
        print(f"| {label} | {value / positions:.4f} |")


if __name__ == "__main__":
    main()
