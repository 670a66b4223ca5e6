"""The app's plain `complete` API over `gradio_client`: JSON with text, token ids and figures, the page's settings
as keyword parameters with the page's defaults; one check against the CLI with the real default models."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

import app
from demo.live import DEFAULTS
from tests.app_process import ROOT, running_app, served
from tests.page import Page
from tests.test_app_client import ARGS, fake_engine

UNTIMED = dict.fromkeys(("tokens_per_s", "engine_tokens_per_s", "engine_seconds"), 0)  # timings differ run to run

KEYS = {"text", "token_ids", "rounds", "tokens_per_s", "mean_accepted_len", "acceptance_rate", "method", "dtype"}


@pytest.fixture(scope="module")
def url():
    with served(app.build_app(fake_engine(delay=0.001))) as address:
        yield address


def parameters(info: dict, endpoint: str) -> dict:
    """{name: default} of an endpoint's parameters, as the API page lists them."""
    return {p["parameter_name"]: p.get("parameter_default") for p in info["named_endpoints"][endpoint]["parameters"]}


def test_complete_takes_the_pages_settings_with_the_same_defaults(url):
    info = Client(url, verbose=False).view_api(print_info=False, return_format="dict")
    assert parameters(info, "/complete") == {"prompt": None, **DEFAULTS}
    assert list(parameters(info, "/rounds")) == ["prompt", "settings"]  # the same settings, as one dict


def test_complete_returns_the_answer_as_json(url):
    client = Client(url, verbose=False)
    answer = client.predict("Explain speculative decoding.", max_new_tokens=24, api_name="/complete")
    assert KEYS <= set(answer)
    assert len(answer["token_ids"]) == 24 and answer["text"].count(" ") >= 20
    assert answer["method"] == "mamba-ucb" and answer["dtype"] == "float32" and answer["rounds"] >= 1
    page = Page(fake_engine(delay=0.001))
    final = page.last("run", "Explain speculative decoding.", None, **{**ARGS, "max_new_tokens": 24})
    shown = page.value(final, "conversation")
    assert shown.count('class="sd-tok"') == len(answer["token_ids"])  # the page shows the same tokens
    assert "Target in float32." in shown  # the page names the target's precision after a run


def test_complete_follows_method_and_seed(url):
    client = Client(url, verbose=False)
    ar = client.predict("Hi", method="ar", max_new_tokens=8, api_name="/complete")
    assert ar["method"] == "ar" and ar["acceptance_rate"] is None and ar["rounds"] == 8
    first, again, other = ({**client.predict("Hi", max_new_tokens=64, seed=s, reward="paper", api_name="/complete"),
                            **UNTIMED} for s in (3, 3, 4))  # the paper's reward: arms that ignore timings
    assert first == again and first != other  # the seed reaches the engine


def test_complete_refuses_bad_input_in_one_sentence_and_keeps_serving(url):
    client = Client(url, verbose=False)
    with pytest.raises(AppError, match="Type a prompt first"):
        client.predict("  ", api_name="/complete")
    with pytest.raises(AppError, match="Invalid settings"):
        client.predict("Hi", method="mamba-chain", tree="3,2", api_name="/complete")
    assert len(client.predict("Hi", max_new_tokens=8, api_name="/complete")["token_ids"]) == 8


def cli_answer(prompt: str, max_new_tokens: int) -> dict:
    command = [sys.executable, "-m", "specdec", "generate", "--prompt", prompt, "--json",
               "--max-new-tokens", str(max_new_tokens)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_real_complete_equals_the_cli_token_for_token(tmp_path):
    """Greedy: the app's `complete` and `python -m specdec generate --json` give the same tokens, same dtype."""
    prompt, n = "Name three colours.", 24
    with running_app(tmp_path / "app.log") as url:
        answer = Client(url, verbose=False).predict(prompt, max_new_tokens=n, api_name="/complete")
    expected = cli_answer(prompt, n)
    assert answer["dtype"] == expected["extra"]["dtype"]  # `auto` is probed once per machine, not per process
    assert answer["token_ids"] == expected["token_ids"] and answer["text"] == expected["text"]
