"""The real offline target, SmolLM2-135M-Instruct, in float32, with the shipped drafters: every method, the app's
default (mamba-ucb with the lookup branch) included, reproduces transformers' own greedy `generate`, up to EOS."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec.config import LOOKUP_BRANCH, GenerationConfig
from specdec.engine import generate
from specdec.models import ASSETS
from specdec.records import RoundRecord, Summary

ROOT = Path(__file__).resolve().parent.parent
MAX_NEW = 40
# (prompt, whether the target's greedy answer ends with EOS within MAX_NEW tokens); the last one repeats its prompt
PROMPTS = [("Write a Python function that checks whether a string is a palindrome.", False),
           ("Say hello.", True),
           ("Repeat after me: the quick brown fox jumps over the lazy dog.", True)]
# (method, tree, lookup branch, the drafter Summary.extra names); the app's default is mamba-ucb with the branch
CASES = [("mamba-chain", None, 0, "mamba-smollm2"), ("mamba-tree", "3,2,1", 0, "mamba-smollm2"),
         ("mamba-ucb", None, 0, "mamba-smollm2"), ("mamba-ucb", None, LOOKUP_BRANCH, "mamba-smollm2+lookup"),
         ("tf-chain", None, 0, "tf-smollm2"), ("tf-tree", "2,2,2", 0, "tf-smollm2"),
         ("tf-tree", None, LOOKUP_BRANCH, "tf-smollm2+lookup"), ("lookup-chain", None, 0, "lookup"),
         ("mamba-feat-ucb", None, 0, "mamba-feat-smollm2"),
         ("mamba-feat-tree", "2,2,1", LOOKUP_BRANCH, "mamba-feat-smollm2+lookup"),
         ("xmamba-ucb", None, 0, "xmamba-smollm2"), ("xmamba-tree", "2,2,1", LOOKUP_BRANCH, "xmamba-smollm2+lookup")]


@pytest.fixture(scope="module")
def fast_threads():
    torch.set_num_threads(2)  # a 135M model does use both cores
    yield
    torch.set_num_threads(1)


def _run(models, prompt, **kwargs) -> tuple[list[RoundRecord], Summary]:
    *rounds, summary = generate(models, prompt, GenerationConfig(max_new_tokens=MAX_NEW, **kwargs))
    return rounds, summary


@torch.inference_mode()
def _transformers_greedy(models, prompt: str) -> list[int]:
    """transformers' own greedy loop: the reference that shares no decoding code with the engine."""
    target = models.target
    chat = target.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                tokenize=True, return_dict=True)
    ids = torch.tensor([chat["input_ids"]])  # [1, L]
    out = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False,
                                pad_token_id=target.tokenizer.eos_token_id)  # [1, L + new]
    return out[0, ids.shape[1]:].tolist()


def test_the_shipped_drafters_are_loaded(smollm2):
    for kind, preset in (("mamba", "mamba-smollm2"), ("transformer", "tf-smollm2")):
        loaded = smollm2.drafter(kind)
        assert loaded.name == preset and loaded.source == str(ASSETS / "drafters" / preset)
        assert loaded.vocab_size == smollm2.target.vocab_size and not loaded.source.startswith("random")
    feat = smollm2.drafter("mamba-feat")
    assert feat.name == "mamba-feat-smollm2" and feat.source == str(ASSETS / "drafters" / "mamba-feat-smollm2")
    assert feat.model.config.target_hidden == smollm2.target.model.config.hidden_size
    cross = smollm2.drafter("xmamba")  # its own tokenizer, which is not the target's
    assert cross.name == "xmamba-smollm2" and cross.tokenizer.get_vocab() != smollm2.target.tokenizer.get_vocab()


def test_every_method_matches_transformers_greedy(smollm2, fast_threads):
    """Long: every method on the real target in float32, three prompts, each against transformers' greedy
    decoding; the float32 exactness check of the whole product."""
    tokenizer = smollm2.target.tokenizer
    accepted = {case[:3]: 0 for case in CASES}  # drafted tokens accepted, over all prompts
    copies = {case[:3]: 0 for case in CASES}  # nodes copied from the context and verified, over all prompts
    for prompt, ends in PROMPTS:
        reference = _transformers_greedy(smollm2, prompt)
        text = tokenizer.decode(reference, skip_special_tokens=True)
        assert (reference[-1] == tokenizer.eos_token_id) == ends and len(reference) <= MAX_NEW, prompt
        _, ar = _run(smollm2, prompt, method="ar")
        assert ar.token_ids == reference, prompt
        assert ar.stop_reason == ("eos" if ends else "max_new_tokens"), prompt
        for method, tree, lookup, drafter in CASES:
            rounds, sd = _run(smollm2, prompt, method=method, tree=tree, lookup_branch=lookup)
            case = (method, tree, lookup)
            assert sd.token_ids == reference, (prompt, case)
            assert sd.text == text == "".join(t.text for r in rounds for t in r.emitted), (prompt, case)
            assert sd.stop_reason == ar.stop_reason, (prompt, case)
            assert sd.extra["drafter"] == drafter, (prompt, case)  # the shipped drafter ran, not a random one
            accepted[case] += sd.accepted_tokens
            copies[case] += sum(n.copied for r in rounds for n in r.nodes)
    assert all(accepted.values()), accepted  # every method's drafts were used, the bandit's included
    assert all(copies[case[:3]] for case in CASES if case[2]), copies  # the lookup branch was grafted


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
    (["--prompt", "hi", "--target", "nobody/no-such-model"], "model 'nobody/no-such-model' cannot be loaded"),
    (["--prompt", "hi", "--target", "no-such-preset"], "unknown model 'no-such-preset'"),
    (["--prompt", "hi", "--method", "mamba-feat-chain", "--drafter", "no-such-drafter"],  # the method's own kind
     "unknown drafter 'no-such-drafter'"),
])
def test_cli_errors_are_one_clear_line(args, message, capsys):
    """In-process (`test_cli_json` runs the real command line): exit status 2 and one `error:` line, no traceback."""
    from specdec import cli

    assert cli.main(["generate", *args]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    error_lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1 and message in error_lines[0]
