"""The app over its API (`gradio_client`): streamed `generate`, step, compare, stop, errors, separate sessions.

Most tests drive the app in-process with `demo.fake` standing in for the engine (fast, no models);
`test_real_app_streams_generate` starts `python app.py` as a subprocess with the real default models.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

import app
from demo.fake import fake_generate
from tests.app_process import running_app, served

ROOT = Path(__file__).resolve().parent.parent
ARGS = dict(method="mamba-ucb", temperature=0.0, max_new_tokens=24, seed=0, tree="", arms="", lambda_ucb=1.0,
            reward="paper", lookup=True)  # the order of the `generate` inputs


def fake_engine(delay: float = 0.01) -> app.Engine:
    from specdec.config import GenerationConfig

    return app.Engine(make_config=lambda **kw: GenerationConfig(**kw).validate(), prepare=lambda config, progress: None,
                      generate=lambda models, prompt, config, stop, memory: fake_generate(models, prompt, config, stop,
                                                                                         delay))


@pytest.fixture(scope="module")
def url():
    with served(app.build_app(fake_engine())) as address:
        yield address


def call(client: Client, endpoint: str, prompt: str = "Explain speculative decoding.", **changes):
    return client.submit(prompt, *{**ARGS, **changes}.values(), api_name=endpoint)


def test_generate_streams_several_updates(url):
    outputs = list(call(Client(url, verbose=False), "/generate"))
    assert len(outputs) >= 3
    conversation, caption, tree, *_ = outputs[-1]
    assert conversation.count('class="sd-tok"') == 24 and "Done: 24 tokens" in conversation
    assert caption.startswith('<div class="sd-caption"') and "Round" in caption
    assert 'class="sd-node"' in tree
    assert [o[0].count('class="sd-tok"') for o in outputs] == sorted(o[0].count('class="sd-tok"') for o in outputs)
    export = outputs[-1][-1]["value"]
    assert len(json.loads(Path(export).read_text())["rounds"]) == int(caption.split("Round ")[1].split(":")[0])


def test_step_advances_one_round_per_call_and_sessions_stay_apart(url):
    alice, bob = Client(url, verbose=False), Client(url, verbose=False)
    captions = [call(alice, "/step").result()[1] for _ in range(3)]
    assert ["Round 1:" in captions[0], "Round 2:" in captions[1], "Round 3:" in captions[2]] == [True] * 3
    assert "Round 1:" in call(bob, "/step").result()[1]  # bob's run is his own
    assert "Round 4:" in call(alice, "/step").result()[1]


def test_compare_shows_both_runs_and_the_speed_up(url):
    final = call(Client(url, verbose=False), "/compare", max_new_tokens=16).result()
    comparison, verdict = final[7], final[8]
    assert "Target alone" in comparison["value"] and comparison["visible"] is True
    run, base = (float(x) for x in re.search(r"\(([\d.]+) vs ([\d.]+) tokens/s\)", verdict).groups())
    shown = float(re.search(r"Speed-up: ([\d.]+)×", verdict).group(1))
    assert shown == pytest.approx(run / base, abs=0.02)  # the ratio of the two rates it names
    assert f"{run:.1f} tokens/s" in comparison["value"] and f"{base:.1f} tokens/s" in comparison["value"]


def test_stop_ends_the_run_and_the_app_keeps_serving(url):
    client = Client(url, verbose=False)
    job = call(client, "/generate", max_new_tokens=512)
    deadline = time.monotonic() + 30
    while len(job.outputs()) < 3 and not job.done() and time.monotonic() < deadline:
        time.sleep(0.02)
    client.predict(api_name="/stop")
    final = job.result(timeout=30)
    assert "you pressed Stop" in final[0] and final[0].count('class="sd-tok"') < 512
    assert "Done: 24 tokens" in call(client, "/generate").result()[0]


def test_bad_input_gives_a_clear_error(url):
    client = Client(url, verbose=False)
    with pytest.raises(AppError, match="Type a prompt first"):
        call(client, "/generate", prompt="   ").result()
    with pytest.raises(AppError, match="Invalid settings"):
        call(client, "/generate", method="mamba-chain", tree="3,2").result()


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


def test_real_app_streams_generate(tmp_path):
    """The real default models, served from exactly the files the Docker image (the Space) gets."""
    root = image_files(ROOT / "Dockerfile", tmp_path / "image")
    assert (root / "app.py").exists() and (root / "assets" / "drafters").is_dir()
    with running_app(tmp_path / "app.log", root=root) as url:
        job = call(Client(url, verbose=False), "/generate", prompt="Name three colours.", max_new_tokens=16)
        final = job.result(timeout=300)
        outputs = job.outputs()
        assert len(outputs) >= 3  # the prompt at once, then tokens as they come, then the finished run
        assert "Done: " in final[0] and final[0].count('class="sd-tok"') >= 1
        assert 'class="sd-node"' in final[2]


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

    args = {k: v for k, v in ARGS.items() if k != "lookup"}
    on, off = app.settings_of(**args, lookup=True), app.settings_of(**args, lookup=False)
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
