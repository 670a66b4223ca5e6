"""Replay of exported runs: tolerant reading, compaction, playback into a session, and the shipped recordings."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from demo.captions import status_text
from demo.fake import fake_generate
from demo.replay import compact_payload, load_replay, recorded_on, recorded_runs, replay_from_dict
from demo.replay_ui import advance, describe, finished, loaded
from demo.session import Session, export_payload
from demo.views import tree_view
from specdec.config import GenerationConfig
from specdec.records import RoundRecord, Summary

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "assets" / "runs"


def exported(n_tokens: int = 16, method: str = "mamba-ucb") -> dict:
    """A fake run as the app exports it (JSON round trip included)."""
    config = SimpleNamespace(method=method, tree=None, max_new_tokens=n_tokens, seed=2, reward="paper")
    session = Session()
    session.start("Explain <this>.", {"method": method, "temperature": 0.0})
    for event in fake_generate(None, session.prompt, config, delay=0):
        session.add(event)
    return json.loads(json.dumps(export_payload(session)))


def test_an_export_reads_back_into_the_same_records():
    data = exported()
    replay = replay_from_dict(data, "x.json")
    assert [r.to_dict() for r in replay.rounds] == data["rounds"]
    assert replay.summary.to_dict() == data["summary"] and replay.prompt == "Explain <this>."
    assert all(isinstance(r, RoundRecord) for r in replay.rounds) and isinstance(replay.summary, Summary)


def test_unknown_keys_are_ignored_and_optional_ones_may_be_missing():
    data = exported()
    data["recorded"] = {"target_dtype": "bfloat16"}
    data["summary"]["target_dtype"] = "bfloat16"  # a newer engine's extra field
    for r in data["rounds"]:
        r["verify_dtype"] = "bfloat16"
        del r["cuda_peak_bytes"], r["rss_bytes"]
        for node in r["nodes"]:
            node["entropy"] = 0.1
            del node["token_id"], node["copied"]
        for token in r["emitted"]:
            del token["token_id"]
    del data["summary"]["token_ids"], data["summary"]["extra"]
    replay = replay_from_dict(data)
    assert replay.recorded == {"target_dtype": "bfloat16"}
    assert replay.rounds[0].rss_bytes == 0 and replay.rounds[0].nodes[1].copied is False
    assert replay.summary.new_tokens == 16 and replay.summary.token_ids == []


@pytest.mark.parametrize("data, message", [
    ({"prompt": "p"}, "not an exported run"),
    ([1, 2], "not an exported run"),
    ({"rounds": []}, "has no rounds"),
    ({"rounds": [{"index": 0}]}, "round 0 lacks"),
    ({"rounds": ["x"]}, "a round is not a JSON object"),
])
def test_what_is_not_a_run_is_refused_in_one_sentence(data, message):
    with pytest.raises(ValueError, match=message):
        replay_from_dict(data)


def test_a_file_that_is_not_json_is_refused(tmp_path):
    bad = tmp_path / "notes.json"
    bad.write_text("hello", encoding="utf-8")
    with pytest.raises(ValueError, match="notes.json is not a JSON file"):
        load_replay(bad)


def test_compaction_drops_token_ids_and_rounds_floats_but_replays_the_same_tree():
    data = exported()
    small = compact_payload(data, {"title": "t"})
    assert "token_id" not in json.dumps(small) and "baseline" not in small
    assert len(json.dumps(small)) < len(json.dumps(data))
    full, compact = replay_from_dict(data), replay_from_dict(small)
    for a, b in zip(full.rounds, compact.rounds, strict=True):
        assert [(n.text, n.parent, n.status) for n in a.nodes] == [(n.text, n.parent, n.status) for n in b.nodes]
        assert [t.text for t in a.emitted] == [t.text for t in b.emitted]
        assert b.verify_ms == pytest.approx(a.verify_ms, abs=1e-3)
    assert compact.recorded == {"title": "t"}


def test_playback_adds_one_round_at_a_time_then_the_summary():
    replay = replay_from_dict(exported())
    session = Session()
    loaded(replay, session)
    assert session.rounds == [] and "Replay loaded" in status_text(session, live=False)
    advance(session)
    assert len(session.rounds) == 1 and session.summary is None
    assert f"round 1 of {len(replay.rounds)}" in status_text(session, live=True)
    assert f"Round 1 of {len(replay.rounds)} ·" in tree_view(session)  # the tree counts the whole run
    while not finished(session):
        advance(session)
    assert session.rounds == replay.rounds and session.summary is replay.summary
    assert status_text(session, live=False).startswith("Done: 16 tokens")
    advance(session)  # past the end: nothing changes
    assert len(session.rounds) == len(replay.rounds)


def test_a_live_run_forgets_the_replay():
    session = Session()
    loaded(replay_from_dict(exported()), session)
    session.start("new", {})
    assert session.replay is None and session.rounds == []


SHIPPED = {"code-greedy": "code", "summary-lookup": "summary", "chat-sampled": "chat"}


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_runs_are_small_complete_real_runs(name):
    path = RUNS / f"{name}.json"
    assert path.stat().st_size < 300_000
    replay = load_replay(path)
    assert replay.recorded["prompt_id"].startswith(SHIPPED[name]) and replay.recorded["title"]
    assert not str(replay.recorded.get("drafter", "")).startswith("random")  # the trained drafter ran
    assert replay.summary.new_tokens == replay.rounds[-1].new_tokens_total == sum(len(r.emitted)
                                                                                    for r in replay.rounds)
    assert replay.summary.text == "".join(t.text for r in replay.rounds for t in r.emitted)
    assert all(r.bandit is not None for r in replay.rounds)  # recorded with the default method, mamba-ucb


def test_shipped_runs_cover_code_a_lookup_branch_and_sampling():
    runs = {p.stem: load_replay(p) for p in recorded_runs(RUNS).values()}
    assert set(runs) == set(SHIPPED)
    assert any(n.copied for r in runs["summary-lookup"].rounds for n in r.nodes)
    assert runs["chat-sampled"].settings["temperature"] > 0 and runs["code-greedy"].settings["temperature"] == 0
    assert "def " in runs["code-greedy"].summary.text


def test_the_machine_and_dtype_of_a_recording_stand_beside_its_speed():
    replay = replay_from_dict({**exported(), "recorded": {"device": "cpu", "dtype": "bfloat16",
                                                           "processor": "AMD EPYC 9R14, 2 cores, 8 GiB"}})
    line = f"{replay.summary.tokens_per_s:.1f} tokens/s, recorded on AMD EPYC 9R14, 2 cores, 8 GiB (cpu), bfloat16"
    assert line in describe(replay)
    assert recorded_on({"device": "cpu", "machine": "x86_64", "dtype": "float32"}) == \
        "recorded on cpu x86_64 (machine not recorded), float32"  # the architecture alone: no CPU model
    assert recorded_on({}) == "machine not recorded, dtype not recorded"
    for path in recorded_runs(RUNS).values():  # every shipped run says what it can of its machine
        info = describe(load_replay(path))
        assert "tokens/s, recorded on cpu" in info and "bfloat16" in info


def test_record_runs_writes_the_processor_and_dtype(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("record_runs", ROOT / "scripts" / "record_runs.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    def fake_engine(*args, **kwargs) -> SimpleNamespace:
        def generate(models, prompt, config, stop, memory):
            for event in fake_generate(models, prompt, config, stop, delay=0):
                if isinstance(event, Summary):
                    event.extra["dtype"] = "bfloat16"
                yield event
        return SimpleNamespace(make_config=lambda **kw: GenerationConfig(**kw).validate(),
                               prepare=lambda config, progress: None, generate=generate)

    monkeypatch.setattr(script.app, "real_engine", fake_engine)
    monkeypatch.setattr(script, "machine_description", lambda: "Test CPU, 2 cores, 8 GiB")
    script.main(["--out", str(tmp_path), "--only", "code-greedy"])
    replay = load_replay(tmp_path / "code-greedy.json")
    assert replay.recorded["processor"] == "Test CPU, 2 cores, 8 GiB"
    assert recorded_on(replay.recorded) == "recorded on Test CPU, 2 cores, 8 GiB (cpu), bfloat16"
