"""scripts/gpu_check.sh: the --cpu dry run writes a complete report; the CUDA-graph flag; failures exit non-zero."""

import json
import subprocess
from pathlib import Path

import pytest
import torch

from specdec import gpu_check
from specdec.drafters.cuda_graph import ENV_FLAG, graphs_enabled
from specdec.drafters.mamba import MambaDrafter
from tests.tiny import tiny_mamba

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """Long: the GPU check's own script end to end on the CPU, random targets of the real shapes included, as CI
    runs it; the tests below read its one report."""
    out = tmp_path_factory.mktemp("gpu_check")
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out), "--cpu"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    return done, out


def _rows(markdown: str, heading: str) -> list[list[str]]:
    """Data rows of the table under `heading`, as stripped cells."""
    section = markdown.split(heading, 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")][2:]  # past header and rule
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def _numbers(cells: list[str]) -> list[float]:
    return [float(cell) for cell in cells]  # raises on a cell that is not a number


def test_the_dry_run_passes_and_writes_the_report(dry_run):
    done, out = dry_run
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert {p.name for p in out.iterdir()} == {"gpu_check.md", "gpu_check.json", "cuda_tests.log"}
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["ok"] is True and report["mode"] == "cpu" and report["failures"] == []
    assert {"torch", "transformers", "device", "mamba_kernels"} <= set(report["environment"])
    tests = report["tests"]
    assert tests["returncode"] == 0 and tests["failed"] == 0 and tests["skipped"] > 0  # no GPU: skipped, not failed
    dtypes = {"float32", "bfloat16"}
    assert {(r["dtype"], r["batch"]) for r in report["drafter_step"]} == {(d, b) for d in dtypes
                                                                          for b in gpu_check.BATCHES}
    assert all(r["ms"] > 0 and r["cuda_graphs"] is False for r in report["drafter_step"])
    assert len(report["verify"]) == 2 and all(sorted(r["ms"], key=int) == [str(n) for n in range(1, 17)]
                                              and r["transformers_step_ms"] > 0 for r in report["verify"])
    rows = report["end_to_end"]
    assert {(r["dtype"], r["method"]) for r in rows} == {(d, m) for d in dtypes for m in gpu_check.METHODS}
    assert all(r["tokens_per_s"] > 0 and r["new_tokens"] == 12 for r in rows)
    assert all(r["identical_to_ar"] for r in rows if r["dtype"] == "float32")  # exact at a 49152-token vocabulary


def test_every_table_row_has_its_numbers(dry_run):
    _, out = dry_run
    md = (out / "gpu_check.md").read_text()
    steps = _rows(md, "## Mamba drafter step")
    assert len(steps) == 6 and all(_numbers(row[2:]) for row in steps)
    verify = _rows(md, "## Verification")
    assert len(verify) == 2 and all(len(_numbers(row[2:])) == 17 for row in verify)  # transformers step, n=1..16
    e2e = _rows(md, "## End to end")
    assert len(e2e) == 8 and all(len(_numbers(row[4:8])) == 4 and row[8] in ("yes", "no") for row in e2e)
    assert "every test passed and every row was measured" in md and "FAILED" not in md


def test_a_spent_budget_is_a_failure(tmp_path):
    """Nothing measured in time: each missing measurement is one line of the report, and the exit status is 1."""
    assert gpu_check.main([str(tmp_path), "--cpu", "--budget-s", "0", "--no-tests"]) == 1
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["ok"] is False and report["end_to_end"] == []
    assert len(report["failures"]) == 2 * (1 + 2)  # per dtype: drafter step, then verification and end to end
    assert all("budget was spent" in f for f in report["failures"])
    assert "- FAILED drafter step float32" in (tmp_path / "gpu_check.md").read_text()


def test_the_script_needs_an_output_folder():
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 2 and "usage: scripts/gpu_check.sh OUTDIR [--cpu]" in done.stderr


# --- the CUDA-graph flag (the graphs themselves are checked in tests/test_cuda.py) ---------------------------------
def test_cuda_graphs_are_on_by_default_on_cuda_only(monkeypatch):
    monkeypatch.delenv(ENV_FLAG, raising=False)
    assert graphs_enabled(torch.device("cuda"), None) and not graphs_enabled(torch.device("cpu"), None)
    monkeypatch.setenv(ENV_FLAG, "0")
    assert not graphs_enabled(torch.device("cuda"), None)
    assert graphs_enabled(torch.device("cuda"), True)  # an explicit request wins over the environment
    assert MambaDrafter(tiny_mamba(6, seed=1), 6).graphs is None  # CPU: the eager step


def test_cuda_graphs_on_a_cpu_are_refused():
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device; the drafter is on cpu"):
        MambaDrafter(tiny_mamba(6, seed=1), 6, cuda_graphs=True)
