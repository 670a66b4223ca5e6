"""The Mamba drafter that reads the target's hidden state: exact like every drafter, fed the right features, its
state after a generation equal to a fresh start on the whole text, and loaded only where it fits the target."""

import json

import pytest
import torch

from specdec import engine
from specdec.config import GenerationConfig
from specdec.drafters.base import Sampler
from specdec.drafters.mamba import MambaState
from specdec.drafters.mamba_feat import FeatConfig, MambaFeatDrafter, MambaFeatModel
from specdec.engine import generate
from specdec.drafters.mamba_feat import load_feat_drafter
from specdec.models import LoadedModel, ModelLoadError, Models
from specdec.tree import parse_shape
from tests.tiny import TinyTokenizer, tiny_feat, tiny_llama

PROMPT = "abcabcabfe"


def run(models: Models, **settings):
    *rounds, summary = generate(models, PROMPT, GenerationConfig(max_new_tokens=40, **settings), chat=False)
    return rounds, summary


@pytest.mark.parametrize("settings", [dict(method="mamba-feat-chain"), dict(method="mamba-feat-tree", tree="3,2,1"),
                                      dict(method="mamba-feat-ucb"), dict(method="mamba-feat-chain", lookup_branch=4),
                                      dict(method="mamba-feat-tree", tree="2,2", lookup_branch=3)])
def test_greedy_output_is_the_targets(tiny_models, settings):
    _, ar = run(tiny_models, method="ar")
    rounds, summary = run(tiny_models, **settings)
    assert summary.token_ids == ar.token_ids
    assert sum(r.accepted_len for r in rounds) > 0  # drafts took part
    assert summary.extra["drafter"].startswith("tiny-feat") and all(r.drafter_read_target for r in rounds)


def target_features(models: Models, ids: list[int]) -> torch.Tensor:
    """The target's last hidden state at every position of `ids`, from one plain forward pass."""
    with torch.no_grad():
        return models.target.model.base_model(input_ids=torch.tensor([ids])).last_hidden_state[0]


@pytest.mark.parametrize("settings", [dict(method="mamba-feat-chain"), dict(method="mamba-feat-tree", tree="3,2"),
                                      dict(method="mamba-feat-chain", lookup_branch=4)])
def test_state_after_a_generation_equals_a_fresh_start(tiny_models, monkeypatch, settings):
    """Catch-up with the verifier's features = prefill of prompt + output with a plain forward's features: this
    fails if a feature is off by one position, taken from a rejected node, or a drafted state is kept."""
    made, committed, given = [], [], []
    real_make, real_commit = engine.make_drafter, MambaFeatDrafter.commit
    monkeypatch.setattr(engine, "make_drafter", lambda *a: made.append(real_make(*a)) or made[-1])

    def logged_commit(self, path, next_token, unseen=(), features=None):  # the last round may accept more
        committed.extend([*(self.tokens[node] for node in path[1:]), *unseen, next_token])  # than is printed
        given.append(features is not None)
        return real_commit(self, path, next_token, unseen, features)

    monkeypatch.setattr(MambaFeatDrafter, "commit", logged_commit)
    _, summary = run(tiny_models, **settings)
    drafter = made[0].inner if hasattr(made[0], "inner") else made[0]
    assert isinstance(drafter, MambaFeatDrafter) and given and all(given)
    assert committed[: len(summary.token_ids)] == summary.token_ids
    context = tiny_models.target.tokenizer(PROMPT)["input_ids"] + committed
    fresh = MambaFeatDrafter(drafter.model, tiny_models.target.model)
    fresh.start(context, 4, features=target_features(tiny_models, context[:-1]))
    assert torch.allclose(drafter.buffers.ssm[:, :1], fresh.buffers.ssm[:, :1], atol=1e-4)
    assert torch.allclose(drafter.buffers.conv[:, :1], fresh.buffers.conv[:, :1], atol=1e-4)
    assert torch.allclose(drafter.root_logits, fresh.root_logits, atol=1e-4)
    stale = MambaFeatDrafter(drafter.model, tiny_models.target.model)  # the control: features one position late
    stale.start(context, 4, features=target_features(tiny_models, context[:-1])[1:])
    assert not torch.allclose(drafter.root_logits, stale.root_logits, atol=1e-4)


