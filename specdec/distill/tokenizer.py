"""Stage `tokenizer`: a byte-level BPE of the drafter's own, trained with `tokenizers` on the corpus.

A drafter with another tokenizer than the target's (`--arch mamba --tokenizer FOLDER`, the engine's `xmamba`
kind) reads and writes its own tokens; the engine maps its branches onto the target's tokens
(`specdec.drafters.cross`). The BPE here is trained on the training prompts and the raw text of the corpus
(never the held-out prompts), with the byte-level alphabet the target's tokenizer uses, so the two vocabularies
overlap only where both learnt the same merges. The target's special tokens (its chat template's markers and
end of text) are the new tokenizer's first ids, so a templated prompt reads as the same markers in both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from specdec.distill.corpus import read_documents, read_prompts


def special_tokens(target: PreTrainedTokenizerBase) -> list[str]:
    """The target's special and added tokens, in its id order."""
    added = dict(target.get_added_vocab())
    for token in target.all_special_tokens:
        added.setdefault(token, target.convert_tokens_to_ids(token))
    return [token for token, _ in sorted(added.items(), key=lambda item: item[1])]


def training_texts(corpus: Path) -> Iterator[str]:
    """The corpus's training prompts and raw text (held-out prompts are left out)."""
    for prompt in read_prompts(corpus, "train"):
        yield prompt.text
    for doc in read_documents(corpus):
        yield doc["text"]


def train_tokenizer(corpus: Path, folder: Path, vocab_size: int, target: PreTrainedTokenizerBase) -> Path:
    """Train a byte-level BPE of `vocab_size` tokens on `corpus` and save it as a transformers tokenizer in
    `folder`; a folder that already holds one is kept (the stage is resumable like the others)."""
    if (folder / "tokenizer.json").is_file():
        return folder
    specials = special_tokens(target)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(training_texts(corpus), trainer)
    roles = {role: getattr(target, role) for role in ("eos_token", "bos_token", "unk_token", "pad_token")
             if getattr(target, role, None) in specials}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, **roles)
    tokenizer.chat_template = getattr(target, "chat_template", None)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    (folder / "trained_on.json").write_text(json.dumps({"corpus": str(corpus), "vocab_size": vocab_size}))
    return folder


def overlap(target: PreTrainedTokenizerBase, drafter: PreTrainedTokenizerBase) -> dict:
    """How much of each vocabulary the other holds (tokens with the same string)."""
    a, b = set(target.get_vocab()), set(drafter.get_vocab())
    shared = len(a & b)
    return {"shared": shared, "of_drafter": shared / len(b), "of_target": shared / len(a)}
