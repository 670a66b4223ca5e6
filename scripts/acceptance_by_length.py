"""Teacher-forced greedy acceptance of plug-in drafters by the length of the context before each answer: on the
target's held-out answers of a teacher folder (`python -m specdec.distill teacher`), how often each drafter's
argmax over its draft vocabulary is the target's next token, with the answers grouped by their prompt's length and
by domain.

    .venv/bin/python scripts/acceptance_by_length.py --teacher data/longdoc/teacher \
        --drafters assets/drafters/mamba-smollm2,data/longdoc/export/mamba-long

Each answer is read whole from a zero state (one sequence pass), as `distill evaluate` reads it.
"""

from __future__ import annotations

import argparse
from itertools import pairwise
from pathlib import Path

import torch

from specdec.distill.plugin import draft_logits
from specdec.distill.recipe import answers
from specdec.distill.teacher import load_shards
from specdec.models import load_model
from specdec.vocab import load_draft_vocab

EDGES = (0, 256, 1024, 4096, 16384)  # prompt tokens: the table's length groups


@torch.inference_mode()
def hits_per_answer(folder: str, held_out: list) -> list[tuple[int, int]]:
    """(accepted, drafted) per held-out answer for the drafter in `folder`."""
    model = load_model(folder, torch.device("cpu"), torch.float32, verified=False).model
    draft_ids = load_draft_vocab(folder)
    if draft_ids is None:
        draft_ids = torch.arange(model.get_output_embeddings().weight.shape[0])
    counts = []
    for answer in held_out:
        guess = draft_ids[draft_logits(model, answer.tokens[None], draft_ids)[0].argmax(-1)]  # [L]
        drafted = answer.drafted
        counts.append((int((guess[drafted] == answer.tokens[drafted + 1]).sum()), len(drafted)))
    return counts


def group_name(prompt_tokens: int) -> str:
    low, high = next((a, b) for a, b in pairwise(EDGES) if a <= prompt_tokens < b)
    return f"{low}-{high} tokens"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--teacher", required=True, help="a teacher folder with responses/eval")
    p.add_argument("--drafters", required=True, help="comma-separated plug-in drafter folders")
    args = p.parse_args()
    held_out = answers(load_shards(Path(args.teacher) / "responses" / "eval"))
    folders = args.drafters.split(",")
    results = {folder: hits_per_answer(folder, held_out) for folder in folders}
    lengths = [group_name(int(answer.drafted[0]) + 1) for answer in held_out]  # the prompt before each answer
    domains = [f"domain {answer.domain}" for answer in held_out]
    groups = {key: [i for i in range(len(held_out)) if key in (lengths[i], domains[i])]
              for key in [*[group_name(low) for low in EDGES[:-1]], *sorted(set(domains))]}
    groups = {key: rows for key, rows in groups.items() if rows} | {"all": list(range(len(held_out)))}
    print("| answers | count | " + " | ".join(folders) + " |")
    print("|---|---|" + "---|" * len(folders))
    for key in groups:
        cells = []
        for folder in folders:
            accepted = sum(results[folder][i][0] for i in groups[key])
            drafted = sum(results[folder][i][1] for i in groups[key])
            cells.append(f"{accepted / max(drafted, 1):.3f}")
        print(f"| {key} | {len(groups[key])} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
