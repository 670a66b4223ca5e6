"""One check of the CUDA path: the CUDA tests, then a timing table; a markdown + JSON report in a folder.

Run as `scripts/gpu_check.sh OUTDIR [--cpu]` (or `python -m specdec.gpu_check OUTDIR [--cpu]`). It needs only the
project tree: the targets are randomly initialised Llamas of real shapes (`TARGETS`; no weights travel), the
drafters are the shipped ones in `assets/drafters`, and text is byte-level (`ByteTokenizer`), since a random
target needs no real tokenizer, only the drafters' vocabulary size. A random target accepts almost none of a
trained drafter's tokens, so the end-to-end rows measure the cost side of drafting; speed-ups need real weights.

Measured, for float32 and bfloat16, with and without the drafter's CUDA graphs (`Models.cuda_graphs`):
    drafter step      `MambaDrafter.step` on B rows (1, and the widths of tree depths)
    verification      one `TreeLM.extend` pass over n = 1..16 tree tokens after 512 cached ones (n=1: a target step),
                      and transformers' own one-token step on the same context (what the host costs a step)
    end to end        `generate` tok/s for `ar`, `mamba-chain`, `mamba-ucb` and `tf-tree`, greedy

`--cpu` is a dry run on a tiny target (CI runs it, tests/test_gpu_check.py). The exit status is 1 when a test or a
measurement failed, or the time budget ran out before every row was measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
DRAFTERS = ROOT / "assets" / "drafters"
PROMPTS = ROOT / "assets" / "prompts" / "summary.jsonl"
VOCAB = 49152  # the shipped drafters' (and SmolLM2's) vocabulary
BATCHES = (1, 2, 6)  # drafter step rows: one node, a depth of (2,1,1), the last depths of (3,2,1)
METHODS = ("ar", "mamba-chain", "mamba-ucb", "tf-tree")

# LlamaConfig fields of the random targets; vocabulary VOCAB, tied embeddings.
TARGETS = {
    "smollm2-135m": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                     "num_attention_heads": 9, "num_key_value_heads": 3},  # SmolLM2-135M's shape
    "llama-1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
                 "num_key_value_heads": 8},  # Llama-3.2-1B's shape (1.07B parameters at this vocabulary)
}
TINY_TARGETS = {"tiny-llama": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                               "num_attention_heads": 4, "num_key_value_heads": 2}}


@dataclass(frozen=True)
class Plan:
    """How much to measure: the real run on CUDA, or the dry run on a CPU."""

    device: torch.device
    targets: dict[str, dict]
    graphs: tuple[bool, ...]  # CUDA graphs off / on (on needs CUDA)
    max_new_tokens: int
    context: int  # tokens in the target's cache before a verification pass
    prompt_chars: int  # of the check's prompt (byte tokens)
    step_reps: int
    verify_reps: int
    budget_s: float
    tests_timeout_s: float

    @classmethod
    def for_mode(cls, cpu: bool, budget_s: float | None) -> Plan:
        if cpu:
            torch.set_num_threads(1)  # tiny models gain nothing from threads, which also stall on a busy machine
            return cls(torch.device("cpu"), TINY_TARGETS, graphs=(False,), max_new_tokens=12, context=64,
                       prompt_chars=256, step_reps=5, verify_reps=2,
                       budget_s=120.0 if budget_s is None else budget_s, tests_timeout_s=120.0)
        if not torch.cuda.is_available():
            raise SystemExit("gpu_check: no CUDA GPU is visible; pass --cpu for the dry run")
        return cls(torch.device("cuda"), TARGETS, graphs=(False, True), max_new_tokens=128, context=512,
                   prompt_chars=1000, step_reps=50, verify_reps=20,
                   budget_s=420.0 if budget_s is None else budget_s, tests_timeout_s=240.0)


class BudgetSpent(RuntimeError):
    """The run's time budget ran out before a measurement (it is reported, not measured)."""


@dataclass
class Budget:
    seconds: float
    started: float = field(default_factory=time.perf_counter)

    def check(self) -> None:
        if time.perf_counter() - self.started > self.seconds:
            raise BudgetSpent(f"not measured, the {self.seconds:.0f} s budget was spent")


@dataclass
class Report:
    mode: str
    environment: dict
    tests: dict = field(default_factory=dict)
    drafter_step: list[dict] = field(default_factory=list)
    verify: list[dict] = field(default_factory=list)
    end_to_end: list[dict] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures


