"""Hostile and odd input over the API, per-request limits, exports and model ids: each request gets a sensible
result or one clear sentence, and the next request works. The engine is `demo.fake` (no models) except where a
test says otherwise."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

import app
from specdec.models import ModelLoadError, load_model
from tests.app_process import ROOT, close_blocks, free_port
from demo.session import Session
from tests.page import Page
from tests.test_app_client import ARGS, fake_engine

UNTIMED = dict.fromkeys(("tokens_per_s", "engine_tokens_per_s", "engine_seconds"), 0)  # timings differ run to run

LIMITS = app.Limits(max_new_tokens=64, max_prompt_chars=500, queue_size=4)


@pytest.fixture(scope="module")
def client():
    blocks = app.build_app(fake_engine(delay=0.001), limits=LIMITS)
    port = free_port()
    blocks.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield Client(f"http://127.0.0.1:{port}/", verbose=False)
    close_blocks(blocks)


def complete(client: Client, prompt: str, **changes) -> dict:
    return client.predict(prompt, **{**ARGS, "max_new_tokens": 8, **changes}, api_name="/complete")


def refused(client: Client, pattern: str, prompt: str = "Hi", **changes) -> None:
    """The request fails with one sentence matching `pattern` (no traceback), and the next request works."""
    with pytest.raises(AppError) as err:
        complete(client, prompt, **changes)
    message = str(err.value)
    assert re.search(pattern, message) and "Traceback" not in message and "\n" not in message.strip()
    assert len(complete(client, "Hi")["token_ids"]) == 8


@pytest.mark.parametrize("prompt", ["Emoji 🙂🚀 and 👩‍👩‍👧 families", "مرحبا بالعالم، اشرح لي", "请用中文解释推测解码。",
                                    "Tabs\tand\nnewlines\r\nkept"])
def test_unusual_but_valid_text_is_answered(client, prompt):
    assert len(complete(client, prompt)["token_ids"]) == 8


def test_control_characters_and_unpaired_surrogates_are_cleaned():
    assert app.checked_prompt("a\x00b\x1b[31mc\x7f\u0085d\r\ne\tf") == "ab[31mcd\ne\tf"
    assert app.checked_prompt("half \ud800 pair") == "half \ufffd pair"
    with pytest.raises(app.gr.Error, match="Type a prompt first"):
        app.checked_prompt("\x00\x01\x02")


def test_control_characters_over_the_api(client):
    assert len(complete(client, "bell\x07 escape\x1b null\x00 end")["token_ids"]) == 8
    refused(client, "Type a prompt first", prompt="\x00\x07\x1b")


@pytest.mark.parametrize("name, value", [("temperature", "nan"), ("temperature", "inf"), ("lambda_ucb", "-inf"),
                                         ("max_new_tokens", "nan"), ("seed", "inf"), ("min_branch_q", "nan"),
                                         ("min_expand_q", "nan")])
def test_non_finite_numbers_are_refused_in_one_sentence(name, value):
    with pytest.raises(app.gr.Error, match="must be a finite number"):
        app.settings_of({**ARGS, name: float(value)})


def test_numbers_out_of_range_over_the_api(client):
    refused(client, "seed must be a whole number", seed=10**30)
    refused(client, "seed must be a whole number", seed=-1)
    refused(client, "at most 64 new tokens", max_new_tokens=65)
    refused(client, "temperature", temperature=-1)
    refused(client, "min_branch_q must be in \\[0, 1\\), got 1.0", min_branch_q=1.0)
    refused(client, "min_expand_q must be in \\[0, 1\\], got -0.1", min_expand_q=-0.1)
    refused(client, "max_new_tokens must be an integer from 1", max_new_tokens=0)  # refused, not clamped
    assert len(complete(client, "Hi", seed=app.MAX_SEED)["token_ids"]) == 8


def test_the_trimming_threshold_reaches_the_engine():
    assert fake_engine().make_config(**app.settings_of(ARGS)).min_branch_q == app.DEFAULTS["min_branch_q"]
    assert fake_engine().make_config(**app.settings_of({**ARGS, "min_branch_q": 0.3})).min_branch_q == 0.3
    assert fake_engine().make_config(**app.settings_of(ARGS)).min_expand_q == app.DEFAULTS["min_expand_q"]
    assert fake_engine().make_config(**app.settings_of({**ARGS, "min_expand_q": 0.6})).min_expand_q == 0.6


def test_prompt_length_cap(client):
    assert len(complete(client, "x" * 500)["token_ids"]) == 8  # exactly at the cap
    refused(client, "501 characters; at most 500", prompt="x" * 501)


FIFTY_ARMS = "; ".join(f"{a},{b}" for a in range(1, 8) for b in range(1, 9)).split("; ")[:50]  # distinct shapes


def test_fifty_bandit_arms():
    config = fake_engine().make_config(**app.settings_of({**ARGS, "arms": "; ".join(FIFTY_ARMS)}))
    assert len(config.shapes()) == 50
    with pytest.raises(ValueError, match="must differ"):
        fake_engine().make_config(**app.settings_of({**ARGS, "arms": "; ".join(["2,1"] * 50)}))


def test_fifty_arms_over_the_api(client):
    assert len(complete(client, "Hi", arms="; ".join(FIFTY_ARMS))["token_ids"]) == 8
    refused(client, "Invalid settings: .*must differ", arms="; ".join(["2,1"] * 50))


def test_export_after_a_stopped_run_is_a_valid_file_under_the_temp_folder():
    page, session = Page(fake_engine(delay=0.001), LIMITS), Session()
    updates = page.press("run", "../../etc/passwd.json", session, **{**ARGS, "max_new_tokens": 64})
    next(updates), next(updates)
    app.stop_run(session)
    *_, final = updates
    path = Path(page.value(final, "export")["path"])
    assert path.resolve().is_relative_to(Path(tempfile.gettempdir()).resolve())
    assert re.fullmatch(r"specdec-run-\d{8}-\d{6}-[0-9a-f]{6}\.json", path.name)  # a generated name, not the prompt's
    run = json.loads(path.read_text(encoding="utf-8"))
    assert run["prompt"] == "../../etc/passwd.json" and run["summary"]["stop_reason"] in ("stopped", "max_new_tokens")
    assert len(run["rounds"]) >= 1


def test_limits_come_from_the_environment(monkeypatch):
    assert app.Limits.from_env() == app.Limits()
    monkeypatch.setenv("SPECDEC_MAX_NEW_TOKENS", "32")
    monkeypatch.setenv("SPECDEC_MAX_PROMPT_CHARS", "100")
    monkeypatch.setenv("SPECDEC_QUEUE_SIZE", "3")
    assert app.Limits.from_env() == app.Limits(32, 100, 3)


def test_hub_model_ids_are_refused_unless_allowed(monkeypatch):
    monkeypatch.delenv("SPECDEC_ALLOW_HUB_MODELS", raising=False)
    with pytest.raises(SystemExit, match="someone/some-model.*SPECDEC_ALLOW_HUB_MODELS=1"):
        app.main(["--target", "someone/some-model"])
    assert app.hub_models(app.parse_args([])) == []  # the shipped presets need no permission
    assert app.hub_models(app.parse_args(["--drafter", str(ROOT / "assets")])) == []  # nor a local folder


def test_models_load_in_the_background_at_start():
    loaded = threading.Event()
    seen = {}

    def prepare(config, progress):
        seen.update(method=config.method, thread=threading.current_thread().name)
        loaded.set()

    engine, worker, ready = fake_engine(), app.EngineThread().start(), threading.Event()
    app.warm_up(app.Engine(engine.make_config, prepare, engine.generate), worker, ready)
    assert loaded.wait(10) and seen == {"method": "mamba-ucb", "thread": "engine"}  # the thread every run uses
    assert ready.wait(10)  # the page's "Models ready"


def test_one_progress_indicator_where_the_answer_appears():
    blocks = app.build_app(fake_engine())
    config = blocks.get_config_file()
    conversation = next(c["id"] for c in config["components"] if c.get("props", {}).get("elem_id") == "conversation")
    model_events = [d for d in config["dependencies"] if d.get("api_name") in ("generate", "step", "compare")]
    assert len(model_events) == 3
    assert all(d["show_progress_on"] == [conversation] for d in model_events)


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"},
                                 {"HF_HUB_OFFLINE": "0", "HTTPS_PROXY": "http://127.0.0.1:9"}])
def test_unknown_hub_model_fails_in_seconds(monkeypatch, env):
    """Decided before the hub client (and its retries) is reached: offline at once, else by one connection
    attempt with a timeout of a few seconds."""
    import socket

    import torch

    import specdec.models

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    attempts = []

    def refused(address, timeout=None):
        attempts.append(timeout)
        raise ConnectionRefusedError(f"{address} refused")

    def hub_client(*args, **kwargs):
        raise AssertionError("the hub client was reached")

    monkeypatch.setattr(socket, "create_connection", refused)
    monkeypatch.setattr(specdec.models, "_from_pretrained", hub_client)
    with pytest.raises(ModelLoadError, match="nobody-here/no-such-model.*cannot be"):
        load_model("nobody-here/no-such-model", torch.device("cpu"), torch.float32)
    offline = env["HF_HUB_OFFLINE"] == "1"
    assert attempts == [] if offline else len(attempts) == 1 and 0 < attempts[0] <= 5


NO_NETWORK = """
import socket, sys
tried = []
def refuse(self, address, *args):
    tried.append(address)
    raise OSError("network blocked by the test")
