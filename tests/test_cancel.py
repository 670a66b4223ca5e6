"""Twenty client cancellations (`Job.cancel()`) at random moments against a real `python app.py` with its default
models, interleaved with normal runs: one while the models load, the others at random times inside runs (most of a
run's time is a round's drafting or verification) or after a random number of streamed updates. After each, the
engine run closes within seconds; afterwards the next greedy run equals an uncancelled one token for token and the
server's RSS is back near its level."""

from __future__ import annotations

import random
import time

from gradio_client import Client

from scripts.soak import rss_mb
from tests.app_process import app_process

PROMPT = "Write a long story about a dragon who learns to read."  # long answers: no run ends before its cancel
SETTINGS = dict(method="mamba-ucb", temperature=0.0, max_new_tokens=16, seed=0, tree="", arms="", lambda_ucb=0.1,
                reward="paper", lookup=True)
CANCELLED_RUN = dict(SETTINGS, max_new_tokens=256)  # cancelled within the time 16 tokens take, so never finished
METHODS = ("mamba-ucb", "mamba-tree", "lookup-chain", "ar")


def tokens(client: Client, **changes) -> list[int]:
    return client.predict(PROMPT, **{**SETTINGS, **changes}, api_name="/complete")["token_ids"]


def wait_idle(client: Client, seconds: float = 30) -> float:
    """Seconds until the app reports no open engine run; fails after `seconds`."""
    started = time.monotonic()
    while client.predict(api_name="/status")["engine_runs"] != 0:
        assert time.monotonic() - started < seconds, "an engine run was still open after the cancel"
        time.sleep(0.05)
    return time.monotonic() - started


def cancel_at(job, rng: random.Random, latest_s: float, streamed: bool) -> None:
    """Cancel `job` after a random number of streamed updates (`streamed`) or at a random time up to `latest_s`."""
    if streamed:
        updates = rng.randint(2, 4)
        while len(job.outputs()) < updates and not job.done():
            time.sleep(0.005)
        moment = f"after {updates} updates"
    else:
        delay = rng.uniform(0.05, latest_s)
        time.sleep(delay)
        moment = f"at {delay:.2f} s"
    assert not job.done(), f"the run ended before its cancel {moment}: the test's moments are too late"
    job.cancel()


def test_twenty_random_cancels_leave_nothing_behind(tmp_path):
    """Long: a real server with its default models, twenty cancels, and a normal run after every fourth (the
    module docstring says why each part is there)."""
    rng = random.Random(14)
    with app_process(tmp_path / "app.log") as (url, pid):
        client = Client(url, verbose=False)
        loading = client.submit(PROMPT, **SETTINGS, api_name="/complete")  # the models are loading as the page is up
        time.sleep(rng.uniform(0.1, 0.5))
        assert not loading.done()
        loading.cancel()
        wait_idle(client, seconds=180)  # the load goes on to its end; the cancelled run stops before its first round

        reference = tokens(client)
        sampled = tokens(client, temperature=0.8, seed=7)
        for method in METHODS:  # every method's models are loaded and warm before RSS is taken
            tokens(client, method=method, max_new_tokens=8)
        started = time.monotonic()
        assert tokens(client) == reference
        reference_s = time.monotonic() - started
        rss_before = None

        for i in range(19):  # with the cancel while loading, 20
            run = dict(CANCELLED_RUN, method=METHODS[i % 4], temperature=rng.choice([0.0, 0.8]), seed=i)
            endpoint = rng.choice(["/rounds", "/complete"])
            job = client.submit(PROMPT, run, api_name=endpoint) if endpoint == "/rounds" else \
                client.submit(PROMPT, **run, api_name=endpoint)
            cancel_at(job, rng, reference_s, streamed=endpoint == "/rounds" and i % 2 == 1)
            wait_idle(client)
            if i % 4 == 3:  # a normal run between cancels
                assert tokens(client) == reference
            if i == 3:  # RSS after the first cancels of every kind: their threads' allocator pages are in place
                rss_before = rss_mb(pid)

        assert tokens(client) == reference
        assert tokens(client, temperature=0.8, seed=7) == sampled
        streamed = list(client.submit(PROMPT, SETTINGS, api_name="/rounds"))  # the streamed run, same client
        assert streamed[-1]["summary"]["token_ids"] == reference
        wait_idle(client)
        # the allocator keeps some freed pages per worker thread (55 MB seen once on a loaded machine when this was
        # taken before the first cancel); a leak of one run's state (its KV buffers alone: 6 MB) in each of the last 15
        # cancels would pass 50 MB, the bound the soak test uses over 1,000 rounds
        assert rss_mb(pid) - rss_before < 50
