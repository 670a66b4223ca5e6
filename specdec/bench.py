"""Benchmark: the engine's methods side by side with transformers' own decoding, on the same machine in one run.

Methods are interleaved prompt by prompt after a warm-up, so a drifting machine hits all of them alike.
A method is a name from `specdec.config.METHODS` (optionally `name:tree`, e.g. `mamba-tree:3,2,1`) or a peer:
    hf-ar        `model.generate` greedy/sampling with the KV cache
    hf-assisted  `generate(assistant_model=<the Transformer drafter>)`
    hf-lookup    `generate(prompt_lookup_num_tokens=10)`
    ar-float32   the engine's `ar` on a float32 copy of the target, whatever `--dtype` the others use
Throughput is new tokens / wall seconds of the whole call (prefill included), median over prompts.
"""

from __future__ import annotations

import csv
import json
import platform
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import NamedTuple

import psutil
import torch

from specdec.bandit import UCBBandit
from specdec.config import BANDIT_SCOPES, LOOKUP_BRANCH, METHODS, REWARDS, GenerationConfig, default_arms
from specdec.engine import encode_prompt, generate
from specdec.models import Models
from specdec.passages import LONG_TOPICS, example_documents, long_passage, summary_prompt
from specdec.records import RoundRecord, Summary, depth_reached

HF_METHODS = ("hf-ar", "hf-assisted", "hf-lookup")
FLOAT32_AR = "ar-float32"  # the engine's `ar` with a float32 copy of the target: what exactness cost before bf16
PROMPT_DIR = Path(__file__).resolve().parent.parent / "assets" / "prompts"


def load_prompts(paths: list[str] | None, limit: int | None = None) -> list[dict]:
    files = [Path(p) for p in paths] if paths else sorted(PROMPT_DIR.glob("*.jsonl"))
    prompts = []
    for file in files:
        for n, line in enumerate(file.read_text().splitlines()):
            if line.strip():
                item = json.loads(line)
                if "prompt" not in item:
                    raise ValueError(f"{file}:{n + 1}: every line needs a 'prompt'")
                item.setdefault("id", f"{file.stem}-{n + 1}")
                item.setdefault("kind", file.stem)
                prompts.append(item)
    if not prompts:
        raise ValueError("no prompts found")
    if limit:  # keep every kind represented: take round-robin across kinds
        kinds = {}
        for item in prompts:
            kinds.setdefault(item["kind"], []).append(item)
        interleaved = [x for group in zip(*kinds.values()) for x in group]
        prompts = interleaved[:limit]
    return prompts


class MethodSpec(NamedTuple):
    base: str  # a name from METHODS or HF_METHODS
    tree: str | None
    reward: str | None
    lookup_branch: int  # 0: none
    min_branch_q: float | None = None  # None: the run's setting
    min_expand_q: float | None = None  # None: the run's setting


def parse_method(name: str) -> MethodSpec:
    """`base[:tree][@reward][+lookup[N]][~Q]`, e.g. `mamba-tree:3,1,1`, `mamba-ucb@throughput`, `mamba-ucb+lookup`,
    `mamba-ucb~0`. A bandit method's `:` part is its arms, separated by `|`: `mamba-ucb:0|1|3|2,1,1`.

    `+lookup` grafts a prompt-lookup branch of N tokens (default LOOKUP_BRANCH) onto a neural drafter's trees;
    `~Q` trims the method's trees at branch probability Q, its leaves and its expansions alike (`~0`: whole
    shapes); `~Q/E` drops leaves below Q and expands nodes from E (`GenerationConfig.min_branch_q`, `min_expand_q`).
    """
    name, _, trim = name.partition("~")
    min_branch_q = min_expand_q = None
    if trim:
        leaf, _, expand = trim.partition("/")
        try:
            min_branch_q = float(leaf)
            min_expand_q = float(expand) if expand else min_branch_q
        except ValueError:
            raise ValueError(f"'~{trim}' in {name!r}: give the branch probability to trim at, e.g. ~0.05 "
                             "or ~0.05/0.3") from None
    name, _, lookup = name.partition("+")
    name, _, reward = name.partition("@")
    base, _, tree = name.partition(":")
    if base not in METHODS and base not in HF_METHODS and base != FLOAT32_AR:
        raise ValueError(f"unknown method {base!r}; choose from {', '.join([*METHODS, *HF_METHODS, FLOAT32_AR])}")
    if reward and (reward not in REWARDS or not base.endswith("-ucb")):
        raise ValueError(f"'@{reward}' in {name!r}: a bandit method takes @{' or @'.join(REWARDS)}")
    if trim and (base not in METHODS or not METHODS[base].has_model):
        raise ValueError(f"'~{trim}' in {base!r}: only a mamba-* or tf-* method drafts a tree to trim")
    length = 0
    if lookup:
        digits = lookup.removeprefix("lookup")
        if not lookup.startswith("lookup") or (digits and not digits.isdigit()) or \
                base not in METHODS or not METHODS[base].has_model:
            raise ValueError(f"'+{lookup}' in {base!r}: a mamba-* or tf-* method takes +lookup or +lookupN")
        length = int(digits) if digits else LOOKUP_BRANCH
    return MethodSpec(base, tree or None, reward or None, length, min_branch_q, min_expand_q)


