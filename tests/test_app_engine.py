"""The app's real engine adapter (`app.real_engine`) on tiny models: a missing drafter's message, and the bandit
each browser session keeps in its own `Session.memory`."""

import threading

import gradio as gr
import pytest

import app
from demo.session import Session
from specdec.models import DEFAULT_TARGET
from specdec.registry import KINDS

DEFAULT_MAMBA = KINDS["mamba"].model
from tests.test_models import no_drafters  # noqa: F401 - a fixture

PROMPT = "abcab"  # tiny tokenizer: one token per character


@pytest.fixture
def engine() -> app.Engine:
    return app.real_engine(DEFAULT_TARGET, {}, "cpu", "float32")


def test_a_missing_drafter_is_named_in_the_page(no_drafters, engine):  # noqa: F811
    config = engine.make_config(method="mamba-ucb", lookup_branch=app.LOOKUP_BRANCH)
    with pytest.raises(gr.Error) as raised:
        engine.prepare(config, lambda message: None)
    folder = no_drafters / "drafters" / DEFAULT_MAMBA
    assert raised.value.message.startswith(f"Could not load the models: preset '{DEFAULT_MAMBA}' is missing its "
                                           f"folder {folder}; restore the repository's assets/ folder")


def _run(engine, models, config, memory) -> list:
    return list(engine.generate(models, PROMPT, config, threading.Event(), memory))


def test_each_session_keeps_its_own_bandit(tiny_models, engine):
    config = engine.make_config(method="mamba-ucb", arms="1; 2,1", max_new_tokens=10)
    alice, bob = Session(), Session()
    assert alice.memory is not bob.memory
    first = _run(engine, tiny_models, config, alice.memory)
    bandit = alice.memory["bandit"]
    assert sum(bandit.pulls) == first[-1].rounds
    alice.start(PROMPT, {"method": "mamba-ucb"})  # a new run in the same tab keeps what the bandit learnt
    second = _run(engine, tiny_models, config, alice.memory)
    assert alice.memory["bandit"] is bandit and sum(bandit.pulls) == first[-1].rounds + second[-1].rounds
    assert sum(a.pulls for a in second[0].bandit.arms) == first[-1].rounds + 1
    third = _run(engine, tiny_models, config, bob.memory)  # another tab starts from scratch
    assert bob.memory["bandit"] is not bandit and sum(bob.memory["bandit"].pulls) == third[-1].rounds
    assert sum(bandit.pulls) == first[-1].rounds + second[-1].rounds


def test_new_bandit_settings_renew_the_sessions_bandit(tiny_models, engine):
    memory: dict = {}
    _run(engine, tiny_models, engine.make_config(method="mamba-ucb", arms="1; 2,1", max_new_tokens=6), memory)
    old = memory["bandit"]
    _run(engine, tiny_models, engine.make_config(method="mamba-chain", max_new_tokens=6), memory)
    assert memory["bandit"] is old  # a method without a bandit leaves it alone
    events = _run(engine, tiny_models, engine.make_config(method="mamba-ucb", arms="3", max_new_tokens=6), memory)
    assert memory["bandit"] is not old and [a.name for a in memory["bandit"].arms] == ["chain 3"]
    assert sum(memory["bandit"].pulls) == events[-1].rounds


def test_a_bandit_settled_on_drafting_nothing_drafts_again_on_a_new_prompt(engine, monkeypatch):
    """After a run where drafting never paid (or one stopped early), the tab's bandit prefers arm "0"; a new prompt
    starts from the priors again, the same prompt keeps what it learnt."""
    import specdec.engine

    passed = []
    monkeypatch.setattr(specdec.engine, "generate", lambda models, prompt, config, stop, bandit: passed.append(bandit))
    config = engine.make_config(method="mamba-ucb", arms="0; 3", reward="paper")
    memory: dict = {}
    engine.generate(None, "first", config, threading.Event(), memory)
    settled = passed[-1]
    for _ in range(20):  # drafting never pays: arm "0" wins
        settled.update(0, -1.0)
        settled.update(1, -5.0)
    assert app.settled_on_no_drafting(settled)
    engine.generate(None, "first", config, threading.Event(), memory)
    assert passed[-1] is settled  # the same prompt again: the bandit keeps what it learnt
    engine.generate(None, "a new prompt", config, threading.Event(), memory)
    assert passed[-1] is not settled and passed[-1] is memory["bandit"]
    assert passed[-1].pulls == [0, 0]  # a fresh bandit: the priors, every arm untried
