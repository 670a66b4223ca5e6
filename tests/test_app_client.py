"""The app's page and API: Generate streams, Step, Compare, Stop and errors on the page's handlers (in-process, as
the page calls them; they are not API endpoints), separate sessions, and the API (`complete`, `rounds`, `status`)
over `gradio_client`.

Most tests use `demo.fake` in place of the engine (fast, no models); `test_real_app_streams_rounds` starts
`python app.py` as a subprocess with the real default models.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

import app
from demo.fake import fake_generate
from demo.session import Session
from tests.app_process import running_app, served
from tests.page import Page

ROOT = Path(__file__).resolve().parent.parent
ARGS = dict(method="mamba-ucb", temperature=0.0, max_new_tokens=24, seed=0, tree="", arms="", lambda_ucb=1.0,
            reward="paper", lookup=True)  # settings by name, as the page and the API take them
PROMPT = "Explain speculative decoding."


def fake_engine(delay: float = 0.01) -> app.Engine:
    from specdec.config import GenerationConfig

    return app.Engine(make_config=lambda **kw: GenerationConfig(**kw).validate(), prepare=lambda config, progress: None,
                      generate=lambda models, prompt, config, stop, memory: fake_generate(models, prompt, config, stop,
                                                                                         delay))


@pytest.fixture(scope="module")
def url():
    with served(app.build_app(fake_engine())) as address:
        yield address


@pytest.fixture(scope="module")
def page():
    return Page(fake_engine())


def test_generate_streams_several_updates(page):
    outputs = list(page.press("run", PROMPT, None, **ARGS))
    assert len(outputs) >= 3
    final = outputs[-1]
    conversation, caption, tree = (page.value(final, name) for name in ("conversation", "caption", "tree"))
    assert conversation.count('class="sd-tok"') == 24 and "Done: 24 tokens" in conversation
    assert caption.startswith('<div class="sd-caption"') and "Round" in caption
    assert 'class="sd-node"' in tree
    counts = [page.value(o, "conversation").count('class="sd-tok"') for o in outputs]
    assert counts == sorted(counts)
    export = page.value(final, "export")["path"]  # the file the button offers
    assert len(json.loads(Path(export).read_text())["rounds"]) == int(caption.split("Round ")[1].split(":")[0])


def test_step_advances_one_round_per_call_and_sessions_stay_apart(page):
    alice, bob = Session(), Session()
    captions = [page.value(page.last("step", PROMPT, alice, **ARGS), "caption") for _ in range(3)]
    assert ["Round 1:" in captions[0], "Round 2:" in captions[1], "Round 3:" in captions[2]] == [True] * 3
    assert "Round 1:" in page.value(page.last("step", PROMPT, bob, **ARGS), "caption")  # bob's run is his own
    assert "Round 4:" in page.value(page.last("step", PROMPT, alice, **ARGS), "caption")


def test_compare_shows_both_runs_and_the_speed_up(page):
    final = page.last("compare", PROMPT, None, **{**ARGS, "max_new_tokens": 16})
    comparison, verdict = final[page.live.comparison], page.value(final, "verdict")
    assert "Target alone" in comparison.value and comparison.visible is True
    run, base = (float(x) for x in re.search(r"\(([\d.]+) vs ([\d.]+) tokens/s\)", verdict).groups())
    shown = float(re.search(r"Speed-up: ([\d.]+)×", verdict).group(1))
    assert shown == pytest.approx(run / base, abs=0.02)  # the ratio of the two rates it names
    assert f"{run:.1f} tokens/s" in comparison.value and f"{base:.1f} tokens/s" in comparison.value


def test_stop_ends_the_run_and_the_tab_runs_again(page):
    session = Session()
    updates = page.press("run", PROMPT, session, **{**ARGS, "max_new_tokens": 512})
    for _ in range(3):
        next(updates)
    app.stop_run(session)
    *_, final = updates
    conversation = page.value(final, "conversation")
    assert "you pressed Stop" in conversation and conversation.count('class="sd-tok"') < 512
    assert "Done: 24 tokens" in page.value(page.last("run", PROMPT, session, **ARGS), "conversation")


def test_bad_input_gives_a_clear_error(page):
    with pytest.raises(app.gr.Error, match="Type a prompt first"):
        page.last("run", "   ", None, **ARGS)
    with pytest.raises(app.gr.Error, match="Invalid settings"):
        page.last("run", PROMPT, None, **{**ARGS, "method": "mamba-chain", "tree": "3,2"})
    with pytest.raises(app.gr.Error, match="max_new_tokens must be an integer from 1"):
        page.last("run", PROMPT, None, **{**ARGS, "max_new_tokens": 0})  # refused, not clamped


def test_the_page_events_are_not_api_endpoints(url):
    client = Client(url, verbose=False)
    info = client.view_api(print_info=False, return_format="dict")
    assert set(info["named_endpoints"]) == {"/complete", "/rounds", "/status"} and not info["unnamed_endpoints"]
    for endpoint in ("/generate", "/step", "/compare", "/stop"):
        with pytest.raises(ValueError, match="Cannot find a function"):
            client.predict(PROMPT, api_name=endpoint)


def test_flags_default_to_environment_variables(monkeypatch):
    monkeypatch.setenv("SPECDEC_PORT", "9000")
    monkeypatch.setenv("SPECDEC_DEVICE", "cpu")
    args = app.parse_args(["--target", "some/model", "--dtype", "float32"])
    assert (args.host, args.port, args.device, args.target, args.dtype) == ("127.0.0.1", 9000, "cpu", "some/model",
                                                                              "float32")


def image_files(dockerfile: Path, into: Path) -> Path:
    """Copy what the Dockerfile's `COPY` lines put into the image's app folder (not requirements.txt) to `into`."""
    for line in dockerfile.read_text().splitlines():
        words = [w for w in line.split() if not w.startswith("--")]
        if words[:1] == ["COPY"] and words[1:2] != ["requirements.txt"]:
            source, dest = ROOT / words[1], into / words[2]
            if source.is_dir():
                shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                dest.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, dest)
    return into


def test_real_app_streams_rounds(tmp_path):
    """The real default models, served from exactly the files the Docker image (the Space) gets."""
    root = image_files(ROOT / "Dockerfile", tmp_path / "image")
    assert (root / "app.py").exists() and (root / "assets" / "drafters").is_dir()
    with running_app(tmp_path / "app.log", root=root) as url:
        job = Client(url, verbose=False).submit("Name three colours.", {"max_new_tokens": 16}, api_name="/rounds")
        events = list(job)
        rounds, summary = [e["round"] for e in events[:-1]], events[-1]["summary"]
        assert len(rounds) >= 2  # the rounds as they come, then the finished run
        assert [t["token_id"] for r in rounds for t in r["emitted"]] == summary["token_ids"]
        assert summary["new_tokens"] == 16 and any(len(r["nodes"]) > 1 for r in rounds)


def test_the_drafter_and_way_controls_reach_every_method_once():
    from demo.live import DRAFTERS, METHODS as LABELS, method_of, on_drafter
    from specdec.config import METHODS
    from specdec.registry import KINDS

    assert list(DRAFTERS) == ["mamba", "mamba-feat", "xmamba", "transformer", "lookup", "none"] == list(KINDS)
    named = [method for ways in DRAFTERS.values() for method in ways.values()]
    assert sorted(named) == sorted(METHODS) == sorted(LABELS)  # every method once, with a label, nothing else
    for drafter, ways in DRAFTERS.items():
        for way, method in ways.items():
            assert method_of(drafter, way) == method
            assert (METHODS[method].drafter, METHODS[method].policy) == (drafter, way)
        radio, method, _ = on_drafter(drafter)
        assert method == next(iter(ways.values())) and radio.value == next(iter(ways))
    assert list(DRAFTERS["mamba"]) == ["ucb", "tree", "chain"]  # the bandit first, as the page opens
    assert method_of("transformer", "ucb") == "tf-tree"  # a way the Transformer drafter lacks: its first


def test_lookup_checkbox_sets_the_engine_default_branch():
    from specdec.config import GenerationConfig

    on, off = app.settings_of({**ARGS, "lookup": True}), app.settings_of({**ARGS, "lookup": False})
    assert GenerationConfig(**on).validate().grafts_lookup and not GenerationConfig(**off).grafts_lookup


def test_rounds_streams_the_runs_records_as_json(url):
    client = Client(url, verbose=False)
    job = client.submit("Explain speculative decoding.", {"max_new_tokens": 12, "method": "mamba-ucb"},
                        api_name="/rounds")
    events = list(job)
    rounds, last = [e["round"] for e in events[:-1]], events[-1]["summary"]
    assert rounds and all(r["emitted"] and "nodes" in r and "verify_ms" in r for r in rounds)
    assert [t["token_id"] for r in rounds for t in r["emitted"]] == last["token_ids"] and last["new_tokens"] == 12
    with pytest.raises(AppError, match="Unknown settings colour"):
        client.predict("Hi", {"colour": "red"}, api_name="/rounds")
