"""The engine's promise on tiny models: greedy output identical to the target alone, sampling exact in distribution."""

import itertools
import threading

import pytest
import torch
from scipy.stats import chisquare

from specdec.config import WHOLE_SHAPES, GenerationConfig
from specdec.engine import generate
from specdec.records import RoundRecord, Summary

PROMPT = "abcab"  # tiny tokenizer: one token per character, V = 6


def run(models, **kwargs) -> tuple[list[RoundRecord], Summary]:
    events = list(generate(models, PROMPT, GenerationConfig(**kwargs), chat=False))
    return events[:-1], events[-1]


CASES = [("mamba-chain", "1"), ("mamba-chain", "5"), ("mamba-tree", "3,2,1"), ("mamba-tree", "2,2,2,1"),
         ("mamba-ucb", None), ("tf-chain", "3"), ("tf-tree", "2,3"), ("tf-tree", "3,1,2"), ("lookup-chain", "4")]


@pytest.mark.parametrize("method, tree", CASES)
@pytest.mark.parametrize("trim", [WHOLE_SHAPES, {"min_branch_q": 0.3, "min_expand_q": 0.3},
                                  {"min_branch_q": 0.02, "min_expand_q": 0.5}])  # whole shapes; trimmed hard
def test_greedy_is_identical_to_target_alone(tiny_models, method, tree, trim):
    _, ar = run(tiny_models, method="ar", max_new_tokens=40)
    rounds, sd = run(tiny_models, method=method, tree=tree, max_new_tokens=40, **trim)
    assert sd.token_ids == ar.token_ids
    assert sd.new_tokens == 40 and sum(len(r.emitted) for r in rounds) == 40


@pytest.mark.parametrize("method", ["mamba-chain", "mamba-ucb", "tf-tree"])
def test_a_drafter_reading_part_of_the_prompt_keeps_greedy_identical(tiny_models, monkeypatch, method):
    """A plug-in drafter reads only the prompt's last `prefill_window` tokens; what is emitted stays the target's."""
    from specdec.drafters.base import Drafter

    monkeypatch.setattr(Drafter, "prefill_window", 2)
    _, ar = run(tiny_models, method="ar", max_new_tokens=30)
    rounds, sd = run(tiny_models, method=method, max_new_tokens=30)
    assert sd.token_ids == ar.token_ids and any(r.accepted_len for r in rounds)


@pytest.mark.parametrize("method, tree", [("tf-chain", "4"), ("tf-tree", "2,2,1")])
def test_self_drafting_accepts_every_greedy_chain(self_draft_models, method, tree):
    _, ar = run(self_draft_models, method="ar", max_new_tokens=30)
    rounds, sd = run(self_draft_models, method=method, tree=tree, max_new_tokens=30, **WHOLE_SHAPES)
    assert sd.token_ids == ar.token_ids
    assert all(r.accepted_len == len(r.shape) for r in rounds[:-1])  # every depth accepted
    assert sd.acceptance_rate == 1.0
    assert all(r.emitted[-1].source == "bonus" for r in rounds[:-1])


def test_round_records_describe_the_tree(tiny_models):
    rounds, summary = run(tiny_models, method="mamba-tree", tree="2,2", max_new_tokens=12, **WHOLE_SHAPES)
    r = rounds[0]
    assert r.shape == [2, 2] and len(r.nodes) == 1 + 2 + 4 and r.nodes[0].status == "root"
    accepted = [n for n in r.nodes if n.status == "accepted"]
    assert len(accepted) == r.accepted_len and len(r.emitted) == r.accepted_len + 1
    assert [e.source for e in r.emitted[:-1]] == ["draft"] * r.accepted_len
    assert r.emitted[-1].source in ("correction", "bonus")
    assert all(0.0 <= n.q <= 1.0 and 0.0 <= n.p <= 1.0 for n in r.nodes)
    assert r.drafter_state_bytes > 0 and r.target_kv_bytes > 0 and r.rss_bytes > 0
    assert summary.rounds == len(rounds) and summary.drafted_tokens == 6 * len(rounds)


def test_bandit_snapshot_every_round(tiny_models):
    rounds, _ = run(tiny_models, method="mamba-ucb", arms="1; 2,1; 3", max_new_tokens=20)
    assert [r.bandit.chosen for r in rounds[:3]] == [0, 1, 2]  # every arm once, in order
    assert all(sum(a.pulls for a in r.bandit.arms) == r.index + 1 for r in rounds)
    assert rounds[-1].bandit.arms[0].ucb is not None


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_an_arm_that_drafts_nothing(tiny_models, temperature):
    """Arm `0` is a plain target step inside a bandit run; greedy output stays the target's."""
    rounds, sd = run(tiny_models, method="mamba-ucb", arms="0; 2,1", temperature=temperature, max_new_tokens=24)
    plain = [r for r in rounds if r.bandit.chosen == 0]
    assert plain and all(r.shape == [] and r.accepted_len == 0 and len(r.emitted) == 1 for r in plain)
    if temperature == 0.0:
        assert sd.token_ids == run(tiny_models, method="ar", max_new_tokens=24)[1].token_ids


