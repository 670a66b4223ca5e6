"""Simultaneous clients against a real `python app.py` (the default models) started with SPECDEC_QUEUE_SIZE=8:
4 and then 8 requests at once with different prompts, methods and seeds, greedy and sampled, each get what the
same request gets alone; more requests than the queue holds are refused in one sentence and the app keeps serving;
two tabs running the page at once (its handlers in-process, over the same real engine) each keep their own
bandit."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from gradio_client import Client

import app
from demo.session import Session
from tests.app_process import app_process
from tests.page import Page

UNTIMED = dict.fromkeys(("tokens_per_s", "engine_tokens_per_s", "engine_seconds"), 0)  # timings differ run to run

QUEUE_SIZE = 8
PROMPTS = ("Explain speculative decoding.", "Name three colours.", "Write a haiku about rivers.",
           "def fibonacci(n):", "Summarise: the cat sat on the mat because the mat was warm.",
           "请用中文解释推测解码。", "Why is the sky blue?", "List the planets of the solar system.")
METHODS = ("mamba-ucb", "mamba-tree", "lookup-chain", "ar", "mamba-chain")
# The paper's reward: the throughput reward's arms follow the measured timings, so a sampled run's tokens (exact in
# distribution either way) would depend on how busy the machine was, and "what it gets alone" would not be one answer.
REQUESTS = [dict(prompt=PROMPTS[i], method=METHODS[i % len(METHODS)], temperature=0.8 * (i % 2), seed=100 + i,
                 max_new_tokens=12 + 2 * (i % 3), reward="paper") for i in range(8)]
PAGE = dict(method="mamba-ucb", temperature=0.0, max_new_tokens=16, seed=0, tree="", arms="", lambda_ucb=0.1,
            reward="paper", lookup=True)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPECDEC_QUEUE_SIZE", str(QUEUE_SIZE))
        with app_process(tmp_path_factory.mktemp("app") / "app.log") as (url, _):
            yield url


@pytest.fixture(scope="module")
def alone(url) -> list[dict]:
    """Each request's answer when it is the only one (tokens/s left out: it is a timing)."""
    client = Client(url, verbose=False)
    return [{**client.predict(**r, api_name="/complete"), **UNTIMED} for r in REQUESTS]


@pytest.mark.parametrize("clients", [4, 8])
def test_simultaneous_clients_each_get_what_they_get_alone(url, alone, clients):
    sessions = [Client(url, verbose=False) for _ in range(clients)]  # connected first, so the requests come at once
    jobs = [session.submit(**r, api_name="/complete") for session, r in zip(sessions, REQUESTS, strict=False)]
    together = [{**job.result(timeout=600), **UNTIMED} for job in jobs]
    assert together == alone[:clients]
    assert {a["method"] for a in together} >= {"mamba-ucb", "ar"} and len({a["text"] for a in together}) == clients


def bandit_pulls(page: Page, final: dict) -> tuple[list[int], list[int]]:
    """Total bandit pulls after each round of a Generate run, and its token ids, read from its export."""
    export = json.loads(Path(page.value(final, "export")["path"]).read_text(encoding="utf-8"))
    return [sum(arm["pulls"] for arm in r["bandit"]["arms"]) for r in export["rounds"]], export["summary"]["token_ids"]


def test_each_browser_session_keeps_its_own_bandit():
    args = app.parse_args([])
    page = Page(app.real_engine(args.target, app.drafter_specs(args), args.device, args.dtype, args.drafter_dtype))
    alice, bob = Session(), Session()
    finals: dict[str, dict] = {}

    def generate(name: str, session: Session) -> None:
        finals[name] = page.last("run", "Explain speculative decoding.", session, **PAGE)

    tabs = [threading.Thread(target=generate, args=(name, session)) for name, session in (("alice", alice),
                                                                                         ("bob", bob))]
    for tab in tabs:  # at the same time
        tab.start()
    for tab in tabs:
        tab.join(600)
    (alice_pulls, alice_ids), (bob_pulls, bob_ids) = (bandit_pulls(page, finals[name]) for name in ("alice", "bob"))
    alice_again, alice_again_ids = bandit_pulls(page, page.last("run", "Explain speculative decoding.", alice, **PAGE))
    assert alice_pulls == list(range(1, len(alice_pulls) + 1))  # a fresh bandit: one pull per round
    assert bob_pulls == list(range(1, len(bob_pulls) + 1))  # bob's starts fresh though alice's ran next to it
    assert alice_again == list(range(len(alice_pulls) + 1, len(alice_pulls) + len(alice_again) + 1))  # and goes on
    assert alice_ids == bob_ids == alice_again_ids  # greedy: the bandit changes the trees, never the text


def test_a_full_queue_refuses_in_one_sentence_and_recovers(url):
    clients = [Client(url, verbose=False) for _ in range(QUEUE_SIZE + 6)]
    jobs = [c.submit("Hi", method="ar", max_new_tokens=8, api_name="/complete") for c in clients]
    outcomes = []
    for job in jobs:
        try:
            outcomes.append(len(job.result(timeout=600)["token_ids"]))
        except Exception as err:  # gradio_client's QueueError or AppError, whichever the version raises
            outcomes.append(f"{type(err).__name__}: {err}")
    refusals = [o for o in outcomes if isinstance(o, str)]
    assert refusals and all(r == "QueueError: Queue is full! Please try again." for r in refusals), refusals
    assert outcomes.count(8) >= QUEUE_SIZE and len(refusals) + outcomes.count(8) == len(jobs)
    assert len(Client(url, verbose=False).predict("Hi", max_new_tokens=8, api_name="/complete")["token_ids"]) == 8
