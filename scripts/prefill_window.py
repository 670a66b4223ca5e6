"""What a Mamba drafter loses by reading only the last W tokens of a long prompt: teacher-forced greedy acceptance
on the target's held-out answers to prompts of at least --min-prompt tokens, the drafter reading the whole prompt
or only its last W tokens before the answer (the engine's `MambaDrafter.prefill_window`).

    .venv/bin/python scripts/prefill_window.py --drafter assets/drafters/mamba-smollm2 \
        --teacher data/scale/teacher --windows 256,512,1024
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from specdec.distill.plugin import draft_argmax  # noqa: E402
from specdec.distill.recipe import answers  # noqa: E402
from specdec.distill.train import held_out_folders  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.vocab import load_draft_vocab  # noqa: E402


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafter", required=True, help="a Mamba (or Transformer) plug-in drafter folder")
    parser.add_argument("--teacher", type=Path, required=True, help="a teacher folder with held-out answers")
    parser.add_argument("--windows", default="256,512,1024", help="prompt tokens the drafter reads, W")
    parser.add_argument("--min-prompt", type=int, default=1024, help="answers to prompts of at least this many tokens")
    args = parser.parse_args()
    model = load_model(args.drafter, torch.device("cpu"), torch.float32, verified=False).model
    draft_ids = load_draft_vocab(args.drafter)
    if draft_ids is None:
        draft_ids = torch.arange(model.config.vocab_size)
    windows = [int(w) for w in args.windows.split(",")]
    hits, drafted, prompts, chosen = dict.fromkeys(["whole", *windows], 0), 0, [], 0
    for folder in held_out_folders(args.teacher):
        for answer in answers([torch.load(p, weights_only=False) for p in sorted(folder.glob("shard_*.pt"))]):
            first = int(answer.label.nonzero()[0, 0])  # the answer's first token; the prompt is before it
            if first < args.min_prompt:
                continue
            chosen += 1
            prompts.append(first)
            positions = answer.drafted  # [n] positions whose next token is an answer token
            truth = answer.tokens[positions + 1]
            guess = draft_argmax(model, answer.tokens[None], draft_ids)[0]
            hits["whole"] += int((guess[positions] == truth).sum())
            for w in windows:
                cut = first - w  # the drafter starts from a zero state this many tokens in
                guess = draft_argmax(model, answer.tokens[None, cut:], draft_ids)[0]
                hits[w] += int((guess[positions - cut] == truth).sum())
            drafted += len(positions)
    print(f"{args.drafter}: {chosen} held-out answers to prompts of {min(prompts)}-{max(prompts)} tokens, "
          f"{drafted} drafted positions")
    print("| the drafter reads | greedy acceptance |\n|---|---|")
    for key, value in hits.items():
        label = "the whole prompt" if key == "whole" else f"the last {key} prompt tokens"
        print(f"| {label} | {value / drafted:.4f} |")


if __name__ == "__main__":
    main()