class PeakRSS:
    """Samples this process's resident memory in a thread while a block runs."""

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s, self.peak = interval_s, 0
        self._stop = threading.Event()

    def __enter__(self) -> PeakRSS:
        self.peak = psutil.Process().memory_info().rss
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        process = psutil.Process()
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, process.memory_info().rss)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, psutil.Process().memory_info().rss)


@dataclass
class Run:
    prompt_id: str
    kind: str
    tokens: list[int]
    seconds: float
    peak_rss: int
    rounds: int = 0
    accepted: int = 0
    tested: int = 0
    draft_ms: list[float] = field(default_factory=list)
    verify_ms: list[float] = field(default_factory=list)
    arms: list[str] = field(default_factory=list)  # a bandit method's chosen arm, round by round
    drafter_bytes: int = 0  # the drafter's largest state (Mamba) or KV cache (Transformer) during the run
    target_kv_bytes: int = 0  # the target's largest KV cache during the run
    prefill_ms: float | None = None  # the target's pass over the prompt (None: a peer's, not measured apart)
    start_ms: float | None = None  # the drafter's start on the prompt
    round_ms: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    mapping_ms: list[float] = field(default_factory=list)  # a drafter of another tokenizer: re-encoding per round
    depths: list[tuple[int, int]] = field(default_factory=list)  # per round: (depth drafted, drafted tokens accepted)


def run_engine(models: Models, prompt: str, config: GenerationConfig, bandit=None) -> Run:
    with PeakRSS() as rss:
        t0 = time.perf_counter()
        events = list(generate(models, prompt, config, bandit=bandit, details=False))
        seconds = time.perf_counter() - t0
    rounds: list[RoundRecord] = events[:-1]
    summary: Summary = events[-1]
    return Run("", "", summary.token_ids, seconds, rss.peak, summary.rounds, summary.accepted_tokens,
               summary.tested_positions,
               [r.draft_ms for r in rounds], [r.verify_ms for r in rounds],
               [r.bandit.arms[r.bandit.chosen].name for r in rounds if r.bandit is not None],
               max((r.drafter_state_bytes for r in rounds), default=0),
               max((r.target_kv_bytes for r in rounds), default=0),
               summary.prefill_ms, summary.drafter_start_ms, [r.round_ms for r in rounds],
               summary.extra["prompt_tokens"], [r.mapping_ms for r in rounds if r.mapping_ms is not None],
               [(len(r.shape), r.accepted_len) for r in rounds])


@torch.inference_mode()
def run_hf(models: Models, prompt: str, method: str, config: GenerationConfig, lookup_tokens: int) -> Run:
    target = models.target
    ids = torch.tensor([encode_prompt(target.tokenizer, prompt)], device=target.device)
    kwargs = {"max_new_tokens": config.max_new_tokens, "do_sample": not config.greedy,
              "attention_mask": torch.ones_like(ids), "pad_token_id": target.tokenizer.eos_token_id}
    if not config.greedy:
        kwargs.update(temperature=config.temperature, top_p=config.top_p, top_k=0)
        torch.manual_seed(config.seed)
    if method == "hf-assisted":
        kwargs["assistant_model"] = models.drafter("transformer").model
    elif method == "hf-lookup":
        kwargs["prompt_lookup_num_tokens"] = lookup_tokens
    with PeakRSS() as rss:
        t0 = time.perf_counter()
        out = target.model.generate(ids, **kwargs)
        seconds = time.perf_counter() - t0
    return Run("", "", out[0, ids.shape[1]:].tolist(), seconds, rss.peak, prompt_tokens=ids.shape[1])


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (a length counts when one is a prefix); None if equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def agreement(runs: list[Run], reference: list[Run]) -> dict:
    """Prompts whose tokens equal the reference run's, and the first differing position of the others."""
    tokens = {r.prompt_id: r.tokens for r in reference}
    diffs = {r.prompt_id: first_difference(r.tokens, tokens[r.prompt_id]) for r in runs}
    return {"identical": sum(d is None for d in diffs.values()), "prompts": len(diffs),
            "first_difference": {k: d for k, d in diffs.items() if d is not None}}


