"""The CUDA path (skipped without a GPU): exactness, the drafter's CUDA graphs, the fused kernels, memory.

`scripts/gpu_check.sh` runs this file first; every test fits in the GPU check's few minutes.
"""

import copy
import gc

import pytest
import torch

from specdec.config import WHOLE_SHAPES, GenerationConfig
from specdec.drafters.mamba import MambaDrafter, MambaState, kernels_available
from specdec.engine import generate
from specdec.models import ASSETS, LoadedModel, Models, resolve_drafter_dtype
from tests.test_engine import N_NEW, PROMPT, RUNS, _chi_square, _target_distribution

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CUDA = torch.device("cuda")
GRAPHS = "SPECDEC_CUDA_GRAPHS"


def run(models: Models, **kwargs) -> tuple[list, object]:
    """Whole shapes unless asked otherwise: every drafting path (graphs of every batch width) runs."""
    events = list(generate(models, PROMPT, GenerationConfig(**{**WHOLE_SHAPES, **kwargs}), chat=False))
    return events[:-1], events[-1]


@pytest.fixture(scope="module")
def cuda_models(tiny_models) -> Models:
    """conftest's tiny models (V = 6), copied to the GPU in float32."""
    def moved(m: LoadedModel) -> LoadedModel:
        return LoadedModel(m.name, copy.deepcopy(m.model).to(CUDA), m.tokenizer, m.source)

    return Models.from_loaded(moved(tiny_models.target), {kind: moved(tiny_models.drafter(kind))
                                                          for kind in ("mamba", "transformer")})


def shipped_mamba(dtype: torch.dtype):
    from specdec.models import read_folder_model

    return read_folder_model(ASSETS / "drafters" / "mamba-smollm2", dtype).to(CUDA).eval()


def random_state(model, rows: int, seed: int) -> MambaState:
    g = torch.Generator(device=CUDA).manual_seed(seed)
    zeros = MambaState.zeros(model, rows)
    return MambaState(torch.randn(zeros.conv.shape, generator=g, device=CUDA),
                      torch.randn(zeros.ssm.shape, generator=g, device=CUDA) * 0.1)


# --- exactness ----------------------------------------------------------------------------------------------------
CASES = [("mamba-chain", "1"), ("mamba-chain", "5"), ("mamba-tree", "3,2,1"), ("mamba-tree", "2,2,2,1"),
         ("mamba-ucb", None), ("tf-chain", "3"), ("tf-tree", "3,1,2"), ("lookup-chain", "4")]


@pytest.mark.parametrize("graphs", ["1", "0"])
@pytest.mark.parametrize("method, tree", CASES)
def test_greedy_is_identical_to_target_alone(cuda_models, monkeypatch, method, tree, graphs):
    monkeypatch.setenv(GRAPHS, graphs)
    mamba = cuda_models.drafter("mamba").model
    mamba.__dict__.pop("_specdec_graphs", None)  # graphs captured by earlier tests
    _, ar = run(cuda_models, method="ar", max_new_tokens=40)
    rounds, sd = run(cuda_models, method=method, tree=tree, max_new_tokens=40)
    assert sd.token_ids == ar.token_ids and sd.new_tokens == 40
    if method.startswith("mamba"):
        assert sum(r.accepted_len for r in rounds) > 0  # the drafter's tokens were used, not only the target's
        assert ("_specdec_graphs" in mamba.__dict__) == (graphs == "1")  # the step ran from graphs exactly when on


@pytest.mark.parametrize("method, tree", [("mamba-tree", "3,2"), ("tf-tree", "2,2,1")])
def test_sampling_matches_the_target_distribution(tiny_models, cuda_models, method, tree):
    """Sampled on the GPU (CUDA generator, graphed drafter); the exact distribution comes from the CPU copy."""
    dist = _target_distribution(tiny_models, 1.0)
    counts: dict[tuple, int] = {}
    accepted = 0
    for seed in range(RUNS):
        rounds, summary = run(cuda_models, method=method, tree=tree, temperature=1.0, seed=seed, max_new_tokens=N_NEW)
        counts[tuple(summary.token_ids)] = counts.get(tuple(summary.token_ids), 0) + 1
        accepted += sum(r.accepted_len for r in rounds)
    assert accepted > RUNS * 0.3
    assert _chi_square(counts, dist, RUNS) > 1e-3


