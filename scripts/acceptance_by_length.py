"""Teacher-forced greedy acceptance of drafter folders by the length of the context before each answer: on the
target's held-out answers of a teacher folder (`python -m specdec.distill teacher`), how often each drafter's
argmax over its draft vocabulary is the target's next token, with the answers grouped by their prompt's length and
by domain.

    .venv/bin/python scripts/acceptance_by_length.py --teacher data/longdoc/teacher \
        --drafters assets/drafters/mamba-smollm2,assets/drafters/mamba-feat-smollm2,data/longdoc/export/mamba-long

Plug-in drafters (Mamba, Transformer) and feature drafters alike are read through their training recipe's own
teacher-forced pass (`Recipe.greedy`, what `distill evaluate` reports): each answer read whole from a zero state.
A feature drafter gives two columns, as its model card does: with the target's real feature of p-1 (a draft's
first token) and with its own guess of it (any deeper token). Its held-out answers need the target's features
(`python -m specdec.distill features --data DATA`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import cache
from itertools import pairwise
from pathlib import Path

import torch
from transformers import PreTrainedModel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from specdec.distill.recipe import Answer, answers, target_weights  # noqa: E402
from specdec.distill.train import recipe_for  # noqa: E402
from specdec.drafters.mamba_feat import MambaFeatModel, is_feat_folder  # noqa: E402
from specdec.models import DEFAULT_TARGET, Models, load_model  # noqa: E402
from specdec.vocab import load_draft_vocab  # noqa: E402

EDGES = (0, 256, 1024, 4096, 16384)  # prompt tokens: the table's length groups
COLUMNS = {"all": "", "real": ", real feature of p-1", "guessed": ", own guess"}  # the recipes' overall figures


@torch.inference_mode()
def hits_per_answer(folder: str, eval_folder: Path,
                    target: Callable[[], PreTrainedModel]) -> tuple[list[Answer], dict[str, list]]:
    """(the held-out answers, {column: (accepted, drafted) per answer}) for the drafter in `folder`; `target` gives
    the target model a feature drafter reads."""
    if is_feat_folder(folder):
        recipe = recipe_for("mamba-feat", *target_weights(target()))
        model = MambaFeatModel.load(Path(folder))
    else:
        model = load_model(folder, torch.device("cpu"), torch.float32, verified=False).model
        recipe = recipe_for("mamba" if model.config.model_type == "mamba" else "transformer")
    draft_ids = load_draft_vocab(folder)
    if draft_ids is None:
        draft_ids = torch.arange(model.get_output_embeddings().weight.shape[0])
    held_out = answers(recipe.load_shards(eval_folder))
    order = {id(answer): i for i, answer in enumerate(held_out)}
    counts: dict[str, list] = {}
    for start in range(0, len(held_out), recipe.eval_batch):
        for name, answer, guess in recipe.greedy(model, held_out[start:start + recipe.eval_batch], draft_ids):
            if name in COLUMNS:
                accepted = int((guess == answer.tokens[answer.drafted + 1]).sum())
                counts.setdefault(folder + COLUMNS[name], [None] * len(held_out))[order[id(answer)]] = \
                    (accepted, len(guess))
    return held_out, counts


def group_name(prompt_tokens: int) -> str:
    low, high = next((a, b) for a, b in pairwise(EDGES) if a <= prompt_tokens < b)
    return f"{low}-{high} tokens"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--teacher", required=True, help="a teacher folder with held-out answers (responses/eval)")
    p.add_argument("--drafters", required=True, help="comma-separated drafter folders (plug-in or feature)")
    p.add_argument("--target", default=DEFAULT_TARGET, help="the target whose features a feature drafter reads")
    p.add_argument("--held-out", default="eval", help="the folder of held-out answers under responses/ (e.g. "
                                                          "eval-part1, a later corpus part's)")
    args = p.parse_args()
    target = cache(lambda: Models(args.target).target.model)  # loaded once, if a feature drafter asks
    results: dict[str, list] = {}
    held_out: list[Answer] = []
    for folder in args.drafters.split(","):
        answers_read, counts = hits_per_answer(folder, Path(args.teacher) / "responses" / args.held_out, target)
        if held_out and len(answers_read) != len(held_out):
            raise SystemExit(f"{folder} read {len(answers_read)} held-out answers, the others {len(held_out)}: "
                             "a feature drafter reads only shards with features (the `features` stage)")
        held_out = answers_read
        results |= counts
    lengths = [group_name(int(answer.drafted[0]) + 1) for answer in held_out]  # the prompt before each answer
    domains = [f"domain {answer.domain}" for answer in held_out]
    groups = {key: [i for i in range(len(held_out)) if key in (lengths[i], domains[i])]
              for key in [*[group_name(low) for low in EDGES[:-1]], *sorted(set(domains))]}
    groups = {key: rows for key, rows in groups.items() if rows} | {"all": list(range(len(held_out)))}
    print("| answers | count | " + " | ".join(results) + " |")
    print("|---|---|" + "---|" * len(results))
    for key, rows in groups.items():
        cells = []
        for column in results.values():
            accepted, drafted = sum(column[i][0] for i in rows), sum(column[i][1] for i in rows)
            cells.append(f"{accepted / max(drafted, 1):.3f}")
        print(f"| {key} | {len(rows)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
