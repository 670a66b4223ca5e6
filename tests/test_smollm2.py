"""The real offline target, SmolLM2-135M-Instruct, in float32: every method reproduces target-only greedy output."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec.config import GenerationConfig
from specdec.engine import generate

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["Write a Python function that checks whether a string is a palindrome.",
           "What is 17 times 23? Explain step by step."]
CASES = [("mamba-chain", None), ("mamba-tree", None), ("mamba-tree", "3,2,1"), ("mamba-ucb", None),
         ("tf-chain", None), ("tf-tree", "2,2,2"), ("lookup-chain", None)]


@pytest.fixture(scope="module")
def fast_threads():
    torch.set_num_threads(2)  # a 135M model does use both cores
    yield
    torch.set_num_threads(1)


def _ids(models, prompt, **kwargs):
    *_, summary = generate(models, prompt, GenerationConfig(max_new_tokens=32, **kwargs))
    return summary


@pytest.mark.parametrize("prompt", PROMPTS)
def test_every_method_matches_target_only_greedy(smollm2, fast_threads, prompt):
    ar = _ids(smollm2, prompt, method="ar")
    assert ar.new_tokens > 0
    for method, tree in CASES:
        sd = _ids(smollm2, prompt, method=method, tree=tree)
        assert sd.token_ids == ar.token_ids, (method, tree)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "specdec", "generate", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)


def test_cli_json(fast_threads):
    out = _cli("--prompt", "Name three colours.", "--method", "mamba-tree", "--tree", "2,2,1",
               "--max-new-tokens", "12", "--dtype", "float32", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    for key in ("text", "token_ids", "rounds", "tokens_per_s", "mean_accepted_len", "acceptance_rate"):
        assert key in result
    assert 0 < len(result["token_ids"]) <= 12 and result["rounds"] >= 1


@pytest.mark.parametrize("args, message", [
    (["--prompt", ""], "prompt is empty"),
    (["--prompt", "hi", "--max-new-tokens", "-5"], "max_new_tokens"),
    (["--prompt", "hi", "--max-new-tokens", "100000000"], "max_new_tokens"),
    (["--prompt", "hi", "--method", "mamba-tree", "--tree", "3,,1"], "malformed tree shape"),
    (["--prompt", "hi", "--target", "nobody/no-such-model"], "could not load model 'nobody/no-such-model'"),
    (["--prompt", "hi", "--target", "no-such-preset"], "unknown model 'no-such-preset'"),
])
def test_cli_errors_are_one_clear_line(args, message):
    out = _cli(*args)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    error_lines = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1 and message in error_lines[0]
