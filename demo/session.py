"""Per-browser-session run state (held in `gr.State`), and the JSON export of a run."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from demo.replay import Replay
from specdec.records import RoundRecord, Summary


@dataclass
class Session:
    """What one browser tab has run: the latest run's rounds and summary, plus the target-only baseline."""

    prompt: str = ""
    settings: dict = field(default_factory=dict)
    rounds: list[RoundRecord] = field(default_factory=list)
    summary: Summary | None = None
    baseline: Summary | None = None  # compare mode: the same prompt decoded by the target alone
    stop: threading.Event = field(default_factory=threading.Event)
    stepper: Iterator | None = None  # step mode: the paused engine run, advanced one round per click
    memory: dict = field(default_factory=dict)  # engine state kept across runs (the bandit), never shared
    replay: Replay | None = None  # replay mode: the loaded run, whose rounds are added to `rounds` one by one
    large: bool = False  # the presenter's large type (the tree is drawn with a bigger font)
    comparing: bool = False  # the run is Compare's: the target alone first (`baseline`), then the method

    def target_alone(self) -> Summary | None:
        """The tab's last run of the target alone on this prompt, if any (a verdict's measured baseline)."""
        return self.memory.get("target_alone", {}).get(self.prompt)

    def remember_target_alone(self, summary: Summary | None = None) -> None:
        """Keep `summary` (this run's by default), a run of the target alone, as this prompt's baseline."""
        summary = summary or self.summary
        if summary is not None and summary.stop_reason != "stopped":
            self.memory.setdefault("target_alone", {})[self.prompt] = summary

    def start(self, prompt: str, settings: dict) -> None:
        """Forget the previous run (closing a paused step run) and arm a fresh Stop event."""
        self.close_stepper()
        self.prompt, self.settings = prompt, dict(settings)
        self.rounds, self.summary, self.baseline, self.replay = [], None, None, None
        self.comparing = False
        self.stop = threading.Event()

    def add(self, event: RoundRecord | Summary) -> None:
        if isinstance(event, RoundRecord):
            self.rounds.append(event)
        else:
            self.summary = event

    def close_stepper(self) -> None:
        if self.stepper is not None:
            close = getattr(self.stepper, "close", None)
            if close:
                close()
            self.stepper = None

    def round_at(self, index: int | None) -> RoundRecord | None:
        """The round at `index` (clamped); the latest when `index` is None."""
        if not self.rounds:
            return None
        i = len(self.rounds) - 1 if index is None else min(max(int(index), 0), len(self.rounds) - 1)
        return self.rounds[i]


def export_payload(session: Session) -> dict:
    """The run as plain JSON-able data: prompt, settings, every round record, the summary (and baseline)."""
    return {
        "prompt": session.prompt,
        "settings": session.settings,
        "rounds": [r.to_dict() for r in session.rounds],
        "summary": session.summary.to_dict() if session.summary else None,
        "baseline": session.baseline.to_dict() if session.baseline else None,
    }


def write_export(session: Session, folder: Path, keep_s: float = 3600.0) -> Path:
    """Write the run to `folder/specdec-run-<time>-<random>.json` (deleting exports older than `keep_s`)."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("specdec-run-*.json"):
        if time.time() - old.stat().st_mtime > keep_s:
            old.unlink(missing_ok=True)
    path = folder / f"specdec-run-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(export_payload(session), indent=1, ensure_ascii=False), encoding="utf-8")
    return path