def test_the_step_and_the_sequence_path_agree(tiny_models):
    drafter = MambaFeatDrafter(tiny_models.drafter("mamba-feat").model, tiny_models.target.model)
    ids = [0, 3, 1, 4, 4, 2, 5, 1]
    features = target_features(tiny_models, ids)
    state, guess, logits = drafter.prefill(ids, features[:-1])
    stepped = MambaState(torch.zeros_like(state.conv), torch.zeros_like(state.ssm))
    previous = torch.zeros(32)
    for token, feature in zip(ids, [previous, *features[:-1]]):
        step_guess, step_logits = drafter.step(torch.tensor([token]), feature[None], stepped)
    assert torch.allclose(stepped.ssm, state.ssm, atol=1e-5) and torch.allclose(stepped.conv, state.conv, atol=1e-5)
    assert torch.allclose(step_logits[0], logits, atol=1e-4) and torch.allclose(step_guess[0], guess, atol=1e-5)


def test_commit_checks_the_features_it_is_given(tiny_models):
    """One feature per accepted position (root first), else a clear error; without features (no caller in this
    repo passes none) the drafted states are kept."""
    drafter = MambaFeatDrafter(tiny_models.drafter("mamba-feat").model, tiny_models.target.model)
    ids = tiny_models.target.tokenizer(PROMPT)["input_ids"]
    greedy = Sampler(0.0, 1.0, None)
    drafter.start(ids, 8, features=target_features(tiny_models, ids[:-1]))
    drafter.draft(parse_shape("3"), greedy)
    with pytest.raises(ValueError, match="2 accepted positions but 3 features"):
        drafter.commit([0, 1], 5, features=torch.zeros(3, 32))
    drafter.commit([0, 1, 2], 5)
    assert drafter.root == 5
    assert drafter.draft(parse_shape("2"), greedy).tokens[0] == 5


def test_save_and_load_round_trip(tmp_path, tiny_models):
    model = tiny_feat(32, seed=7)
    model.save(tmp_path / "feat", torch.arange(6), dtype=torch.float32)
    loaded = load_feat_drafter(str(tmp_path / "feat"), torch.device("cpu"), torch.float32, tiny_models.target)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.model.state_dict().values()))
    assert json.loads((tmp_path / "feat" / "draft_vocab.json").read_text())["token_ids"] == list(range(6))


def test_a_drafter_for_another_target_is_refused(tmp_path, tiny_models):
    MambaFeatModel(FeatConfig(target_hidden=64, hidden=16, layers=1)).save(tmp_path / "wide", torch.arange(6))
    with pytest.raises(ModelLoadError, match="features of width 64.*hidden size 32"):
        load_feat_drafter(str(tmp_path / "wide"), torch.device("cpu"), torch.float32, tiny_models.target)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(ModelLoadError, match="not a mamba-feat drafter"):
        load_feat_drafter(str(tmp_path / "plain"), torch.device("cpu"), torch.float32, tiny_models.target)


def test_an_unrelated_target_width_is_refused_by_the_drafter():
    target = tiny_llama(6, seed=1)
    with pytest.raises(ValueError, match="features of width 48"):
        MambaFeatDrafter(MambaFeatModel(FeatConfig(target_hidden=48, hidden=16, layers=1)), target)


def test_models_wraps_a_feat_drafter():
    tokenizer = TinyTokenizer(6)
    target = LoadedModel("t", tiny_llama(6, seed=1), tokenizer, "tiny")
    models = Models.from_loaded(target, {"mamba-feat": LoadedModel("f", tiny_feat(32, seed=4), None, "tiny")})
    assert models.drafter("mamba-feat").name == "f" and models.specs["mamba-feat"] == "f"
