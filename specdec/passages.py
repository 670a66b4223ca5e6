"""Long passages for long-context prompts: the longest sections of the Python documentation (`pydoc_data.topics`,
the same place as the distillation corpus's prose), which every Python installation ships, and licence texts,
which the corpus holds out."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

LONG_TOPICS = ("specialnames", "compound", "types")  # the longest sections, each over 9,000 tokens


def cut_at_paragraph(paragraphs: Iterable[str], long_enough: Callable[[str], bool]) -> tuple[str, bool]:
    """The paragraphs joined up to the first paragraph end where `long_enough(text)` holds -> (text, whether it
    held; else the text is all of them)."""
    text = ""
    for paragraph in paragraphs:
        text += paragraph + "\n\n"
        if long_enough(text):
            return text, True
    return text, False


def long_passage(topic: str, long_enough: Callable[[str], bool]) -> str:
    """The start of the section `topic`, cut at the first paragraph end where `long_enough(text)` holds."""
    import pydoc_data.topics

    text, held = cut_at_paragraph((p.strip() for p in pydoc_data.topics.topics[topic].split("\n\n")), long_enough)
    if not held:
        raise ValueError(f"the Python docs' topic {topic!r} is too short here")
    return text


def summary_prompt(passage: str) -> str:
    return f"Summarise this part of the Python documentation in a few sentences:\n\n{passage}"


EXAMPLE_TOKENS = (2000, 4000, 6000)  # the app's long-document examples: one passage of about each length, a topic each
CHARS_PER_TOKEN = 4  # about, for this prose and SmolLM2's tokenizer: the examples are cut by characters


def example_documents() -> list[dict]:
    """The app's "Long document" examples (`bench --long examples` measures these same prompts): summaries of
    passages of about 2,000, 4,000 and 6,000 tokens, cut by characters so that no tokenizer is needed."""
    return [{"id": f"long-{tokens}", "tokens": tokens, "topic": topic,
             "prompt": summary_prompt(long_passage(topic, lambda text, n=tokens: len(text) >= n * CHARS_PER_TOKEN))}
            for tokens, topic in zip(EXAMPLE_TOKENS, LONG_TOPICS)]


# Licence texts for long-context prompts of another kind than the corpus's: Debian's copies of common licences.
# The three below are what `bench --licences` measures; the distillation corpus never trains on them, nor on any
# text that shares more than `MEASURED_OVERLAP` of its 8-word shingles with one of them (`specdec.distill.corpus`).
LICENCES_FOLDER = Path("/usr/share/common-licenses")
MEASURED_LICENCES = ("Apache-2.0", "GPL-1", "GPL-2")
LICENCE_CHARS = 11_000  # each measured licence is cut at the first paragraph end past this (about 2,400 tokens)
MEASURED_OVERLAP = 0.01


def licence_text(name: str, folder: Path = LICENCES_FOLDER) -> str:
    path = folder / name
    if not path.is_file():
        raise ValueError(f"no licence text at {path} (Debian's base-files package installs them)")
    return path.read_text(encoding="utf-8", errors="replace")


def licence_prompt(passage: str) -> str:
    return f"Summarise this licence in a few sentences:\n\n{passage}"


def licence_prompts(folder: Path = LICENCES_FOLDER) -> list[dict]:
    """Summaries of the start of each measured licence (kind `licence`), for `bench --licences`."""
    prompts = []
    for name in MEASURED_LICENCES:
        paragraphs = (p.strip("\n") for p in licence_text(name, folder).split("\n\n"))  # indents kept
        text, _ = cut_at_paragraph(paragraphs, lambda t: len(t) >= LICENCE_CHARS)
        prompts.append({"id": f"licence-{name}", "kind": "licence", "prompt": licence_prompt(text.strip())})
    return prompts


def shingles(text: str, n: int = 8) -> set[int]:
    """Hashes of the text's n-word runs (lower case, punctuation kept): what two texts share verbatim."""
    words = text.lower().split()
    return {zlib.crc32(" ".join(words[i: i + n]).encode()) for i in range(max(0, len(words) - n + 1))}


def overlap(text: str, other: set[int]) -> float:
    """The share of `text`'s shingles found in `other` (a `shingles` set)."""
    own = shingles(text)
    return len(own & other) / len(own) if own else 0.0