def _aggregate(runs: list[Run], ar_runs: list[Run] | None, greedy: bool, engine: bool) -> dict:
    per_prompt: dict[str, list[float]] = {}
    for r in runs:
        per_prompt.setdefault(r.prompt_id, []).append(len(r.tokens) / r.seconds)
    tps = statistics.median(statistics.mean(v) for v in per_prompt.values())
    decoding: dict[str, list[float]] = {}  # the rounds alone: no prefill, no drafter start
    for r in runs:
        if r.round_ms:
            decoding.setdefault(r.prompt_id, []).append(len(r.tokens) / (sum(r.round_ms) / 1e3))
    rounds = sum(r.rounds for r in runs)
    tested = sum(r.tested for r in runs)
    draft = [x for r in runs for x in r.draft_ms]
    verify = [x for r in runs for x in r.verify_ms]
    # The rest of a round: acceptance, both models' commits (the drafter's catch-up) and the emitted tokens' text.
    commit = [t - d - v for r in runs for t, d, v in zip(r.round_ms, r.draft_ms, r.verify_ms)]
    prefill = [r.prefill_ms for r in runs if r.prefill_ms is not None]
    start = [r.start_ms for r in runs if r.start_ms is not None]
    mapping = [x for r in runs for x in r.mapping_ms]
    identical = None
    if greedy and ar_runs is not None:
        reference = {r.prompt_id: r.tokens for r in ar_runs}
        identical = all(r.tokens == reference[r.prompt_id] for r in runs)
    return {
        "tokens_per_s": tps,
        "decode_tokens_per_s": statistics.median(statistics.mean(v) for v in decoding.values()) if decoding else None,
        "mean_accepted_len": sum(len(r.tokens) for r in runs) / rounds if engine and rounds else None,
        "acceptance_rate": sum(r.accepted for r in runs) / tested if engine and tested else None,
        "draft_ms_per_round": statistics.mean(draft) if draft else None,
        "verify_ms_per_round": statistics.mean(verify) if verify else None,
        "commit_ms_per_round": statistics.mean(commit) if commit else None,
        "prefill_ms": statistics.mean(prefill) if prefill else None,
        "drafter_start_ms": statistics.mean(start) if start else None,
        "mapping_ms_per_round": statistics.mean(mapping) if mapping else None,
        "mapping_share_of_rounds": sum(mapping) / sum(x for r in runs for x in r.round_ms) if mapping else None,
        "rounds": rounds if engine else None,
        "prompt_tokens": statistics.mean(r.prompt_tokens for r in runs),
        "peak_rss_mb": max(r.peak_rss for r in runs) / 2**20,
        "identical_to_ar": identical,
        "new_tokens": sum(len(r.tokens) for r in runs),
        "per_prompt_tokens_per_s": {k: statistics.mean(v) for k, v in per_prompt.items()},
        "bandit_rounds": dict(Counter(arm for r in runs for arm in r.arms)) or None,
        "drafter_mb": max(r.drafter_bytes for r in runs) / 2**20 if engine else None,
        "target_kv_mb": max(r.target_kv_bytes for r in runs) / 2**20 if engine else None,
        "depth_reached": depth_reached(d for r in runs for d in r.depths) or None,
    }


@dataclass(frozen=True)
class Settings:
    """One benchmark's decoding settings, the same for every method (see `benchmark`)."""

    max_new_tokens: int
    temperature: float = 0.0
    repeats: int = 1
    seed: int = 0
    lookup_tokens: int = 10
    bandit_scope: str = "session"
    arms: str | None = None
    reward: str = "pooled"
    lambda_ucb: float | None = None
    min_branch_q: float | None = None
    min_expand_q: float | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def exploration(self) -> dict:
        return {"lambda_ucb": self.lambda_ucb} if self.lambda_ucb is not None else {}

    def trim(self, spec: MethodSpec) -> tuple[float, float] | None:
        return _trim(spec, self.min_branch_q, self.min_expand_q)

    def config(self, spec: MethodSpec, n_new: int, seed: int) -> GenerationConfig:
        """The engine's configuration of one run of `spec`."""
        trim = self.trim(spec)
        base = spec.base if spec.base in METHODS else "ar"
        ucb = METHODS[base].policy == "ucb"  # a bandit method's `:` part names its arms
        return GenerationConfig(method=base, tree=None if ucb else spec.tree, temperature=self.temperature,
                                max_new_tokens=n_new, seed=seed, arms=spec.tree if ucb and spec.tree else self.arms,
                                reward=spec.reward or self.reward, lookup_branch=spec.lookup_branch,
                                **({} if trim is None else dict(zip(TRIM_FIELDS, trim))),
                                **self.exploration).validate()


