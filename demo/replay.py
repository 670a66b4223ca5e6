"""Replay of an exported run (the app's Export JSON): the same records, played back without any model.

An export is `{"prompt", "settings", "rounds": [RoundRecord as dict...], "summary", "baseline"}` (see
`session.export_payload`). Reading is tolerant: keys this version does not know are ignored (a newer engine may
add some, e.g. the target's dtype), optional keys may be missing; a file without rounds is refused in one sentence.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec.records import ArmStat, BanditSnapshot, EmittedToken, RoundRecord, Summary, TreeNode

MAX_BYTES = 20 * 1024 * 1024  # far above what any export of the app holds: a file this big is not one


@dataclass
class Replay:
    """A loaded run: what the app shows, round by round."""

    name: str
    prompt: str
    settings: dict
    rounds: list[RoundRecord]
    summary: Summary | None = None
    recorded: dict = field(default_factory=dict)  # where and how it was recorded (device, dtypes), when known


def recorded_on(recorded: dict) -> str:
    """The machine and dtype a run was recorded on, as words: "recorded on <processor> (<device>), <dtype>".

    `processor` is `specdec.bench.machine_description()` (CPU model, cores, memory, GPU); older recordings hold
    only `device` and `machine` (the architecture, e.g. x86_64), which do not say how fast the machine was.
    """
    dtype = recorded.get("dtype") or "dtype not recorded"
    device = recorded.get("device")
    if recorded.get("processor"):
        return f"recorded on {recorded['processor']}{f' ({device})' if device else ''}, {dtype}"
    known = " ".join(str(recorded[k]) for k in ("device", "machine") if recorded.get(k))
    where = f"recorded on {known} (machine not recorded)" if known else "machine not recorded"
    return f"{where}, {dtype}"


def _known(cls: type, data: dict, what: str) -> Any:
    """`cls(**data)` with unknown keys dropped; a missing required key becomes one ValueError sentence."""
    if not isinstance(data, dict):
        raise ValueError(f"{what} is not a JSON object")
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        return cls(**{k: v for k, v in data.items() if k in names})
    except TypeError as err:
        missing = sorted(f.name for f in dataclasses.fields(cls) if f.name not in data
                         and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        raise ValueError(f"{what} lacks {', '.join(missing) or 'some fields'} ({err})") from None


def _node(data: dict) -> TreeNode:
    return _known(TreeNode, {"token_id": -1, **data}, "a tree node")


def _token(data: dict) -> EmittedToken:
    return _known(EmittedToken, {"token_id": -1, **data}, "an emitted token")


def _bandit(data: dict | None) -> BanditSnapshot | None:
    if not data:
        return None
    snap = _known(BanditSnapshot, data, "a bandit snapshot")
    snap.arms = [_known(ArmStat, a, "a bandit arm") for a in snap.arms]
    return snap


def round_from_dict(data: dict) -> RoundRecord:
    """A RoundRecord from its exported dict; memory and timing fields default to 0 when missing."""
    defaults = dict(draft_ms=0.0, verify_ms=0.0, round_ms=0.0, elapsed_s=0.0, rss_bytes=0, cuda_allocated_bytes=None,
                    cuda_peak_bytes=None, drafter_state_bytes=0, target_kv_bytes=0, shape=[], shape_name="")
    if not isinstance(data, dict):
        raise ValueError("a round is not a JSON object")
    record = _known(RoundRecord, {**defaults, **data}, f"round {data.get('index', '?')}")
    record.nodes = [_node(n) for n in record.nodes]
    record.emitted = [_token(t) for t in record.emitted]
    record.bandit = _bandit(data.get("bandit"))
    return record


def summary_from_dict(data: dict | None) -> Summary | None:
    if not data:
        return None
    return _known(Summary, {"token_ids": [], **data}, "the summary")


def replay_from_dict(data: dict, name: str = "run") -> Replay:
    """The Replay of an exported run's JSON object; ValueError (one sentence) when it is not one."""
    if not isinstance(data, dict) or not isinstance(data.get("rounds"), list):
        raise ValueError(f"{name} is not an exported run: it has no list of rounds")
    if not data["rounds"]:
        raise ValueError(f"{name} has no rounds to replay")
    rounds = [round_from_dict(r) for r in data["rounds"]]
    return Replay(name, str(data.get("prompt", "")), dict(data.get("settings") or {}), rounds,
                  summary_from_dict(data.get("summary")), dict(data.get("recorded") or {}))


def load_replay(path: Path) -> Replay:
    """Read an exported run from a JSON file."""
    path = Path(path)
    if path.stat().st_size > MAX_BYTES:
        raise ValueError(f"{path.name} is larger than {MAX_BYTES >> 20} MB; it is not an exported run")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path.name} is not a JSON file ({err})") from None
    return replay_from_dict(data, path.name)


def _rounded(value: Any, digits: int = 3) -> Any:
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, list):
        return [_rounded(v, digits) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    return value


def compact_payload(payload: dict, recorded: dict | None = None) -> dict:
    """An export stripped to what replay shows: no token ids, floats to 3 digits, no baseline; plus `recorded`."""
    rounds = []
    for r in payload["rounds"]:
        r = dict(r)
        r["nodes"] = [{k: v for k, v in n.items() if k != "token_id"} for n in r["nodes"]]
        r["emitted"] = [{k: v for k, v in t.items() if k != "token_id"} for t in r["emitted"]]
        rounds.append(r)
    summary = {k: v for k, v in (payload.get("summary") or {}).items() if k != "token_ids"} or None
    out = {"prompt": payload["prompt"], "settings": payload["settings"], "rounds": rounds, "summary": summary}
    if recorded:
        out["recorded"] = recorded
    return _rounded(out)


def recorded_runs(folder: Path) -> dict[str, Path]:
    """The shipped runs in `folder` (`*.json`), by their title (the file's `"title"`, else its name)."""
    runs = {}
    for path in sorted(Path(folder).glob("*.json")):
        try:
            title = json.loads(path.read_text(encoding="utf-8")).get("recorded", {}).get("title")
        except (OSError, ValueError, AttributeError):
            continue
        runs[title or path.stem] = path
    return runs
