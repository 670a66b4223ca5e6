"""Per-session state, the JSON export, the background runner, the example prompts and the fake engine."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from demo.fake import fake_generate
from demo.prompts import LONG_DOCUMENT, load_prompts, long_documents
from specdec.passages import CHARS_PER_TOKEN, EXAMPLE_TOKENS
from demo.runner import EngineThread
from demo.session import Session, export_payload, write_export
from specdec.records import RoundRecord, Summary

PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "prompts"


def fake_run(n_tokens: int = 12, **kw) -> list:
    config = SimpleNamespace(method="mamba-ucb", tree=None, max_new_tokens=n_tokens, seed=3, reward="paper", **kw)
    return list(fake_generate(None, "Hello", config, delay=0))


def test_fake_engine_yields_rounds_then_a_summary():
    events = fake_run(20)
    assert all(isinstance(e, RoundRecord) for e in events[:-1]) and isinstance(events[-1], Summary)
    assert events[-1].new_tokens == 20 == events[-2].new_tokens_total
    assert all(e.bandit is not None for e in events[:-1])


def test_session_start_resets_the_run_and_arms_a_new_stop_event():
    s = Session()
    for e in fake_run():
        s.add(e)
    old = s.stop
    old.set()
    s.start("new prompt", {"method": "ar"})
    assert (s.prompt, s.settings, s.rounds, s.summary) == ("new prompt", {"method": "ar"}, [], None)
    assert s.stop is not old and not s.stop.is_set()


def test_sessions_do_not_share_state():
    a, b = Session(), Session()
    a.add(fake_run()[0])
    assert b.rounds == [] and a.stop is not b.stop


def test_round_at_clamps_and_defaults_to_latest():
    s = Session()
    assert s.round_at(None) is None
    for e in fake_run():
        s.add(e)
    assert s.round_at(None) is s.rounds[-1] and s.round_at(99) is s.rounds[-1] and s.round_at(-5) is s.rounds[0]


def test_start_closes_a_paused_step_run():
    s = Session()
    closed = []

    def run():
        try:
            yield 1
            yield 2
        finally:
            closed.append(True)

    s.stepper = run()
    next(s.stepper)
    s.start("p", {})
    assert closed == [True] and s.stepper is None


def test_export_is_json_with_every_round(tmp_path):
    s = Session()
    s.start("Hi <there>", {"method": "mamba-ucb", "seed": 3})
    for e in fake_run(10):
        s.add(e)
    path = write_export(s, tmp_path / "out")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data == json.loads(json.dumps(export_payload(s)))
    assert data["prompt"] == "Hi <there>" and data["settings"]["seed"] == 3
    assert len(data["rounds"]) == len(s.rounds) and data["rounds"][0]["nodes"][0]["status"] == "root"
    assert data["summary"]["new_tokens"] == 10 and data["baseline"] is None
    stale = tmp_path / "out" / "specdec-run-old.json"
    stale.write_text("{}")
    os.utime(stale, (0, 0))
    write_export(s, tmp_path / "out")
    assert not stale.exists() and path.exists()


ENGINE = EngineThread().start()


def in_background(events, stop=None, interval=0.2):
    return ENGINE.frames(events, stop, interval)


def test_runner_passes_every_event_in_order():
    batches = list(in_background(iter(range(50)), interval=0.01))
    assert [e for b in batches for e in b] == list(range(50)) and all(batches)


def test_runner_batches_fast_events():
    def slowish():
        for i in range(6):
            time.sleep(0.03)
            yield i

    batches = list(in_background(slowish(), interval=0.1))
    assert [e for b in batches for e in b] == list(range(6)) and len(batches) < 6


def test_runner_reraises_engine_errors():
    def broken():
        yield 1
        raise ValueError("the prompt is empty")

    with pytest.raises(ValueError, match="prompt is empty"):
        list(in_background(broken(), interval=0))


def test_runner_sets_stop_when_the_consumer_leaves_early():
    stop = threading.Event()

    def endless():
        while not stop.is_set():
            time.sleep(0.005)
            yield 1

    events = in_background(endless(), stop, interval=0)
    next(events)
    events.close()
    assert stop.is_set()
    finished = threading.Event()
    list(in_background(iter([1, 2]), finished))
    assert not finished.is_set()


def test_example_prompts():
    groups = load_prompts(PROMPTS)
    assert list(groups) == ["chat", "code", "math", "summary"]
    items = [p for g in groups.values() for p in g]
    assert len(items) >= 40 and all(len(g) >= 10 for g in groups.values())
    assert len({p["id"] for p in items}) == len(items)
    assert all(p["prompt"].strip() and p["kind"] in groups for p in items)
    assert all(len(p["prompt"]) > 250 for p in groups["summary"])  # each carries a passage to summarise


def test_long_document_examples_fit_the_prompt_cap():
    items = long_documents(32000)
    assert [p["id"] for p in items] == ["long-2000", "long-4000", "long-6000"]
    for item, tokens in zip(items, EXAMPLE_TOKENS):
        assert tokens * CHARS_PER_TOKEN <= len(item["prompt"]) <= 32000 and str(tokens)[0] in item["label"]
        assert item["kind"] == LONG_DOCUMENT
    assert [p["id"] for p in long_documents(9000)] == ["long-2000"]  # the Space's cap
    assert long_documents(1000) == []


def test_demo_modules_never_import_torch():
    import ast

    for path in (PROMPTS.parent.parent / "demo").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [m for m in names if m.split(".")[0] == "torch"], path.name


def test_every_job_runs_on_the_one_engine_thread():
    """Model work never lands on another thread (each would get an OpenMP team of its own)."""
    names = {ENGINE.call(lambda: threading.current_thread().name) for _ in range(3)}
    def events():
        for _ in range(3):
            yield threading.current_thread().name
    names |= {name for batch in ENGINE.frames(events(), interval=0) for name in batch}
    names.add(ENGINE.call(lambda: ENGINE.call(lambda: threading.current_thread().name)))  # nested: no deadlock
    assert names == {"engine"}
    with pytest.raises(ZeroDivisionError):
        ENGINE.call(lambda: 1 / 0)


def test_bench_long_examples_are_the_pages_examples():
    """`bench --long examples` measures exactly the prompts the page offers, so the Long documents page's lengths
    are the examples'."""
    from specdec.bench import example_prompts

    assert [p["prompt"] for p in example_prompts()] == [p["prompt"] for p in long_documents(10**6)]
    assert [p["kind"] for p in example_prompts()] == [f"long-{t}" for t in EXAMPLE_TOKENS]
