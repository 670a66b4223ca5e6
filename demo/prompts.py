"""The example prompts in `assets/prompts/*.jsonl` (one `{"id", "kind", "prompt"}` object a line)."""

from __future__ import annotations

import json
from pathlib import Path

from specdec.passages import LONG_TOPICS, long_passage, summary_prompt

KINDS = ("chat", "code", "math", "summary")


def load_prompts(folder: Path) -> dict[str, list[dict]]:
    """Prompts grouped by kind, in file order; kinds listed in `KINDS` first."""
    groups: dict[str, list[dict]] = {}
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                item = json.loads(line)
                groups.setdefault(item["kind"], []).append(item)
    order = [k for k in KINDS if k in groups] + sorted(k for k in groups if k not in KINDS)
    return {k: groups[k] for k in order}


LONG_DOCUMENT = "long document"
LONG_DOCUMENT_TOKENS = (2000, 4000, 6000)  # one passage of about each length, a topic each
CHARS_PER_TOKEN = 4  # about, for this prose and SmolLM2's tokenizer: passages are cut by characters


def long_documents(max_chars: int) -> list[dict]:
    """The "Long document" examples: summaries of passages of the Python docs of about 2,000, 4,000 and 6,000
    tokens, built from the docs Python ships (nothing stored here); those longer than `max_chars` are left out."""
    items = []
    for tokens, topic in zip(LONG_DOCUMENT_TOKENS, LONG_TOPICS):
        prompt = summary_prompt(long_passage(topic, lambda text, n=tokens: len(text) >= n * CHARS_PER_TOKEN))
        if len(prompt) <= max_chars:
            items.append({"id": f"long-{tokens}", "kind": LONG_DOCUMENT, "prompt": prompt,
                          "label": f"Summarise the Python docs on {topic!r} (about {tokens:,} tokens)"})
    return items