def test_stop_event_ends_generation(tiny_models):
    stop = threading.Event()
    events = []
    for event in generate(tiny_models, PROMPT, GenerationConfig(method="ar", max_new_tokens=50), stop, chat=False):
        events.append(event)
        stop.set()
    assert events[-1].stop_reason == "stopped" and events[-1].new_tokens == 1


def test_empty_prompt_is_refused(tiny_models):
    with pytest.raises(ValueError, match="empty"):
        next(generate(tiny_models, "  ", GenerationConfig(method="ar"), chat=False))


def test_overlong_prompt_is_refused(tiny_models):
    with pytest.raises(ValueError, match="context"):
        next(generate(tiny_models, "ab" * 200, GenerationConfig(method="ar"), chat=False))


# --- sampling: exact in distribution ---------------------------------------------------------------------
N_NEW, RUNS = 3, 1000


def _target_distribution(models, temperature: float) -> dict[tuple, float]:
    """P(x1, x2, x3 | prompt) by enumerating every continuation with full forwards of the target."""
    model, V = models.target.model, 6
    prompt = models.target.tokenizer(PROMPT)["input_ids"]
    seqs = list(itertools.product(range(V), repeat=N_NEW))
    ids = torch.tensor([prompt + list(s) for s in seqs])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.float() / temperature, -1)  # [S, L, V]
    L = len(prompt)
    probs = torch.stack([logp[:, L - 1 + i].gather(-1, ids[:, L + i, None])[:, 0] for i in range(N_NEW)]).sum(0).exp()
    return dict(zip(seqs, probs.tolist()))


def _chi_square(counts: dict, dist: dict, runs: int) -> float:
    cells = sorted(dist, key=dist.get, reverse=True)
    observed, expected, rest_o, rest_e = [], [], 0, 0.0
    for cell in cells:  # pool the rare cells so every expected count is >= 5
        if dist[cell] * runs >= 5:
            observed.append(counts.get(cell, 0))
            expected.append(dist[cell] * runs)
        else:
            rest_o += counts.get(cell, 0)
            rest_e += dist[cell] * runs
    if rest_e > 0:
        observed.append(rest_o)
        expected.append(rest_e)
    elif rest_o:
        return 0.0  # a continuation the target never produces (top-p cut it) was emitted
    total = sum(expected)
    return chisquare(observed, [e * runs / total for e in expected]).pvalue


def test_sampling_matches_the_target_distribution_over_several_rounds(tiny_models):
    """Three tokens, so most runs take more than one round and the drafter's catch-up is in the draw
    (`tests/test_engine_sampling.py` checks each method on two tokens)."""
    method, tree = "mamba-tree", "3,2"
    temperature = 1.0
    dist = _target_distribution(tiny_models, temperature)
    counts: dict[tuple, int] = {}
    accepted = 0
    for seed in range(RUNS):
        rounds, summary = run(tiny_models, method=method, tree=tree, temperature=temperature, seed=seed,
                              max_new_tokens=N_NEW)
        key = tuple(summary.token_ids)
        counts[key] = counts.get(key, 0) + 1
        accepted += sum(r.accepted_len for r in rounds)
    assert accepted > RUNS * 0.3  # the drafter's tokens really were accepted, not only corrections
    assert _chi_square(counts, dist, RUNS) > 1e-3


def test_the_chi_square_check_can_fail(tiny_models):
    """Negative control: the drafter's own samples are detected as a different distribution."""
    dist = _target_distribution(tiny_models, 1.0)
    model = tiny_models.drafter("mamba").model
    prompt = tiny_models.target.tokenizer(PROMPT)["input_ids"]
    g = torch.Generator().manual_seed(0)
    counts: dict[tuple, int] = {}
    for _ in range(RUNS):
        seq = list(prompt)
        for _ in range(N_NEW):
            with torch.no_grad():
                probs = torch.softmax(model(input_ids=torch.tensor([seq])).logits[0, -1].float(), -1)
            seq.append(int(torch.multinomial(probs, 1, generator=g)))
        key = tuple(seq[-N_NEW:])
        counts[key] = counts.get(key, 0) + 1
    assert _chi_square(counts, dist, RUNS) < 1e-6


def test_tree_wider_than_the_vocabulary_is_refused(tiny_models):
    with pytest.raises(ValueError, match="wider than the vocabulary"):
        next(generate(tiny_models, PROMPT, GenerationConfig(method="mamba-tree", tree="7,1"), chat=False))