class ByteTokenizer:
    """UTF-8 bytes as token ids (0-255): enough of the tokenizer interface for `generate` on a random target."""

    chat_template = None

    def __call__(self, text: str) -> dict:
        return {"input_ids": list(text.encode("utf-8"))}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) if i < 128 else f"<{i}>" for i in ids)


# --- models -------------------------------------------------------------------------------------------------------
def random_target(shape: dict, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """A randomly initialised Llama of `shape` (LlamaConfig fields), built on `device`; it never emits EOS."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, max_position_embeddings=8192, tie_word_embeddings=True,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="sdpa", **shape)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = None
    return model.to(dtype).eval()


def shipped_drafter(name: str, device: torch.device, dtype: torch.dtype):
    """A drafter from assets/drafters, loaded with plain transformers (no tokenizer travels with it)."""
    from specdec.models import read_folder_model

    folder = DRAFTERS / name
    kwargs = {} if name.startswith("mamba") else {"attn_implementation": "sdpa"}
    model = read_folder_model(folder, dtype, **kwargs)
    return model.to(device).eval(), str(folder)


def check_prompt(chars: int) -> str:
    return json.loads(PROMPTS.read_text().splitlines()[0])["prompt"][:chars]


# --- timing -------------------------------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], object], reps: int, device: torch.device, warmup: int = 3) -> float:
    """Median wall time of `fn` in ms, synchronised after every call (each call is one real round's step)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def time_drafter_step(model, folder: str, plan: Plan, dtype_name: str, on_row: Callable[[dict], None]) -> None:
    from specdec.drafters.mamba import MambaDrafter, MambaState
    from specdec.vocab import load_draft_vocab

    for graphs in plan.graphs:
        drafter = MambaDrafter(model, VOCAB, load_draft_vocab(folder), cuda_graphs=graphs)
        for batch in BATCHES:
            tokens = torch.arange(batch, device=plan.device) + 100  # [B]
            ms = median_ms(partial(drafter.step, tokens, MambaState.zeros(model, batch)), plan.step_reps, plan.device)
            on_row({"dtype": dtype_name, "cuda_graphs": graphs, "batch": batch, "ms": ms})


def verify_once(lm, tokens: list[int], parents: list[int]) -> None:
    lm.extend(tokens, parents)
    lm.commit([])  # drop the region: every pass sees the same context


def time_verification(model, plan: Plan, target: str, dtype_name: str, on_row: Callable[[dict], None]) -> None:
    """ms of one `extend` over n tree tokens (a binary tree: node i's parent is (i-1)//2), for n = 1..16, and of
    transformers' own decode step on the same context (what the host costs a step, whatever the engine does)."""
    from specdec.verify import TreeLM

    context = [(7 * i) % 256 for i in range(plan.context)]
    reference = transformers_step_ms(model, context, plan)  # before TreeLM swaps in its attention
    lm = TreeLM(model)
    lm.extend(context, list(range(-1, plan.context - 1)))
    lm.commit(list(range(plan.context)))
    tree = [-1] + [(i - 1) // 2 for i in range(1, 16)]  # node i's parent
    passes = {n: partial(verify_once, lm, [(11 * i) % 256 for i in range(n)], tree[:n]) for n in range(1, 17)}
    for _ in range(2):  # every size once before any is timed: kernels chosen, allocator warm
        for verify in passes.values():
            verify()
    ms = {str(n): median_ms(verify, plan.verify_reps, plan.device, warmup=1) for n, verify in passes.items()}
    on_row({"target": target, "dtype": dtype_name, "context": plan.context, "transformers_step_ms": reference,
            "ms": ms})


def transformers_step_ms(model, context: list[int], plan: Plan) -> float:
    """Median ms of the model's own one-token forward on a `DynamicCache` holding `context`."""
    import inspect

    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # 5.24 / 5.17
    token = torch.tensor([[5]], device=plan.device)

    forward = torch.inference_mode()(lambda ids: model(input_ids=ids, use_cache=True, **{name: cache}))

    def step() -> None:
        forward(token)
        cache.crop(-1)  # back to the context

    forward(torch.tensor([context], device=plan.device))
    return median_ms(step, plan.verify_reps, plan.device)


def run_generation(models, method: str, max_new_tokens: int, prompt: str) -> tuple[list, object]:
    from specdec.config import WHOLE_SHAPES, GenerationConfig
    from specdec.engine import generate

    # whole shapes: the check's drafters are random, and trimming by their confidence would leave nothing drafted
    config = GenerationConfig(method=method, max_new_tokens=max_new_tokens, **WHOLE_SHAPES)
    events = list(generate(models, prompt, config, chat=False))
    return events[:-1], events[-1]


def time_end_to_end(models, plan: Plan, target: str, dtype_name: str, on_row: Callable[[dict], None],
                    budget: Budget) -> None:
    ar_ids, prompt = None, check_prompt(plan.prompt_chars)
    for method in METHODS:
        for graphs in (plan.graphs if method.startswith("mamba") else (False,)):
            budget.check()
            models.cuda_graphs = None if graphs else False  # None: replayed on CUDA
            run_generation(models, method, 8, prompt)  # warm-up: kernels, allocator, graph capture
            rounds, summary = run_generation(models, method, plan.max_new_tokens, prompt)
            ar_ids = summary.token_ids if method == "ar" else ar_ids
            on_row({
                "target": target, "dtype": dtype_name, "method": method,
                "cuda_graphs": graphs if method.startswith("mamba") else None,
                "tokens_per_s": summary.tokens_per_s, "new_tokens": summary.new_tokens,
                "mean_accepted_len": summary.mean_accepted_len,
                "draft_ms_per_round": statistics.fmean(r.draft_ms for r in rounds),
                "verify_ms_per_round": statistics.fmean(r.verify_ms for r in rounds),
                "identical_to_ar": summary.token_ids == ar_ids,
            })


# --- the run ------------------------------------------------------------------------------------------------------
def environment(plan: Plan) -> dict:
    import transformers

    from specdec.drafters.mamba import kernels_available

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "device": str(plan.device), "device_name": platform.processor() or platform.machine(),
           "mamba_kernels": kernels_available(plan.device),
           "started_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if plan.device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(plan.device)
        env["cuda"] = torch.version.cuda
    return env


def run_tests(plan: Plan, outdir: Path) -> dict:
    """tests/test_cuda.py in a child pytest (skipped there without CUDA); its log goes to OUTDIR/cuda_tests.log."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_cuda.py"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False,
                              timeout=plan.tests_timeout_s)
        log, returncode = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as err:
        log, returncode = f"{err.stdout or ''}\ntimed out after {plan.tests_timeout_s:.0f} s", -1
    (outdir / "cuda_tests.log").write_text(log)
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", log)}
    lines = [line.strip("= ") for line in log.splitlines() if line.strip()]
    summary = next((line for line in reversed(lines) if re.search(r"\d+ (passed|skipped|failed)", line)),
                   lines[-1] if lines else "no output")
    return {"command": " ".join(command[1:]), "returncode": returncode, "summary": summary,
            "passed": counts.get("passed", 0), "failed": counts.get("failed", 0) + counts.get("error", 0) +
            counts.get("errors", 0), "skipped": counts.get("skipped", 0)}


def measure(report: Report, plan: Plan, budget: Budget) -> None:
    """Every target x dtype: drafter step (once per dtype), verification, end to end; a failure is one line."""
    from specdec.models import LoadedModel, Models

    tokenizer = ByteTokenizer()
    for dtype in (torch.float32, torch.bfloat16):
        dtype_name = str(dtype).removeprefix("torch.")
        mamba_model, mamba_folder = shipped_drafter("mamba-smollm2", plan.device, dtype)
        tf_model, tf_folder = shipped_drafter("tf-smollm2", plan.device, dtype)
        attempt(report, f"drafter step {dtype_name}", budget, time_drafter_step, mamba_model, mamba_folder, plan,
                dtype_name, report.drafter_step.append)
        for name, shape in plan.targets.items():
            label = f"{name} {dtype_name}"
            target = random_target(shape, plan.device, dtype)
            attempt(report, f"verification {label}", budget, time_verification, target, plan, name, dtype_name,
                    report.verify.append)
            models = Models.from_loaded(LoadedModel(name, target, tokenizer, "random"), {
                "mamba": LoadedModel("mamba-smollm2", mamba_model, None, mamba_folder),
                "transformer": LoadedModel("tf-smollm2", tf_model, None, tf_folder)})
            attempt(report, f"end to end {label}", budget, time_end_to_end, models, plan, name, dtype_name,
                    report.end_to_end.append, budget)
            del models, target
            free_memory(plan.device)
        del mamba_model, tf_model
        free_memory(plan.device)


def attempt(report: Report, what: str, budget: Budget, fn: Callable[..., None], *args: object) -> None:
    """`fn(*args)`, unless the budget is spent; a failure becomes one line of the report."""
    try:
        budget.check()
        fn(*args)
    except BudgetSpent as err:
        report.failures.append(f"{what}: {err}")
    except Exception as err:  # noqa: BLE001 - one line per failed measurement; the rest of the report still comes
        report.failures.append(f"{what}: {one_line(err)}")


def one_line(err: Exception) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def free_memory(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run(outdir: Path, cpu: bool, budget_s: float | None = None, tests: bool = True) -> Report:
    plan = Plan.for_mode(cpu, budget_s)
    budget = Budget(plan.budget_s)
    outdir.mkdir(parents=True, exist_ok=True)
    report = Report("cpu" if cpu else "cuda", environment(plan))
    if tests:
        report.tests = run_tests(plan, outdir)
        if report.tests["returncode"] != 0:
            report.failures.append(f"CUDA tests: {report.tests['summary']} (see cuda_tests.log)")
    try:
        measure(report, plan, budget)
    except Exception as err:  # noqa: BLE001 - a model that cannot be built or loaded: reported, not a traceback
        report.failures.append(f"measurements stopped: {one_line(err)}")
    report.seconds = time.perf_counter() - budget.started
    write_report(report, outdir)
    return report


# --- the report ---------------------------------------------------------------------------------------------------
def _flag(value: bool | None) -> str:
    return "-" if value is None else "on" if value else "off"


def markdown(report: Report) -> str:
    env = report.environment
    setting = (f"{env['started_utc']}, {env['device_name']} ({env['device']}); Python {env['python']}, torch "
               f"{env['torch']}, transformers {env['transformers']}; mamba-ssm kernels: "
               f"{'yes' if env['mamba_kernels'] else 'no'}; {report.seconds:.0f} s in all.")
    lines = [f"# GPU check ({report.mode})", "", setting, ""]
    if report.tests:
        lines += [f"CUDA tests (`{report.tests['command']}`): {report.tests['summary']}", ""]
    lines += ["## Mamba drafter step", "", "| dtype | CUDA graphs | batch | ms/step |", "|---|---|---|---|"]
    lines += [f"| {r['dtype']} | {_flag(r['cuda_graphs'])} | {r['batch']} | {r['ms']:.3f} |"
              for r in report.drafter_step]
    context = report.verify[0]["context"] if report.verify else "the context"
    lines += ["", f"## Verification: ms of one pass over n tree tokens after {context} (n=1 is a target step; "
              "transformers step: the model's own decode step)", "",
              "| target | dtype | transformers step | " + " | ".join(str(n) for n in range(1, 17)) + " |",
              ("|---|---|---|" + "---|" * 16)]
    lines += [f"| {r['target']} | {r['dtype']} | {r['transformers_step_ms']:.2f} | "
              + " | ".join(f"{r['ms'][str(n)]:.2f}" for n in range(1, 17)) + " |" for r in report.verify]
    lines += ["", "## End to end (greedy; a random target accepts almost no drafted token)", "",
              ("| target | dtype | method | CUDA graphs | tok/s | mean accepted len | draft ms/round | verify ms/round "
               "| identical to ar |"), "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['target']} | {r['dtype']} | {r['method']} | {_flag(r['cuda_graphs'])} | {r['tokens_per_s']:.1f} "
              f"| {r['mean_accepted_len']:.2f} | {r['draft_ms_per_round']:.2f} | {r['verify_ms_per_round']:.2f} | "
              f"{'yes' if r['identical_to_ar'] else 'no'} |" for r in report.end_to_end]
    lines += ["", "## Result", ""]
    lines += [f"- FAILED {f}" for f in report.failures] or ["- every test passed and every row was measured"]
    return "\n".join(lines) + "\n"


def write_report(report: Report, outdir: Path) -> None:
    (outdir / "gpu_check.md").write_text(markdown(report))
    data = {"ok": report.ok, "mode": report.mode, "seconds": report.seconds, "environment": report.environment,
            "tests": report.tests, "drafter_step": report.drafter_step, "verify": report.verify,
            "end_to_end": report.end_to_end, "failures": report.failures}
    (outdir / "gpu_check.json").write_text(json.dumps(data, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path, help="folder for gpu_check.md, gpu_check.json and cuda_tests.log")
    parser.add_argument("--cpu", action="store_true", help="dry run on a tiny target, no GPU needed")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop measuring after this many seconds (default 420 on CUDA, 120 with --cpu)")
    parser.add_argument("--no-tests", action="store_true", help="skip the CUDA tests")
    args = parser.parse_args(argv)
    report = run(args.outdir, args.cpu, args.budget_s, tests=not args.no_tests)
    print(markdown(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
