"""Long passages for long-context prompts: the longest sections of the Python documentation (`pydoc_data.topics`,
the same place as the distillation corpus's prose), which every Python installation ships."""

from __future__ import annotations

from collections.abc import Callable

LONG_TOPICS = ("specialnames", "compound", "types")  # the longest sections, each over 9,000 tokens


def long_passage(topic: str, long_enough: Callable[[str], bool]) -> str:
    """The start of the section `topic`, cut at the first paragraph end where `long_enough(text)` holds."""
    import pydoc_data.topics

    text = ""
    for paragraph in pydoc_data.topics.topics[topic].split("\n\n"):
        text += paragraph.strip() + "\n\n"
        if long_enough(text):
            return text
    raise ValueError(f"the Python docs' topic {topic!r} is too short here")


def summary_prompt(passage: str) -> str:
    return f"Summarise this part of the Python documentation in a few sentences:\n\n{passage}"
