"""How well the drafter's q predicts acceptance: greedy decoding with a wide fixed tree drafted whole
(`min_branch_q` 0), and for every drafted node whose parent was reached (the root or an accepted node), whether the
target accepted it, binned by the node's q and by its branch probability (the product of q along its branch).

    .venv/bin/python scripts/calibration.py [--method mamba-tree] [--tree 3,2,1,1,1,1] [--limit 12]

This is the measurement behind the trimming rule (`GenerationConfig.min_branch_q`, docs/method.md).
"""

from __future__ import annotations

import argparse
from itertools import pairwise

from specdec.bench import load_prompts
from specdec.config import WHOLE_SHAPES, GenerationConfig
from specdec.engine import generate
from specdec.models import Models
from specdec.records import RoundRecord

EDGES = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def reached_nodes(record: RoundRecord) -> list[tuple[float, float, bool]]:
    """(q, branch probability, accepted) of each drafted node whose parent was the root or accepted."""
    branch_q, rows = {0: 1.0}, []
    for node in record.nodes[1:]:
        branch_q[node.index] = branch_q[node.parent] * node.q
        if record.nodes[node.parent].status in ("root", "accepted"):
            rows.append((node.q, branch_q[node.index], node.status == "accepted"))
    return rows


def table(rows: list[tuple[float, float, bool]], column: int, title: str) -> str:
    lines = [f"| {title} | nodes | accepted |", "|---|---|---|"]
    for low, high in pairwise(EDGES):
        inside = [row for row in rows if low <= row[column] < high or (high == 1.0 and row[column] == 1.0)]
        if inside:
            share = sum(row[2] for row in inside) / len(inside)
            lines.append(f"| {low:.2f}-{high:.2f} | {len(inside)} | {share:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="mamba-tree")
    parser.add_argument("--tree", default="3,2,1,1,1,1")
    parser.add_argument("--limit", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    models = Models()
    config = GenerationConfig(method=args.method, tree=args.tree, max_new_tokens=args.max_new_tokens,
                              **WHOLE_SHAPES).validate()
    rows = [row for item in load_prompts(None, args.limit) for event in generate(models, item["prompt"], config)
            if isinstance(event, RoundRecord) for row in reached_nodes(event)]
    print(table(rows, 0, "q of the node") + "\n\n" + table(rows, 1, "branch probability"))


if __name__ == "__main__":
    main()
