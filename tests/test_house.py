"""House rules a reader relies on, checked over the source: no function in the app, the engine or the demo is
longer than a screen (60 lines)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 60


def test_no_function_is_longer_than_sixty_lines():
    files = [ROOT / "app.py", *sorted((ROOT / "specdec").rglob("*.py")), *sorted((ROOT / "demo").rglob("*.py"))]
    long = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in files for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_LINES]
    assert not long, "split these functions:\n" + "\n".join(long)


def test_loading_models_does_not_import_the_drafters():
    """The import circle stays cut: `specdec.models` (presets, `load_model`, `LoadedModel`, `Models`) reaches the
    drafters only through the registry, when a drafter is loaded."""
    import subprocess
    import sys

    code = ("import sys, specdec.models; "
            "assert not [m for m in sys.modules if m.startswith('specdec.drafters')], 'specdec.models imported a drafter'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