def test_tree_verification_matches_each_branch():
    """One target pass over a tree on the GPU gives every node the logits of its branch run alone, and a commit
    keeps exactly the accepted branch (transformers versions differ in how a cache reaches the model)."""
    from specdec.verify import TreeLM
    from specdec.tree import TreeShape
    from tests.tiny import tiny_llama

    model = tiny_llama(11, seed=5).to(CUDA)
    prefix, parents = [1, 4, 2, 7, 3], TreeShape((2, 2, 1)).parents
    tokens = torch.randint(0, 11, (len(parents),), generator=torch.Generator().manual_seed(1)).tolist()
    lm = TreeLM(model)
    lm.extend(prefix, list(range(-1, len(prefix) - 1)))
    lm.commit(list(range(len(prefix))))
    logits = lm.extend(tokens, parents)  # [n, V]
    branches = []
    for node in range(len(tokens)):
        branch = [node]
        while parents[branch[0]] >= 0:
            branch.insert(0, parents[branch[0]])
        branches.append(branch)
        with torch.no_grad():
            expected = model(input_ids=torch.tensor([prefix + [tokens[i] for i in branch]], device=CUDA)).logits
        torch.testing.assert_close(logits[node], expected[0, -1], atol=1e-4, rtol=1e-4)
    keep = branches[-1]  # the deepest branch
    lm.commit(keep)
    next_logits = lm.extend([9], [-1])[0]
    with torch.no_grad():
        seq = prefix + [tokens[i] for i in keep] + [9]
        expected = model(input_ids=torch.tensor([seq], device=CUDA)).logits[0, -1]
    torch.testing.assert_close(next_logits, expected, atol=1e-4, rtol=1e-4)


def test_dtype_auto_is_bfloat16_on_cuda():
    models = Models(device="cuda", dtype="auto", drafter_dtype="auto")  # lazy: loads nothing
    assert models.device.type == "cuda" and models.dtype == torch.bfloat16
    assert resolve_drafter_dtype("auto", CUDA, torch.bfloat16) == torch.bfloat16


# --- the drafter step: graphs, kernels ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_replay_equals_the_eager_step_bitwise(dtype):
    model = shipped_mamba(dtype)
    drafter = MambaDrafter(model, model.config.vocab_size, cuda_graphs=True)
    for round_, batch in enumerate([1, 3, 6, 3, 1]):  # later rounds replay graphs captured earlier
        tokens = torch.randint(0, model.config.vocab_size, (batch,), device=CUDA)  # [B]
        eager, graphed = random_state(model, batch, seed=round_), random_state(model, batch, seed=round_)
        for logits in (True, False):
            expected = drafter.step_eager(tokens, eager, logits=logits)
            got = drafter.step(tokens, graphed, logits=logits)
            assert (got is None) == (expected is None) == (not logits)
            assert logits is False or torch.equal(got, expected)
            assert torch.equal(graphed.conv, eager.conv) and torch.equal(graphed.ssm, eager.ssm)
    assert drafter.graphs.batch_sizes == [1, 3, 6]


def test_graphs_are_shared_by_drafters_of_one_model():
    model = shipped_mamba(torch.float32)
    first = MambaDrafter(model, model.config.vocab_size, cuda_graphs=True)
    assert MambaDrafter(model, model.config.vocab_size, cuda_graphs=True).graphs is first.graphs
    reduced = MambaDrafter(model, model.config.vocab_size, head_ids=torch.arange(100), cuda_graphs=True)
    assert reduced.graphs is not first.graphs  # another head is another step
    assert MambaDrafter(model, model.config.vocab_size, cuda_graphs=False).graphs is None


def test_step_matches_the_full_sequence_forward():
    model = shipped_mamba(torch.float32)
    drafter = MambaDrafter(model, model.config.vocab_size)
    context = [12, 507, 33, 8, 1999, 41, 7, 7, 300]
    state, logits = drafter.prefill(context[:4])
    for i in range(4, len(context)):
        logits = drafter.step(torch.tensor([context[i]], device=CUDA), state)[0]
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([context], device=CUDA)).logits[0, -1].float()
    torch.testing.assert_close(logits, expected, atol=2e-3, rtol=2e-3)


@pytest.mark.skipif(not kernels_available(CUDA), reason="needs mamba_ssm and causal_conv1d")
def test_fused_kernel_step_equals_the_reference():
    """Stated tolerance: 1e-3 absolute and relative in float32, on logits and both states, after 3 steps."""
    model = shipped_mamba(torch.float32)
    kernel = MambaDrafter(model, model.config.vocab_size, use_kernels=True, cuda_graphs=False)
    ref = MambaDrafter(model, model.config.vocab_size, use_kernels=False, cuda_graphs=False)
    a, b = random_state(model, 4, seed=1), random_state(model, 4, seed=1)
    for step in range(3):
        tokens = torch.tensor([5, 99, 2048, 40000], device=CUDA) + step  # [4]
        torch.testing.assert_close(kernel.step(tokens, a), ref.step(tokens, b), atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(a.conv, b.conv, atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(a.ssm, b.ssm, atol=1e-3, rtol=1e-3)


# --- memory -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["ar", "mamba-ucb", "tf-tree"])
def test_memory_returns_after_a_generation(cuda_models, monkeypatch, method):
    """After a warm-up (graphs captured once, kept on the model), a generation leaves no GPU memory behind."""
    monkeypatch.setenv(GRAPHS, "1")
    run(cuda_models, method=method, max_new_tokens=30)
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    rounds, _ = run(cuda_models, method=method, max_new_tokens=30)
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() > before  # the generation did allocate (its KV cache at least)
    assert rounds[-1].cuda_allocated_bytes > 0
    assert torch.cuda.memory_allocated() == before
