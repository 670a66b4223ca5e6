"""Soak the app: many `complete` requests against one `python app.py` process, printing its RSS and per-round latency.

    .venv/bin/python scripts/soak.py --rounds 1000 [--port 7861] [--max-new-tokens 96]

One line per request (request number, rounds so far, server RSS in MB, mean ms per round of that request), then
a verdict: RSS growth after the warm-up request and the slope of per-round latency over the run. Take its figures
on a quiet machine only: other load changes both.
"""

from __future__ import annotations

import argparse
import itertools
import os
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


def start_app(port: int) -> subprocess.Popen:
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"app.py did not answer on port {port} within 120 s")


def slope(values: list[float]) -> float:
    """Least-squares slope of `values` against their index (units per request)."""
    n = len(values)
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    num = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values))
    den = sum((i - mean_x) ** 2 for i in range(n))
    return num / den if den else 0.0


def soak(port: int, rounds: int, max_new_tokens: int) -> None:
    proc = start_app(port)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        total, rss, per_round = 0, [], []
        requests = zip(itertools.cycle(PROMPTS), itertools.cycle(METHODS))
        for n, (prompt, method) in enumerate(requests, start=1):
            started = time.perf_counter()
            answer = client.predict(prompt, method=method, max_new_tokens=max_new_tokens, seed=n,
                                    api_name="/complete")
            ms = (time.perf_counter() - started) * 1000 / max(answer["rounds"], 1)
            total += answer["rounds"]
            rss.append(rss_mb(proc.pid))
            per_round.append(ms)
            print(f"{n}\t{total}\t{rss[-1]:.1f}\t{ms:.1f}", flush=True)
            if total >= rounds:
                break
        print(f"requests {n}, rounds {total}; RSS after warm-up {rss[0]:.1f} MB -> {rss[-1]:.1f} MB "
              f"(+{rss[-1] - rss[0]:.1f} MB); per-round latency slope {slope(per_round[1:]):+.3f} ms per request")
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=1000, help="stop after this many engine rounds in all")
    p.add_argument("--port", type=int, default=7861)
    p.add_argument("--max-new-tokens", type=int, default=96)
    args = p.parse_args()
    soak(args.port, args.rounds, args.max_new_tokens)


if __name__ == "__main__":
    main()
