"""Draft-tree shapes and layouts.

A shape `T = (N1, ..., Nγ)` says that every node at depth i-1 gets `Ni` children; a chain of length γ is
`(1, ..., 1)`. Nodes are laid out breadth-first: node 0 is the root (the last emitted token), then the
`N1` depth-1 nodes, then the `N1*N2` depth-2 nodes (the children of one parent consecutive), and so on.

Glossary: `γ` depth, `n` number of nodes including the root, `parents[i]` index of node i's parent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from math import prod

MAX_DEPTH = 16
MAX_NODES = 256


@dataclass(frozen=True)
class TreeShape:
    widths: tuple[int, ...]  # (N1, ..., Nγ)

    def __post_init__(self) -> None:
        if any(not isinstance(w, int) or w < 1 for w in self.widths):
            raise ValueError(f"tree widths must be positive integers, got {self.widths}")
        if len(self.widths) > MAX_DEPTH:
            raise ValueError(f"tree depth {len(self.widths)} exceeds the maximum of {MAX_DEPTH}")
        if self.num_drafted > MAX_NODES:
            raise ValueError(f"tree {self.name} has {self.num_drafted} nodes, more than the maximum of {MAX_NODES}")

    @classmethod
    def chain(cls, gamma: int) -> TreeShape:
        return cls((1,) * gamma)

    @property
    def depth(self) -> int:  # γ(T)
        return len(self.widths)

    @property
    def is_chain(self) -> bool:
        return all(w == 1 for w in self.widths)

    @property
    def level_sizes(self) -> list[int]:
        """Number of nodes at depth 1..γ: [N1, N1*N2, ...]."""
        return [prod(self.widths[: i + 1]) for i in range(self.depth)]

    @property
    def num_drafted(self) -> int:
        return sum(self.level_sizes)

    @property
    def name(self) -> str:
        if not self.widths:
            return "none"
        if self.is_chain:
            return f"chain {self.depth}"
        return "(" + ",".join(map(str, self.widths)) + ")"

    @cached_property
    def parents(self) -> list[int]:
        """Breadth-first parent index of every node, the root's being -1."""
        parents = [-1]
        level_start, level_size = 0, 1
        for width in self.widths:
            for j in range(level_size):
                parents.extend([level_start + j] * width)
            level_start, level_size = level_start + level_size, level_size * width
        return parents

    @cached_property
    def depths(self) -> list[int]:
        return [0] + [d + 1 for d, size in enumerate(self.level_sizes) for _ in range(size)]


_WIDTHS = r"\s*\d+(\s*,\s*\d+)*\s*,?\s*"
_SHAPE_RE = re.compile(rf"^({_WIDTHS}|\({_WIDTHS}\))$")


def parse_shape(text: str | int | tuple[int, ...] | TreeShape) -> TreeShape:
    """`"4"` (or `"(4)"`) is a chain of 4; `"3,2,1"` or `"(3,2,1)"` is a tree; `0` means no drafting.

    A one-level tree of width 4 is written `"4,"`.
    """
    if isinstance(text, TreeShape):
        return text
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"chain length must be >= 0, got {text}")
        return TreeShape.chain(text)
    if isinstance(text, tuple):
        return TreeShape(tuple(text))
    s = str(text).strip()
    if not _SHAPE_RE.match(s):
        raise ValueError(
            f"malformed tree shape {text!r}: use a chain length like '4' or comma-separated widths like '3,2,1'"
        )
    numbers = [int(x) for x in re.findall(r"\d+", s)]
    if len(numbers) == 1 and "," not in s:
        return TreeShape.chain(numbers[0])
    return TreeShape(tuple(numbers))


def parse_arms(text: str | list) -> list[TreeShape]:
    """Bandit arms separated by ';' or whitespace, e.g. `"4; 2,2,1; 3,1,1"`.

    An arm `0` drafts nothing (a plain target step): the bandit can fall back to it when drafting does not pay.
    """
    items = text if isinstance(text, list) else [a for a in re.split(r"[;\s|]+", str(text).strip()) if a]
    if not items:
        raise ValueError("at least one bandit arm is needed")
    arms = [parse_shape(a) for a in items]
    if len(set(arms)) < len(arms):
        raise ValueError("bandit arms must differ from one another")
    return arms