class Runner:
    """Runs one method on one prompt: the engine, transformers' peers, or `ar` on a float32 target; keeps one
    bandit per `*-ucb` method under the "session" scope."""

    def __init__(self, models: Models, settings: Settings) -> None:
        self.models, self.settings = models, settings
        self.bandits: dict[str, UCBBandit] = {}
        self.others: dict[str, Models] = {}  # a float32 target for `ar-float32`

    def once(self, name: str, spec: MethodSpec, prompt: str, n_new: int, seed: int) -> Run:
        config = self.settings.config(spec, n_new, seed)
        if spec.base in HF_METHODS:
            return run_hf(self.models, prompt, spec.base, config, self.settings.lookup_tokens)
        if spec.base == FLOAT32_AR:
            if "float32" not in self.others:
                self.others["float32"] = Models(target=self.models.specs["target"], device=str(self.models.device),
                                                dtype="float32")
            return run_engine(self.others["float32"], prompt, config)
        bandit = None
        if self.settings.bandit_scope == "session" and config.spec.policy == "ucb":
            if name not in self.bandits:
                self.bandits[name] = UCBBandit.for_config(config)
            bandit = self.bandits[name]
        return run_engine(self.models, prompt, config, bandit)

    def warm_up(self, methods: list[tuple[str, MethodSpec]], prompt: str, log=print) -> None:
        """Load every model and run every code path once; the warm-up teaches no bandit."""
        log(f"warm-up: {len(methods)} methods")
        for name, spec in methods:
            self.once(name, spec, prompt, 8, self.settings.seed)
        self.bandits.clear()

    def interleaved(self, methods: list[tuple[str, MethodSpec]], prompts: list[dict], log=print) -> dict[str, list[Run]]:
        """Every method on every prompt, `repeats` times, all methods on one prompt before the next."""
        runs: dict[str, list[Run]] = {name: [] for name, _ in methods}
        for rep in range(self.settings.repeats):
            for i, item in enumerate(prompts):
                for name, spec in methods:
                    run = self.once(name, spec, item["prompt"], self.settings.max_new_tokens, self.settings.seed + rep)
                    run.prompt_id, run.kind = item["id"], item.get("kind", "")
                    runs[name].append(run)
                log(f"repeat {rep + 1}/{self.settings.repeats} prompt {i + 1}/{len(prompts)} {item['id']}: " +
                    ", ".join(f"{m} {len(r[-1].tokens) / r[-1].seconds:.1f}" for m, r in runs.items()) + " tok/s")
        return runs


def benchmark(models: Models, prompts: list[dict], methods: list[str], max_new_tokens: int, temperature: float = 0.0,
              repeats: int = 1, seed: int = 0, lookup_tokens: int = 10, bandit_scope: str = "session",
              arms: str | None = None, reward: str = "pooled", lambda_ucb: float | None = None,
              min_branch_q: float | None = None, min_expand_q: float | None = None, log=print) -> dict:
    """Run every method on every prompt, interleaved prompt by prompt, after a warm-up.

    `bandit_scope` "session" keeps one bandit per `*-ucb` method across all prompts, as the app keeps one per
    browser session; "prompt" starts a fresh bandit on every prompt.

    `arms`, `reward` and `lambda_ucb` configure the `*-ucb` methods (a method's `@reward` suffix overrides
    `reward`), `min_branch_q` and `min_expand_q` every drafting method's trimming (a method's `~` suffix
    overrides them); None keeps the engine's defaults.
    """
    if bandit_scope not in BANDIT_SCOPES:
        raise ValueError(f"bandit_scope must be one of {', '.join(BANDIT_SCOPES)}, not {bandit_scope!r}")
    settings = Settings(max_new_tokens, temperature, repeats, seed, lookup_tokens, bandit_scope, arms, reward,
                        lambda_ucb, min_branch_q, min_expand_q)
    named = [(name, parse_method(name)) for name in methods]
    if "ar" not in [spec.base for _, spec in named]:
        named = [("ar", parse_method("ar")), *named]
    runner = Runner(models, settings)
    runner.warm_up(named, prompts[0]["prompt"], log)
    runs = runner.interleaved(named, prompts, log)
    return {"config": run_config(models, settings, len(prompts)), "methods": summarise(runs, named, prompts, settings)}


def method_result(runs: dict[str, list[Run]], name: str, spec: MethodSpec, settings: Settings,
                  kind: str | None = None) -> dict:
    """One method's figures (over the prompts of one `kind`, when given) against `ar`'s in the same run."""
    pick = (lambda rs: rs) if kind is None else (lambda rs: [r for r in rs if r.kind == kind])  # noqa: E731
    reference = pick(runs["ar"]) if spec.base != FLOAT32_AR else None
    return _aggregate(pick(runs[name]), reference, settings.greedy, spec.base not in HF_METHODS)


def summarise(runs: dict[str, list[Run]], methods: list[tuple[str, MethodSpec]], prompts: list[dict],
              settings: Settings) -> dict:
    """Each method's figures, overall and per kind of prompt (each context length), relative to `ar`'s."""
    kinds = list(dict.fromkeys(item.get("kind", "") for item in prompts))
    results = {}
    for name, spec in methods:
        ucb = spec.base.endswith("-ucb")
        results[name] = {**method_result(runs, name, spec, settings),
                         "reward": (spec.reward or settings.reward) if ucb else None,
                         "lambda_ucb": GenerationConfig(reward=spec.reward or settings.reward,
                                                        **settings.exploration).lambda_ucb if ucb else None,
                         "lookup_branch": spec.lookup_branch,
                         **dict(zip(TRIM_FIELDS, settings.trim(spec) or (None, None))),
                         "by_kind": {kind: method_result(runs, name, spec, settings, kind) for kind in kinds}}
    for name, res in results.items():
        _relative(res, results["ar"])
        for kind, part in res["by_kind"].items():
            _relative(part, results["ar"]["by_kind"][kind])
        if settings.greedy and "hf-ar" in runs:
            res["vs_hf_ar"] = agreement(runs[name], runs["hf-ar"])
    return results


