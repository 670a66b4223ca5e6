"""Shared fixtures: tiny random models with a small vocabulary (fast), and the real SmolLM2 target (once)."""

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # read by huggingface_hub at import: set before anything imports it

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)  # tiny models gain nothing from threads, and tests stay stable on a busy machine

from specdec.models import LoadedModel, Models  # noqa: E402
from tests.tiny import TinyTokenizer, tiny_feat, tiny_llama, tiny_mamba  # noqa: E402


@pytest.fixture(scope="session")
def tiny_models() -> Models:
    """Target: tiny Llama, V=6. Drafters: an unrelated tiny Mamba, an unrelated tiny Llama, and a random tiny
    Mamba reading the target's features."""
    tokenizer = TinyTokenizer(6)
    target = LoadedModel("tiny-target", tiny_llama(6, seed=1), tokenizer, "tiny")
    mamba = LoadedModel("tiny-mamba", tiny_mamba(6, seed=2), tokenizer, "tiny")
    transformer = LoadedModel("tiny-tf", tiny_llama(6, seed=3), tokenizer, "tiny")
    feat = LoadedModel("tiny-feat", tiny_feat(32, seed=12), None, "tiny")
    return Models.from_loaded(target, {"mamba": mamba, "transformer": transformer, "mamba-feat": feat})


@pytest.fixture(scope="session")
def self_draft_models(tiny_models) -> Models:
    """The target drafts for itself: under greedy decoding every drafted chain node is accepted."""
    target = tiny_models.target
    itself = LoadedModel("self", target.model, target.tokenizer, "tiny")
    return Models.from_loaded(target, {"mamba": tiny_models.drafter("mamba"), "transformer": itself})


@pytest.fixture(scope="session")
def bf16_drafters(tiny_models) -> Models:
    """The tiny drafters in bfloat16 beside a float32 target, as `--drafter-dtype bfloat16` asks."""
    half = {kind: LoadedModel(m.name, copy.deepcopy(m.model).to(torch.bfloat16), m.tokenizer, m.source)
            for kind, m in ((kind, tiny_models.drafter(kind)) for kind in ("mamba", "transformer"))}
    models = Models.from_loaded(tiny_models.target, half)
    assert models.dtype == torch.float32 and models.drafter_dtype == torch.bfloat16
    return models


@pytest.fixture(scope="session")
def smollm2() -> Models:
    models = Models(device="cpu", dtype="float32")
    models.load()
    return models


# Modules that start an app process, use the real models throughout, run the GPU check's CPU dry run on real shapes
# or read the Space's files
FULL_MODULES = {"test_cancel", "test_concurrency", "test_smollm2", "test_gpu_check", "test_space"}
FULL_TESTS = {"test_local_models_load_without_any_network_access"}  # a process that loads the real models


def pytest_collection_modifyitems(items) -> None:
    """Mark `full` what needs the real models, an app process or a browser: `make test-fast` leaves it out, and
    `make test` (the whole suite, what CI runs) keeps it."""
    for item in items:
        module = item.path.stem
        if ("e2e" in item.path.parts or "smollm2" in item.fixturenames or module in FULL_MODULES
                or item.name.startswith("test_real_") or item.originalname in FULL_TESTS):
            item.add_marker(pytest.mark.full)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
