"""Learning curves of several training runs side by side (`python -m specdec.distill compare --runs a,b`).

Each run's `curve.jsonl` holds held-out teacher-forced greedy acceptance at every evaluation; the plug-in recipe
reports one number (`all`), the feature recipe two (`real`: the target's feature of the position before, what a
draft's first token reads; `guessed`: the drafter's own guesses, what deeper tokens read). Runs evaluated at the
same token counts line up row by row; a run with no point at a row's count leaves its cell empty.
"""

from __future__ import annotations

import json
from pathlib import Path


def read_curve(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "curve.jsonl").read_text().splitlines() if line.strip()]


def _columns(name: str, points: list[dict]) -> list[tuple[str, str]]:
    """(header, key in `acceptance`) of each acceptance column this run reports."""
    keys = [key for key in ("all", "real", "guessed") if key in points[-1]["acceptance"]]
    return [(f"{name}" if key == "all" else f"{name} ({'real feature' if key == 'real' else 'own guess'})", key)
            for key in keys]


def compare_table(runs: list[Path]) -> str:
    """A markdown table: tokens seen, then per run its acceptance columns and its training wall minutes."""
    curves = {run.name: {point["tokens"]: point for point in read_curve(run)} for run in runs}
    columns = [(name, header, key) for name, points in curves.items()
               for header, key in _columns(name, list(points.values()))]
    header = ["window tokens seen", *(h for _, h, _ in columns), *(f"{name} wall min" for name in curves)]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for tokens in sorted({t for points in curves.values() for t in points}):
        cells = [f"{tokens:,}"]
        for name, _, key in columns:
            point = curves[name].get(tokens)
            cells.append(f"{point['acceptance'][key]:.3f}" if point else "")
        for name in curves:
            point = curves[name].get(tokens)
            cells.append(f"{point['wall_s'] / 60:.1f}" if point else "")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)