socket.socket.connect = refuse
from specdec.models import Models

models = Models("smollm2-135m-instruct", device="cpu", dtype="float32", drafter_dtype="float32")
models.load(lambda message: None)
models.drafter("mamba", lambda message: None)
print("tried", tried)
"""


def test_local_models_load_without_any_network_access():
    """Hub online as far as the environment says, an unreachable proxy, and every socket connect refused."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9", HF_HUB_DISABLE_TELEMETRY="1")
    done = subprocess.run([sys.executable, "-c", NO_NETWORK], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "tried []"


def answer_alone(client: Client, request: dict) -> dict:
    return {**client.predict(**request, api_name="/complete"), **UNTIMED}


@pytest.mark.parametrize("clients", [4, 8])
def test_simultaneous_clients_each_get_what_they_get_alone(client, clients):
    methods = ("mamba-ucb", "ar", "mamba-tree", "lookup-chain")
    requests = [dict(prompt=f"Prompt number {i}", method=methods[i % 4], seed=i, max_new_tokens=8 + 4 * (i % 3),
                     temperature=0.7 * (i % 2), tree="", arms="", lambda_ucb=0.1, reward="paper", lookup=True)
                for i in range(clients)]
    alone = [answer_alone(client, r) for r in requests]
    jobs = [Client(client.src, verbose=False).submit(**r, api_name="/complete") for r in requests]
    together = [{**job.result(timeout=60), **UNTIMED} for job in jobs]
    assert together == alone


def test_a_full_queue_refuses_in_one_sentence_and_recovers():
    blocks = app.build_app(fake_engine(delay=0.1), limits=app.Limits(queue_size=2))
    port = free_port()
    blocks.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        url = f"http://127.0.0.1:{port}/"
        clients = [Client(url, verbose=False) for _ in range(8)]  # connected first, so the 8 requests come at once
        jobs = [c.submit("Hi", max_new_tokens=32, api_name="/complete") for c in clients]
        outcomes = []
        for job in jobs:
            try:
                outcomes.append(len(job.result(timeout=60)["token_ids"]))
            except Exception as err:  # gradio_client's QueueError or AppError, whichever the version raises
                outcomes.append(str(err))
        refusals = [o for o in outcomes if isinstance(o, str)]
        assert refusals and all("queue is full" in r.lower() for r in refusals)
        assert outcomes.count(32) >= 2 and len(refusals) + outcomes.count(32) == 8
        assert len(Client(url, verbose=False).predict("Hi", max_new_tokens=8, api_name="/complete")["token_ids"]) == 8
    finally:
        close_blocks(blocks)


def watched_engine(delay: float) -> tuple[app.Engine, threading.Event, list[int]]:
    """The fake engine, with an event set when a run's generator is closed and each round's emitted tokens."""
    base, closed, emitted = fake_engine(delay), threading.Event(), []

    def generate(models, prompt, config, stop, memory):
        try:
            for event in base.generate(models, prompt, config, stop, memory):
                emitted.extend([len(event.emitted)] if hasattr(event, "emitted") else [])
                yield event
        finally:
            closed.set()

    return app.Engine(base.make_config, base.prepare, generate), closed, emitted


def wait_until(condition, seconds: float = 30) -> bool:
    """Poll `condition` until it holds; False after `seconds` (a test's safety net, not a measurement)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("endpoint", ["/complete", "/rounds"])
def test_a_cancelled_request_closes_its_engine_run_within_a_round(endpoint):
    """A client's `Job.cancel()` mid-run: the engine run is closed at its next round, long before its 512 tokens,
    the app's open engine runs (`/status`) drop to 0, and the next request works."""
    engine, closed, emitted = watched_engine(delay=0.02)
    blocks = app.build_app(engine, limits=app.Limits(max_new_tokens=512))
    port = free_port()
    blocks.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        runs = lambda: client.predict(api_name="/status")["engine_runs"]  # noqa: E731
        settings = {**ARGS, "max_new_tokens": 512}
        job = client.submit("Hi", **settings, api_name=endpoint) if endpoint == "/complete" else \
            client.submit("Hi", settings, api_name=endpoint)
        assert wait_until(lambda: len(emitted) >= 3) and runs() == 1 and not job.done()
        job.cancel()
        assert closed.wait(30) and sum(emitted) < 512  # stopped, not run to its end
        assert wait_until(lambda: runs() == 0)
        assert len(client.predict("Hi", max_new_tokens=8, api_name="/complete")["token_ids"]) == 8
    finally:
        close_blocks(blocks)