def run_config(models: Models, settings: Settings, prompts: int) -> dict:
    """What a result was measured on and with: the machine, the models, the settings."""
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine_description(),
        "target": models.specs["target"], "mamba_drafter": models.specs["mamba"],
        "tf_drafter": models.specs["transformer"], "xdrafter": models.specs.get("xmamba"),
        "device": str(models.device),
        "dtype": str(models.dtype).removeprefix("torch."), "verifier": verifier_layout(models),
        "drafter_dtype": str(models.drafter_dtype).removeprefix("torch."), "max_new_tokens": settings.max_new_tokens,
        "temperature": settings.temperature, "repeats": settings.repeats, "prompts": prompts,
        "lookup_tokens": settings.lookup_tokens, "bandit_scope": settings.bandit_scope,
        "arms": settings.arms or default_arms(settings.temperature), "reward": settings.reward,
        "lambda_ucb": settings.lambda_ucb,  # None: each method's reward's default (its row's lambda_ucb)
        "min_branch_q": settings.min_branch_q if settings.min_branch_q is not None else GenerationConfig.min_branch_q,
        "min_expand_q": settings.min_expand_q if settings.min_expand_q is not None else GenerationConfig.min_expand_q,
        "torch_threads": torch.get_num_threads()}


TRIM_FIELDS = ("min_branch_q", "min_expand_q")


def _trim(spec: MethodSpec, leaf: float | None, expand: float | None) -> tuple[float, float] | None:
    """(min_branch_q, min_expand_q) a method's trees were trimmed at: its `~` suffix's, else the run's settings
    (`leaf`, `expand`), else the engine's defaults; None for a method that drafts no tree."""
    if spec.base not in METHODS or not METHODS[spec.base].has_model:
        return None
    if spec.min_branch_q is not None:
        return spec.min_branch_q, spec.min_expand_q
    return (GenerationConfig.min_branch_q if leaf is None else leaf,
            GenerationConfig.min_expand_q if expand is None else expand)


def _relative(res: dict, ar: dict) -> None:
    """A method's throughput and verification cost against `ar`'s on the same prompts."""
    res["speedup_vs_ar"] = res["tokens_per_s"] / ar["tokens_per_s"]
    decode, ar_decode = res.get("decode_tokens_per_s"), ar.get("decode_tokens_per_s")
    res["decode_speedup_vs_ar"] = decode / ar_decode if decode and ar_decode else None
    verify, step = res["verify_ms_per_round"], ar["verify_ms_per_round"]
    res["verify_over_ar_step"] = verify / step if verify is not None and step else None


def verifier_layout(models: Models) -> str:
    from specdec.verify import backend_for

    return "row-invariant" if backend_for(models.target.model).row_invariant else "block"


VECTOR_KINDS = (("amx_tile", "AMX"), ("avx512_bf16", "AVX-512 with BF16"), ("avx512f", "AVX-512"),
                ("avx2", "AVX2 only"))  # the widest kernels torch's CPU paths can use, widest first


