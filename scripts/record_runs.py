"""Record the runs the app offers for replay (`assets/runs/*.json`) from the real default models.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/record_runs.py [--out assets/runs] [--device cpu]

Each run uses the app's own default settings (`app.settings_of` with `demo.live.DEFAULTS`) and its engine calls,
so a replay shows exactly what the app would have shown live; the file is the app's export, compacted
(`demo.replay.compact_payload`), with a `recorded` block saying what ran it (device, CPU model and GPU, dtype).
Re-record on a quiet machine: the timings in the files are the ones measured while recording.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import app  # noqa: E402
from demo.live import DEFAULTS  # noqa: E402
from demo.prompts import load_prompts  # noqa: E402
from demo.replay import compact_payload  # noqa: E402
from demo.session import Session, export_payload  # noqa: E402
from specdec.bench import machine_description  # noqa: E402

RUNS = {  # file name -> (title, prompt id, changes to the defaults)
    "code-greedy": ("Code: a Python function (greedy)", "code-02", {}),
    "summary-lookup": ("Summary with the lookup branch (greedy)", "summary-01", {}),
    "chat-sampled": ("Sampled answer (temperature 0.8, seed 1)", "chat-04", {"temperature": 0.8, "seed": 1}),
}
MAX_BYTES = 300_000


def record(engine: app.Engine, prompt: str, settings: dict) -> Session:
    session = Session()
    session.start(prompt, settings)
    config = engine.make_config(**settings)
    models = engine.prepare(config, lambda message: print(" ", message, flush=True))
    for event in engine.generate(models, prompt, config, session.stop, session.memory):
        session.add(event)
    return session


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "assets" / "runs")
    p.add_argument("--device", default="cpu")
    p.add_argument("--only", nargs="*", choices=list(RUNS), help="record only these runs")
    args = p.parse_args(argv)
    prompts = {item["id"]: item["prompt"] for items in load_prompts(ROOT / "assets" / "prompts").values()
               for item in items}
    engine = app.real_engine("smollm2-135m-instruct", {}, args.device, "auto", "auto")
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only or RUNS:
        title, prompt_id, changes = RUNS[name]
        settings = app.settings_of(changes)
        print(f"{name}: {title}", flush=True)
        session = record(engine, prompts[prompt_id], settings)
        recorded = {"title": title, "prompt_id": prompt_id, "device": args.device, "machine": platform.machine(),
                    "processor": machine_description(), "date": time.strftime("%Y-%m-%d"),
                    **session.summary.extra}  # extra: the target's dtype, the drafter, the prompt's tokens
        data = compact_payload(export_payload(session), recorded)
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        if len(text.encode()) > MAX_BYTES:
            raise SystemExit(f"{name} is {len(text.encode())} bytes, over {MAX_BYTES}; record fewer tokens")
        (args.out / f"{name}.json").write_text(text, encoding="utf-8")
        copied = sum(n["copied"] for r in data["rounds"] for n in r["nodes"])
        s = session.summary
        print(f"  {s.new_tokens} tokens in {s.rounds} rounds, {copied} copied nodes, {len(text) // 1024} KiB",
              flush=True)


if __name__ == "__main__":
    main()