@pytest.mark.parametrize("method", ["mamba-tree", "tf-tree"])
def test_drafters_narrower_than_the_target_stay_exact(method):
    """Target ids the drafter has no row for (padded vocabularies) are clamped on the drafter's input only."""
    from specdec.models import LoadedModel, Models
    from tests.tiny import TinyTokenizer, tiny_llama, tiny_mamba

    target = LoadedModel("t8", tiny_llama(8, seed=11), TinyTokenizer(8), "tiny")
    models = Models.from_loaded(target, {"mamba": LoadedModel("m6", tiny_mamba(6, seed=12), None, "tiny"),
                                         "transformer": LoadedModel("f6", tiny_llama(6, seed=13), None, "tiny")})
    _, ar = run(models, method="ar", max_new_tokens=30)
    _, sd = run(models, method=method, tree="2,2", max_new_tokens=30)
    assert sd.token_ids == ar.token_ids
    emitted = set()
    for seed in range(5):
        _, sd = run(models, method=method, tree="2,2", max_new_tokens=30, temperature=1.5, seed=seed)
        assert sd.new_tokens == 30
        emitted |= set(sd.token_ids)
    assert emitted & {6, 7}  # ids only the target has were emitted and fed back to the drafter


@pytest.mark.parametrize("method", ["mamba-tree", "tf-tree"])
def test_reduced_draft_head_from_the_drafter_folder(tiny_models, tmp_path, method):
    """`draft_vocab.json` beside a drafter's weights limits what it drafts; q is 0 elsewhere and output stays exact."""
    import json

    from specdec.models import LoadedModel, Models

    (tmp_path / "draft_vocab.json").write_text(json.dumps({"token_ids": [0, 2, 3]}))
    mamba, tf = tiny_models.drafter("mamba"), tiny_models.drafter("transformer")
    models = Models.from_loaded(tiny_models.target, {
        "mamba": LoadedModel("m", mamba.model, mamba.tokenizer, str(tmp_path)),
        "transformer": LoadedModel("f", tf.model, tf.tokenizer, str(tmp_path))})
    _, ar = run(models, method="ar", max_new_tokens=30)
    rounds, sd = run(models, method=method, tree="2,2", max_new_tokens=30)
    assert sd.token_ids == ar.token_ids
    assert {n.token_id for r in rounds for n in r.nodes[1:]} <= {0, 2, 3}
    rounds, _ = run(models, method=method, tree="2,2", max_new_tokens=10, temperature=1.0)
    assert {n.token_id for r in rounds for n in r.nodes[1:]} <= {0, 2, 3}


def test_a_bandit_passed_in_keeps_learning_across_generations(tiny_models):
    from specdec.bandit import UCBBandit

    config = GenerationConfig(method="mamba-ucb", arms="1; 2,1", max_new_tokens=10)
    bandit = UCBBandit.for_config(config)
    first = list(generate(tiny_models, PROMPT, config, chat=False, bandit=bandit))
    pulls = sum(bandit.pulls)
    assert pulls == first[-1].rounds
    second = list(generate(tiny_models, PROMPT, config, chat=False, bandit=bandit))
    assert sum(bandit.pulls) == pulls + second[-1].rounds
    assert sum(a.pulls for a in second[0].bandit.arms) == pulls + 1
    other = GenerationConfig(method="mamba-ucb", arms="3", max_new_tokens=10)
    with pytest.raises(ValueError, match="other arms"):
        next(generate(tiny_models, PROMPT, other, chat=False, bandit=bandit))


@pytest.mark.parametrize("method, tree", [("mamba-tree", "3,2,1"), ("mamba-ucb", None), ("tf-tree", "2,3")])
def test_a_bf16_drafter_stays_exact(bf16_drafters, tiny_models, method, tree):
    _, ar = run(tiny_models, method="ar", max_new_tokens=40)
    rounds, sd = run(bf16_drafters, method=method, tree=tree, max_new_tokens=40)
    assert sd.token_ids == ar.token_ids
    assert sum(r.accepted_len for r in rounds) > 0  # the bf16 drafter's tokens were used, not only the target's



@pytest.mark.parametrize("native, device, target, expected", [
    (True, "cpu", torch.float32, torch.float32), (True, "cpu", torch.bfloat16, torch.float32),
    (False, "cpu", torch.float32, torch.float32), (True, "cuda", torch.bfloat16, torch.bfloat16),
    (True, "cuda", torch.float32, torch.float32)])
def test_drafter_dtype_auto(monkeypatch, native, device, target, expected):
    """float32 on every CPU (small matmuls: bf16's per-call cost outweighs it), the target's dtype elsewhere."""
    from specdec import models, probes

    monkeypatch.setattr(probes, "cpu_has_native_bf16", lambda: native)
    assert models.resolve_drafter_dtype("auto", torch.device(device), target) == expected
    assert models.resolve_drafter_dtype("float16", torch.device("cpu"), torch.float32) == torch.float16
    with pytest.raises(models.ModelLoadError, match="unknown dtype"):
        models.resolve_drafter_dtype("int4", torch.device("cpu"), torch.float32)