def machine_description() -> str:
    """E.g. "AMD EPYC (AVX2 only), 2 cores, 24 GiB": the CPU, the widest vector kind its flags offer, cores, memory
    (and the GPU)."""
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu == (platform.processor() or platform.machine()):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    kind = next((f" ({name})" for flag, name in VECTOR_KINDS if flag in flags), "")
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{cpu}{kind}, {psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB{gpu}"


def _fmt(value, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return format(value, spec)


def markdown_table(result: dict) -> str:
    hf = any("vs_hf_ar" in r for r in result["methods"].values())
    rows = ["| method | tok/s | speed-up vs ar | mean accepted len | acceptance | draft ms/round | "
            "verify ms/round | verify / ar step | peak RSS MB | drafter MiB | identical to ar |"
            + (" same as hf-ar |" if hf else ""),
            "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if hf else "")]
    for name, r in result["methods"].items():
        same = r.get("vs_hf_ar")
        rows.append(f"| {name} | {_fmt(r['tokens_per_s'], '.1f')} | {_fmt(r['speedup_vs_ar'], '.2f')}x | "
                    f"{_fmt(r['mean_accepted_len'], '.2f')} | {_fmt(r['acceptance_rate'], '.2f')} | "
                    f"{_fmt(r['draft_ms_per_round'], '.1f')} | {_fmt(r['verify_ms_per_round'], '.1f')} | "
                    f"{_fmt(r.get('verify_over_ar_step'), '.2f')} | {_fmt(r['peak_rss_mb'], '.0f')} | "
                    f"{_fmt(r.get('drafter_mb'), '.2f')} | {_fmt(r['identical_to_ar'], '')} |"
                    + (f" {same['identical']}/{same['prompts']} |" if same else " - |" if hf else ""))
    c = result["config"]
    rows.append(f"\n{c['date']}, {c['machine']}; target {c['target']} ({c['dtype']}, {c['device']}, "
                f"{c.get('verifier', 'block')} verifier), "
                f"drafters {c['mamba_drafter']} / {c['tf_drafter']}"
                + (f" / {c['xdrafter']}" if any(name.startswith("xmamba") for name in result["methods"]) else "")
                + f" ({c.get('drafter_dtype', c['dtype'])}); "
                f"{c['prompts']} prompts x {c['repeats']}, "
                f"{c['max_new_tokens']} new tokens, temperature {c['temperature']}.")
    rows += per_prompt_rows(result)
    rows += depth_rows(result)
    scope = "one bandit for the whole run" if c.get("bandit_scope") == "session" else "a fresh bandit per prompt"
    for name, r in result["methods"].items():
        if r.get("bandit_rounds"):
            counts = ", ".join(f"{arm} {n}" for arm, n in sorted(r["bandit_rounds"].items(), key=lambda kv: -kv[1]))
            rows.append(f"\n{name} ({scope}), rounds per arm: {counts}.")
        if r.get("mapping_ms_per_round") is not None:
            rows.append(f"\n{name}: mapping between the two tokenizers {r['mapping_ms_per_round']:.2f} ms a round, "
                        f"{r['mapping_share_of_rounds']:.1%} of the rounds' time.")
        if r.get("vs_hf_ar", {}).get("first_difference"):
            diffs = ", ".join(f"{k} at {d}" for k, d in r["vs_hf_ar"]["first_difference"].items())
            rows.append(f"\n{name} differs from hf-ar on: {diffs}.")
    return "\n".join(rows)


def depth_rows(result: dict) -> list[str]:
    """Acceptance by depth per method: of the rounds that drafted d deep, the share whose accepted path reached
    depth d (nothing when no method drafted)."""
    reached = {name: r["depth_reached"] for name, r in result["methods"].items() if r.get("depth_reached")}
    if not reached:
        return []
    deepest = max(len(v) for v in reached.values())
    rows = ["\nAcceptance by depth: of the rounds that drafted d deep, the share whose accepted path reached d:\n",
            "| method | " + " | ".join(f"d={d}" for d in range(1, deepest + 1)) + " |",
            "|---|" + "---|" * deepest]
    for name, shares in reached.items():
        cells = [f"{x:.2f}" for x in shares] + ["-"] * (deepest - len(shares))
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return rows


def per_prompt_rows(result: dict) -> list[str]:
    """Each method's tokens per second on each prompt over `ar`'s, their mean, the lowest and how many fall
    below 0.95 (a bandit that never loses keeps every prompt near 1 or above); nothing for a single prompt."""
    ar = result["methods"].get("ar", {}).get("per_prompt_tokens_per_s") or {}
    if len(ar) < 2 or not all(ar.values()):
        return []
    rows = ["\nPer prompt, tok/s over ar's:\n", "| method | " + " | ".join(ar) + " | mean | lowest | below 0.95 |",
            "|---|" + "---|" * (len(ar) + 3)]
    for name, r in result["methods"].items():
        mine = r.get("per_prompt_tokens_per_s") or {}
        if name == "ar" or set(mine) != set(ar):
            continue
        ratios = [mine[k] / ar[k] for k in ar]
        rows.append(f"| {name} | " + " | ".join(f"{x:.2f}" for x in ratios) + f" | {sum(ratios) / len(ratios):.2f} | "
                    f"{min(ratios):.2f} | {sum(x < 0.95 for x in ratios)} |")
    return rows


def write_csv(result: dict, path: str) -> None:
    keys = ["tokens_per_s", "speedup_vs_ar", "mean_accepted_len", "acceptance_rate", "draft_ms_per_round",
            "verify_ms_per_round", "peak_rss_mb", "identical_to_ar", "new_tokens"]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["method", *keys])
        for name, r in result["methods"].items():
            writer.writerow([name, *[r[k] for k in keys]])


# --- long contexts --------------------------------------------------------------------------------------------
LONG_LENGTHS = (2500,)  # passage tokens of `bench --long` without a list


def example_prompts() -> list[dict]:
    """The app's long-document examples, exactly as the page offers them; kind `long-<about tokens>`."""
    return [{"id": doc["id"], "kind": f"long-{doc['tokens']}", "prompt": doc["prompt"]} for doc in example_documents()]


def long_prompts(tokenizer, lengths=LONG_LENGTHS, topics=LONG_TOPICS) -> list[dict]:
    """Summaries of long passages of the Python docs (`specdec.passages`): one per topic and length, each passage
    cut at the first paragraph end past `length` tokens; kind `long-<length>`."""
    def at_least(length: int) -> Callable[[str], bool]:
        return lambda text: len(text) > 3 * length and len(tokenizer(text)["input_ids"]) >= length

    return [{"id": f"long-{length}-{topic}", "kind": f"long-{length}",
             "prompt": summary_prompt(long_passage(topic, at_least(length)))}
            for length in lengths for topic in topics]


def breakdown_table(result: dict) -> str:
    """Where the time goes, per method and kind of prompt (a context length for `--long`): the target's prefill,
    the drafter's start, and per round drafting, verification and the rest (acceptance and both commits); and the
    speed-up of the rounds alone, without the prefill every method pays alike."""
    rows = ["| method | prompts | prompt tokens | tok/s | speed-up vs ar | decoding alone vs ar | prefill ms | "
            "drafter start ms | rounds | draft ms/round | verify ms/round | commit ms/round | verify / ar step | "
            "acceptance | drafter MiB |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in result["methods"].items():
        for kind, k in r["by_kind"].items():
            rows.append(f"| {name} | {kind} | {_fmt(k['prompt_tokens'], '.0f')} | "
                        f"{_fmt(k['tokens_per_s'], '.1f')} | {_fmt(k['speedup_vs_ar'], '.2f')}x | "
                        f"{_fmt(k['decode_speedup_vs_ar'], '.2f')}{'x' if k['decode_speedup_vs_ar'] else ''} | "
                        f"{_fmt(k['prefill_ms'], '.0f')} | "
                        f"{_fmt(k['drafter_start_ms'], '.0f')} | {_fmt(k['rounds'], 'd')} | "
                        f"{_fmt(k['draft_ms_per_round'], '.1f')} | {_fmt(k['verify_ms_per_round'], '.1f')} | "
                        f"{_fmt(k['commit_ms_per_round'], '.1f')} | {_fmt(k.get('verify_over_ar_step'), '.2f')} | "
                        f"{_fmt(k['acceptance_rate'], '.2f')} | {_fmt(k.get('drafter_mb'), '.2f')} |")
    return "\n".join(rows)


# --- verification cost -----------------------------------------------------------------------------------------
@torch.inference_mode()
def verification_cost(models: Models, contexts: list[int], sizes: list[int], repeats: int | None = None,
                      log=print) -> dict:
    """What one target pass over n new tokens costs, in target decode steps (n = 1), after `contexts` tokens.

    The engine's own verifier (`make_verifier`: the row-invariant layout on a CPU, as the engine runs it); every size
    is timed round-robin after a warm-up, `repeats` times, the context one token longer each time. The row-invariant
    layout cuts each row's keys at `specdec.verify.split.head_end` of the row's position, and a pass whose rows straddle such a
    cut reads the shared prefix once per cut; so the cost depends on where in the block the pass starts, and the
    mean over consecutive positions (every place in the block: `repeats` defaults to `SPLIT_BLOCK`) is what
    decoding pays on average. The cost at the context length itself is kept beside it as
    `at_length`.
    """
    from specdec.engine import make_verifier
    from specdec.verify.split import SPLIT_BLOCK

    repeats = repeats or SPLIT_BLOCK
    target = models.target
    text_ids = [t for item in load_prompts(None) for t in encode_prompt(target.tokenizer, item["prompt"], chat=False)]
    rows = []
    for length in contexts:
        context = (text_ids * (length // len(text_ids) + 2))[: length + repeats + max(sizes)]
        lm = make_verifier(target.model)
        lm.prefill(context[: length - 1])
        times: dict[int, list[float]] = {n: [] for n in sizes}
        for round_ in range(repeats + 1):  # round 0 warms up
            start = lm.length
            for n in sizes:
                ms = _timed_ms(partial(_verify_block, lm, context[start: start + n]), models.device)
                if round_:
                    times[n].append(ms)
            if round_:
                lm.feed(context[start: start + 1])  # the next round starts one position later
        step = statistics.mean(times[1]) if 1 in times else None
        row = {"context": length, "ms": {n: statistics.mean(t) for n, t in times.items()},
               "at_length": {n: t[0] for n, t in times.items()}}
        row["steps"] = {n: ms / step for n, ms in row["ms"].items()} if step else None
        log(f"context {length}: " + ", ".join(f"{n}: {ms:.1f} ms" for n, ms in row["ms"].items()))
        rows.append(row)
    return {"dtype": str(models.dtype).removeprefix("torch."), "verifier": verifier_layout(models), "rows": rows,
            "repeats": repeats}


def _verify_block(lm, tokens: list[int]) -> None:
    lm.extend(tokens, list(range(-1, len(tokens) - 1)))  # a chain after the cached context, then drop it again
    lm.commit([])


def cost_table(cost: dict) -> str:
    sizes = list(cost["rows"][0]["ms"])
    rows = ["| context tokens | step ms | " + " | ".join(f"{n} tokens" for n in sizes) + " |",
            "|---|---|" + "---|" * len(sizes)]
    for r in cost["rows"]:
        steps = r["steps"] or {}
        rows.append(f"| {r['context']} | {r['ms'].get(1, float('nan')):.1f} | "
                    + " | ".join(f"{steps.get(n, float('nan')):.2f}" for n in sizes) + " |")
    rows.append(f"\nA pass over n tokens, in target steps, the mean over {cost.get('repeats', 1)} consecutive "
                f"positions from the context length on; {cost['dtype']} target, {cost['verifier']} verifier.")
    return "\n".join(rows)


# --- context-length study ----------------------------------------------------------------------------------
@torch.inference_mode()
def context_study(models: Models, lengths: list[int], steps: int = 200, log=print) -> dict:
    """Per context length: drafter step latency (batch 1) and drafter memory, for the Mamba and Transformer drafters.

    Mamba's memory is its state (conv window + SSM state per layer), the same at any length; the Transformer's is
    its KV cache, which grows with the context, and so does the attention part of each step. Every length's
    caches are built first and the steps are then timed round-robin (each round times one step of each drafter at
    each length), so a machine that drifts during the study slows every length alike; latency is the median.
    """
    from specdec.drafters import MambaDrafter
    from specdec.verify import TreeLM
    from specdec.vocab import load_draft_vocab

    target = models.target
    text_ids = [t for item in load_prompts(None) for t in encode_prompt(target.tokenizer, item["prompt"], chat=False)]
    mamba = models.drafter("mamba")
    mamba_drafter = MambaDrafter.from_folder(mamba.model, target.vocab_size, mamba.source)
    tf = models.drafter("transformer")
    tf_vocab = load_draft_vocab(tf.source)
    cases = []
    for length in lengths:
        context = (text_ids * (length // len(text_ids) + 1))[:length]
        state, _ = mamba_drafter.prefill(context)
        token = torch.tensor([context[-1]], device=models.device)
        tf_lm = TreeLM(tf.model, tf_vocab)
        tf_lm.feed(context[:-1])
        cases.append((length, state, tf_lm, partial(mamba_drafter.step, token, state),
                      partial(_tf_step, tf_lm, context[-1])))
    times: dict[tuple[int, str], list[float]] = {}
    for round_ in range(steps + 1):  # round 0 warms up
        for length, _, _, mamba_step, tf_step in cases:
            for kind, fn in (("mamba", mamba_step), ("tf", tf_step)):
                ms = _timed_ms(fn, models.device)
                if round_:
                    times.setdefault((length, kind), []).append(ms)
    rows = []
    for length, state, tf_lm, _, _ in cases:
        row = {"context": length, "mamba_step_ms": statistics.median(times[length, "mamba"]),
               "mamba_state_bytes": state.nbytes, "tf_step_ms": statistics.median(times[length, "tf"]),
               "tf_kv_bytes": tf_lm.kv_bytes}
        log(f"context {length}: mamba {row['mamba_step_ms']:.2f} ms / {row['mamba_state_bytes'] / 2**20:.2f} MiB, "
            f"transformer {row['tf_step_ms']:.2f} ms / {row['tf_kv_bytes'] / 2**20:.2f} MiB")
        rows.append(row)
    return {"mamba_drafter": mamba.name, "tf_drafter": models.specs["transformer"], "rows": rows, "steps": steps}


def _tf_step(lm, token: int) -> None:
    lm.extend([token], [-1])  # one decode step over the cached context, then drop it again
    lm.commit([])


def _timed_ms(fn, device: torch.device) -> float:
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) * 1e3


def context_table(study: dict) -> str:
    rows = ["| context tokens | Mamba step ms | Mamba state MiB | Transformer step ms | Transformer KV MiB |",
            "|---|---|---|---|---|"]
    for r in study["rows"]:
        rows.append(f"| {r['context']} | {r['mamba_step_ms']:.2f} | {r['mamba_state_bytes'] / 2**20:.3f} | "
                    f"{r['tf_step_ms']:.2f} | {r['tf_kv_bytes'] / 2**20:.2f} |")
    return "\n".join(rows)


def save_context_plot(study: dict, path: str) -> None:
    """Latency and memory against context length, as a standalone plotly HTML page."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = study["rows"]
    x = [r["context"] for r in rows]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("drafter step latency (batch 1)", "drafter memory"))
    fig.add_trace(go.Scatter(x=x, y=[r["mamba_step_ms"] for r in rows], name="Mamba step ms"), 1, 1)
    fig.add_trace(go.Scatter(x=x, y=[r["tf_step_ms"] for r in rows], name="Transformer step ms"), 1, 1)
    fig.add_trace(go.Scatter(x=x, y=[r["mamba_state_bytes"] / 2**20 for r in rows], name="Mamba state MiB"), 1, 2)
    fig.add_trace(go.Scatter(x=x, y=[r["tf_kv_bytes"] / 2**20 for r in rows], name="Transformer KV MiB"), 1, 2)
    fig.update_xaxes(title_text="context tokens", type="log")
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="MiB", row=1, col=2)
    fig.write_html(path, include_plotlyjs=True)  # self-contained: opens offline
