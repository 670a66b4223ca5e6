"""The example prompts in `assets/prompts/*.jsonl` (one `{"id", "kind", "prompt"}` object a line)."""

from __future__ import annotations

import json
from pathlib import Path

from specdec.passages import example_documents

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


def long_documents(max_chars: int) -> list[dict]:
    """The "Long document" examples (`specdec.passages.example_documents`, built from the docs Python ships, nothing
    stored here); those longer than `max_chars` are left out."""
    return [{"id": doc["id"], "kind": LONG_DOCUMENT, "prompt": doc["prompt"],
             "label": f"Summarise the Python docs on {doc['topic']!r} (about {doc['tokens']:,} tokens)"}
            for doc in example_documents() if len(doc["prompt"]) <= max_chars]
