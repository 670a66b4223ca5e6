"""The Space's build files (Dockerfile, .dockerignore, .gitattributes) and a drafter export without a tokenizer.

Building and serving the image is `make space-image` / `make space-smoke` (podman, minutes), not a test here.
"""

import fnmatch
import json
import re
import subprocess
from pathlib import Path

import pytest
import torch

from specdec.distill import teacher
from specdec.distill.export import export
from specdec.distill.train import TrainConfig, train
from tests.test_distill import VOCAB, data  # noqa: F401 (`data` is a fixture: the tiny teacher shards)

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()
TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"}


def instructions(text: str) -> list[list[str]]:
    """The Dockerfile's instructions as word lists (continuation lines joined, comments dropped)."""
    joined = re.sub(r"\\\n\s*", " ", "\n".join(line for line in text.splitlines() if not line.startswith("#")))
    return [line.split() for line in joined.splitlines() if line.strip()]


def test_the_base_is_an_argument_whose_default_a_space_can_pull():
    steps = instructions(DOCKERFILE)
    assert steps[0] == ["ARG", "BASE_IMAGE=python:3.11-slim"] and steps[1] == ["FROM", "${BASE_IMAGE}"]


def test_torch_is_the_cpu_build_at_the_pinned_version():
    assert 'ARG TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"' in DOCKERFILE
    pins = [line for line in (ROOT / "requirements.txt").read_text().splitlines() if re.match(r"^torch==", line)]
    assert len(pins) == 1  # the Dockerfile installs torch first with `grep '^torch==' requirements.txt`
    assert "pip install $TORCH_PIP_ARGS \"$(grep '^torch==' requirements.txt)\"" in DOCKERFILE


def test_the_app_serves_on_the_spaces_port_as_uid_1000():
    steps = instructions(DOCKERFILE)
    assert ["EXPOSE", "7860"] in steps and ["USER", "user"] in steps and ["CMD", '["python",', '"app.py"]'] in steps
    assert "SPECDEC_HOST=0.0.0.0" in DOCKERFILE and "SPECDEC_PORT=7860" in DOCKERFILE
    assert "useradd --create-home --uid 1000 user" in DOCKERFILE


def test_what_the_image_copies_exists_and_is_in_the_build_context():
    ignored = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    sources = [words[-2] for words in instructions(DOCKERFILE) if words[0] == "COPY"]
    assert set(sources) == {"requirements.txt", "app.py", "specdec", "demo", "assets"}
    for source in sources:
        assert (ROOT / source).exists() and not any(fnmatch.fnmatch(source, pattern) for pattern in ignored)
    assert {".git", ".venv", "tests"} <= set(ignored)


def test_the_gpu_variant_serves_the_same_files_the_same_way():
    gpu = instructions((ROOT / "Dockerfile.gpu").read_text())
    same = [words for words in instructions(DOCKERFILE) if words[0] in ("COPY", "USER", "EXPOSE", "CMD")]
    assert [words for words in gpu if words[0] in ("COPY", "USER", "EXPOSE", "CMD")] == same
    text = (ROOT / "Dockerfile.gpu").read_text()
    assert "-c requirements.txt causal-conv1d mamba-ssm" in text and "SPECDEC_DEVICE=cuda" in text


def test_weights_go_to_git_lfs():
    paths = ["assets/drafters/mamba-smollm2/model.safetensors", "assets/drafters/tf-smollm2/model.safetensors",
             "target.gguf", "app.py"]
    out = subprocess.run(["git", "check-attr", "filter", "--", *paths], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout
    filters = dict(line.rsplit(": filter: ", 1) for line in out.splitlines())
    assert filters == {**{path: "lfs" for path in paths[:3]}, "app.py": "unspecified"}


class SizedTokenizer:
    """Only what the export reads of the target's tokenizer: its number of tokens."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):  # noqa: F811
    """A two-step Mamba run on the tiny teacher shards, with the evaluation report the card reads."""
    out, _, _ = data
    run = tmp_path_factory.mktemp("space") / "mamba"
    config = TrainConfig(arch="mamba", hidden=16, mamba_layers=1, minutes=10.0, max_tokens=4 * 16 * 2, seq_len=16,
                         batch_size=4, warmup=1, draft_vocab=20, eval_every=1)
    train(out / "teacher", run, config, torch.randn(VOCAB, 24), VOCAB)
    teacher.summarize(out / "teacher")
    (run / "eval.json").write_text(json.dumps({
        "teacher_forced": {"all": 0.25, "code": 0.25}, "coverage": 0.9,
        "latency_ms": {"drafter_fp32": 1.0, "drafter_bf16": 1.0, "target_fp32": 10.0, "ratio_fp32": 0.1}}))
    return run, out / "teacher"


def test_the_export_writes_no_tokenizer(run, tmp_path):
    folder = export(run[0], tmp_path / "drafter", SizedTokenizer(VOCAB), run[1])
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "draft_vocab.json", "README.md"} <= names
    assert not names & TOKENIZER_FILES


def test_the_export_refuses_a_run_made_for_a_larger_vocabulary(run, tmp_path):
    with pytest.raises(SystemExit, match=f"scores {VOCAB} tokens but the target's tokenizer has {VOCAB + 1}"):
        export(run[0], tmp_path / "drafter", SizedTokenizer(VOCAB + 1), run[1])
    assert not (tmp_path / "drafter").exists()


def test_the_shipped_drafters_use_the_targets_tokenizer():
    """The drafter folders carry no copy of the target's tokenizer (the tree stays light); they load without one."""
    from specdec.models import TOKENIZER_FILES, Models

    models = Models(device="cpu", dtype="float32")
    for name, kind in (("mamba-smollm2", "mamba"), ("tf-smollm2", "transformer")):
        assert not {p.name for p in (ROOT / "assets" / "drafters" / name).iterdir()} & set(TOKENIZER_FILES)
        drafter = models.drafter(kind)
        assert drafter.tokenizer is None and drafter.vocab_size == models.target.vocab_size
