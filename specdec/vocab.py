"""Vocabulary plumbing between a drafter and the target: widths, reduced draft heads.

`V` is the target's logits width. A drafter's logits are brought to `[..., V]`; token ids the drafter does not
score get -inf, so `q` is 0 there and acceptance stays exact.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


def load_draft_vocab(folder: str | None) -> torch.Tensor | None:
    """Token ids of a reduced draft head, from `draft_vocab.json` ({"token_ids": [...]}) beside the weights."""
    path = Path(folder) / "draft_vocab.json" if folder else None
    if path is None or not path.is_file():
        return None
    return torch.tensor(json.loads(path.read_text())["token_ids"], dtype=torch.long)


def scatter_head(scores: torch.Tensor, head_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Scores over the head's ids [..., H] -> logits over the target's vocabulary [..., V], -inf elsewhere (q = 0)."""
    full = scores.new_full((*scores.shape[:-1], vocab_size), float("-inf"))
    return full.index_copy_(-1, head_ids, scores)


def fit_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Pad (with -inf) or cut drafter logits [..., V_d] to the target's width V: ids the drafter lacks get q = 0."""
    width = logits.shape[-1]
    if width == vocab_size:
        return logits
    if width > vocab_size:
        return logits[..., :vocab_size]
    pad = logits.new_full((*logits.shape[:-1], vocab_size - width), float("-inf"))
    return torch.cat([logits, pad], dim=-1)
