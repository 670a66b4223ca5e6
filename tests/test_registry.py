"""The registry of drafter kinds: methods, options and drafters follow from one declaration each."""

import subprocess
import sys
from collections.abc import Sequence

import pytest

from specdec import config, registry
from specdec.config import METHODS, GenerationConfig
from specdec.drafters.base import Drafter, DraftTree, Sampler
from specdec.engine import generate
from specdec.tree import TreeShape

PROMPT = "abcab"  # tiny tokenizer: one token per character, V = 6


class RepeatDrafter(Drafter):
    """A drafter kind the repo does not ship: it proposes the root token repeated."""

    name = "repeat"

    def start(self, context: list[int], max_nodes: int, features=None) -> None:
        self.root = context[-1]

    def draft(self, shape: TreeShape, sampler: Sampler) -> DraftTree:
        n = shape.depth + 1
        return DraftTree(TreeShape.chain(shape.depth), [self.root] * n, list(range(-1, n - 1)), [1.0] * n, None,
                         point=[False] + [True] * shape.depth)

    def commit(self, path: list[int], next_token: int, unseen: Sequence[int] = (), features=None) -> None:
        self.root = next_token


def run(models, **settings):
    events = list(generate(models, PROMPT, GenerationConfig(**settings), chat=False))
    return events[:-1], events[-1]


def test_every_method_comes_from_one_kind_and_policy():
    assert next(iter(METHODS)) == "ar"
    for name, method in METHODS.items():
        kind = registry.KINDS[method.drafter]
        assert kind.methods[name] == method.policy
        assert method.description.startswith(kind.summary)
    assert {m for kind in registry.KINDS.values() for m in kind.methods} == set(METHODS)


def test_each_kind_names_a_drafter_class_with_what_it_needs():
    for kind in registry.KINDS.values():
        cls = kind.implementation_class()
        assert issubclass(cls, Drafter)
        assert hasattr(cls, "load") == kind.has_model, kind.name
        assert (kind.flag is not None) == kind.has_model and (kind.env is not None) == kind.has_model


def test_a_new_kind_is_one_class_and_one_registration(tiny_models, monkeypatch):
    """No engine file knows the kind: it is declared, and its methods run exactly (greedy = the target alone)."""
    kind = registry.DrafterKind("repeat", "repeat", f"{__name__}:RepeatDrafter", "repeats the last token",
                                "Repeat", "Copies the last token.", policies=("chain",))
    monkeypatch.setitem(registry.KINDS, "repeat", kind)
    monkeypatch.setattr(config, "METHODS", config.build_methods())
    _, ar = run(tiny_models, method="ar", max_new_tokens=30)
    rounds, sd = run(tiny_models, method="repeat-chain", tree="3", max_new_tokens=30)
    assert sd.token_ids == ar.token_ids and sd.extra["drafter"] == "repeat"
    assert all(r.shape == [1, 1, 1] for r in rounds)
    with pytest.raises(ValueError, match="unknown drafter kind"):
        registry.kind("nothing")


def test_details_off_leaves_the_nodes_out_and_the_tokens_alone(tiny_models):
    _, full = run(tiny_models, method="mamba-tree", tree="2,2", max_new_tokens=20)
    events = list(generate(tiny_models, PROMPT, GenerationConfig(method="mamba-tree", tree="2,2", max_new_tokens=20),
                           chat=False, details=False))
    assert events[-1].token_ids == full.token_ids
    assert all(r.nodes == [] for r in events[:-1])


def test_the_consumers_time_between_rounds_is_not_the_generations(tiny_models, monkeypatch):
    """On a clock that only the consumer moves (an hour per round it reads), the run's own seconds stay at zero."""
    import types

    import specdec.engine

    clock = [0.0]
    monkeypatch.setattr(specdec.engine, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    rounds = 0
    for event in generate(tiny_models, PROMPT, GenerationConfig(method="mamba-chain", tree="2", max_new_tokens=8),
                          chat=False):
        if hasattr(event, "nodes"):
            rounds += 1
            clock[0] += 3600.0
    assert rounds >= 3 and event.seconds == 0.0


def test_config_imports_without_torch():
    code = "import sys, specdec.config, specdec.registry; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
