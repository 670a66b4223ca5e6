"""Soak the app: many `complete` requests against one `python app.py` process, printing its RSS and per-round latency.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/soak.py --rounds 1000 [--max-new-tokens 32] [--warm-up 8]

Requests cycle through prompts and methods, greedy and sampled, a new seed each. One line per request (request
number, rounds so far, server RSS in MB, mean ms per round of that request: its wall time over its rounds), then a
verdict: RSS after the warm-up requests against the end, and per-round latency in the first and last tenth of the
rounds after the warm-up. Take its figures on a quiet machine only: other load changes both.
"""

from __future__ import annotations

import argparse
import itertools
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from gradio_client import Client

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ("Explain speculative decoding.", "Name three colours.", "Write a haiku about rivers.",
           "Summarise: the cat sat on the mat because the mat was warm.", "def fibonacci(n):")
METHODS = ("mamba-ucb", "mamba-tree", "lookup-chain", "ar")


def rss_mb(pid: int) -> float:
    """Resident set size of process `pid` in MB, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(port: int, seconds: float = 300) -> subprocess.Popen:
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"app.py did not answer on port {port} within {seconds:.0f} s")


def decile_means(per_round_ms: list[float]) -> tuple[float, float]:
    """Mean latency of the first and of the last tenth of `per_round_ms` (one value per round, in order)."""
    tenth = max(len(per_round_ms) // 10, 1)
    return statistics.fmean(per_round_ms[:tenth]), statistics.fmean(per_round_ms[-tenth:])


def soak(rounds: int, max_new_tokens: int, warm_up: int) -> None:
    proc = start_app(port := free_port())
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        total, rss, per_round = 0, [], []  # per_round: each request's mean ms per round, once per round it ran
        started = time.monotonic()
        requests = zip(itertools.cycle(PROMPTS), itertools.cycle(METHODS), itertools.cycle((0.0, 0.0, 0.8)))
        for n, (prompt, method, temperature) in enumerate(requests, start=1):
            began = time.perf_counter()
            answer = client.predict(prompt, method=method, temperature=temperature, max_new_tokens=max_new_tokens,
                                    seed=n, api_name="/complete")
            ms = (time.perf_counter() - began) * 1000 / max(answer["rounds"], 1)
            rss.append(rss_mb(proc.pid))
            if n > warm_up:
                total += answer["rounds"]
                per_round += [ms] * answer["rounds"]
            print(f"{n}\t{total}\t{rss[-1]:.1f}\t{ms:.1f}", flush=True)
            if total >= rounds:
                break
        first, last = decile_means(per_round)
        print(f"requests {n} ({warm_up} warm-up), rounds after warm-up {total}, {time.monotonic() - started:.0f} s; "
              f"RSS after warm-up {rss[warm_up - 1]:.1f} MB -> end {rss[-1]:.1f} MB "
              f"({rss[-1] - rss[warm_up - 1]:+.1f} MB; max {max(rss[warm_up - 1:]):.1f}); "
              f"ms per round: first tenth {first:.1f}, last tenth {last:.1f} ({last / first - 1:+.0%})")
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=1000, help="stop after this many engine rounds after the warm-up")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--warm-up", type=int, default=2 * len(METHODS), help="requests before RSS is taken (>= 1)")
    args = p.parse_args()
    soak(args.rounds, args.max_new_tokens, max(args.warm_up, 1))


if __name__ == "__main__":
    main()
