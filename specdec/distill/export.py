"""Stage (e): a trained run, of any recipe, as the drafter folder the engine loads, with a model card.

A plug-in drafter's folder is a Hugging Face folder: `config.json` + `model.safetensors` (bfloat16, the tied
embedding as int8 rows with a scale each, which `specdec.models.read_folder_model` loads); a feature drafter's
holds its own weights only. Both hold
`draft_vocab.json` = {"token_ids": V_d}: the ids the draft head scores; the engine sets q = 0 elsewhere, which
keeps speculative sampling exact. Neither holds a tokenizer: a drafter uses its target's (the engine then checks
that the two score the same number of tokens), which keeps a copy of the target's tokenizer out of every drafter
folder.
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from specdec.distill.corpus import DOMAINS
from specdec.distill.recipe import Recipe
from specdec.distill.teacher import folder_part, sampled_temperature
from specdec.distill.train import load_run, read_segments, recipe_for
from specdec.vocab import load_draft_vocab


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _loss(point: dict) -> str:
    return "-" if point["loss"] is None else f"{point['loss']:.3f}"  # None: a warm start's first point


def _curve_table(recipe: Recipe, run: Path, segments: list[dict]) -> str:
    headers = ["step", "window tokens seen", "wall min", "train loss", "labelled tokens seen (with repeats)",
               "unique training tokens", *recipe.acceptance_headers]
    rows = ["| " + " | ".join(headers) + " |", "|" + "---:|" * len(headers)]
    for line in (run / "curve.jsonl").read_text().splitlines():
        point = json.loads(line)
        pool = [s["unique_labelled"] for s in segments if s["from_step"] < point["step"]][-1:]
        cells = [str(point["step"]), f"{point['tokens']:,}", f"{point['wall_s'] / 60:.1f}", _loss(point),
                 f"{point['labelled']:,}", f"{pool[0]:,}" if pool else "-",
                 *recipe.acceptance_cells(point["acceptance"])]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _segments(run: Path, config: dict, teacher_summary: dict) -> list[dict]:
    """The run's segments (`segments.jsonl`); a run from before they were logged is one segment on today's data."""
    segments = read_segments(run)
    if segments:
        return segments
    unique = sum(v["labelled_tokens"] for k, v in teacher_summary.items() if k != "responses/eval")
    return [{**config, "from_step": 0, "from_tokens": 0, "unique_labelled": unique,
             "response_shards": teacher_summary["responses/train"]["shards"],
             "text_shards": teacher_summary.get("text", {}).get("shards", 0)}]


def segment_data(seg: dict) -> str:
    """What one training segment saw and ran on."""
    parts = seg.get("part_shards", {})
    answers = seg.get("response_shards", 0) + sum(parts.values())
    share = f" at {seg['response_share']:.0%} of each batch" if answers and "response_share" in seg else ""
    more = "".join(f" + {n} of corpus part {part}" for part, n in parts.items())
    return (f"{seg['unique_labelled']:,} unique labelled tokens ({seg['text_shards']} text shards, "
            f"{seg['response_shards']}{more} answer shards{share}), {seg.get('threads') or 'all'} thread(s)")


def sampled_data(seg: dict) -> list[dict]:
    """A segment's sampled answers, one {temperature, passes, shards} a temperature (a segment logged before
    2026-12-07 names one temperature)."""
    if "sampled" in seg:
        return seg["sampled"]
    if seg.get("sampled_shards"):
        return [{"temperature": seg["sampling_temperature"], "passes": seg["sampled_passes"],
                 "shards": seg["sampled_shards"]}]
    return []


def shards_read(seg: dict, folder: str) -> int | None:
    """How many of a teacher folder's shards (`responses/train`, `text`, ...) one segment trained on, as its data
    record says; None for a held-out folder, or a sampled folder whose temperature had several passes."""
    name = folder.removeprefix("responses/")
    if folder == "text":
        return seg.get("text_shards", 0)
    if name == "train":
        return seg.get("response_shards", 0)
    if (part := folder_part(name)) is not None:
        return seg.get("part_shards", {}).get(str(part), 0)
    if name.startswith("train-t"):  # train-t<T>-<pass>
        same = [s for s in sampled_data(seg) if s["temperature"] == sampled_temperature(name)]
        if not same or int(name.rsplit("-", 1)[1]) >= same[0]["passes"]:
            return 0  # a temperature, or a pass of it, the segment did not read
        return same[0]["shards"] if same[0]["passes"] == 1 else None  # several passes: shards not told apart
    return None


def _shards_read(segments: list[dict], folder: str, shards: int) -> str:
    """Where the run trained on fewer of a folder's shards than the folder holds at export (the teacher went on
    meanwhile, or the recipe does not read the folder), how many it read."""
    counts = [n for seg in segments if (n := shards_read(seg, folder)) is not None]
    read = max(counts, default=None)
    if read is None or read >= shards:
        return ""
    return "; this run read none of them" if read == 0 else f"; this run read the first {read}"


def _reproduce(recipe: Recipe, name: str, config: dict, segments: list[dict]) -> str:
    """The commands that rebuild the run: per segment, the teacher data it saw, then its training budget."""
    parts = 1 + max((int(part) for seg in segments for part in seg.get("part_shards", {})), default=0)
    lines = ["python -m specdec.distill corpus" + (f" --parts {parts}" if parts > 1 else "")]
    if config.get("tokenizer"):
        lines.append(f"python -m specdec.distill tokenizer --tokenizer {config['tokenizer']}")
    features = recipe.reads_features  # its teacher data carries the target's features too
    for index, seg in enumerate(segments):
        data = f"python -m specdec.distill teacher --response-shards {seg['response_shards']} " \
               f"--text-shards {seg['text_shards']}"
        sampled = [f" --sampled-passes {s['passes']} --sampling-temperature {s['temperature']:g} "
                   f"--sampled-shards {s['shards']}" for s in sampled_data(seg)] or [""]
        lines += [data + flags + (" --text-features" if features else "") for flags in sampled]
        lines += [f"python -m specdec.distill teacher --part {part} --response-shards {n}"
                  for part, n in seg.get("part_shards", {}).items()]
        if features:
            lines.append("python -m specdec.distill features")
        lines.append(f"python -m specdec.distill train --arch {config['arch']} --name {name} "
                     f"--minutes {seg['minutes']}" + (f" --max-tokens {seg['max_tokens']}" if seg['max_tokens'] else "")
                     + f" --hidden {config['hidden']} --layers {recipe.layers(config)} "
                     f"--draft-vocab {config['draft_vocab']} --response-share {seg['response_share']} "
                     f"--lr {seg['lr']} --seq-len {seg['seq_len']} --train-batch {seg['batch_size']} "
                     f"--eval-every {seg['eval_every']}"
                     + (f" --threads {seg['threads']}" if seg['threads'] else "")
                     + (f" --init {config['init']}" if config.get("init") and index == 0 else "")
                     + (f" --grow-layers {config['grow_layers']}" if config.get("grow_layers") and index == 0 else "")
                     + (f" --grow-state {config['grow_state']}" if config.get("grow_state") and index == 0 else "")
                     + (f" --state-size {config['state_size']}" if config.get("state_size", 16) != 16
                        and not config.get("init") else "")
                     + (f" --tokenizer {config['tokenizer']}" if config.get("tokenizer") else ""))
    return "\n".join(lines)


def _trend(run: Path, unique: int, key: str) -> str:
    """One sentence on the learning curve's last quarter, read from `curve.jsonl`."""
    points = [json.loads(line) for line in (run / "curve.jsonl").read_text().splitlines()]
    if len(points) < 4:
        return ""
    b = points[-1]
    # The last checkpoint at or before three quarters of the tokens seen: the curve's last quarter or a bit more
    # (a final checkpoint a few steps after the one before would otherwise make a "quarter" of a few steps).
    a = next((p for p in reversed(points[:-1]) if p["labelled"] <= 0.75 * b["labelled"]), points[0])
    gain = b["acceptance"][key] - a["acceptance"][key]
    seen = (b["labelled"] - a["labelled"]) / unique
    where = "still rising" if gain > 0.005 else "flat"
    return (f"Since step {a['step']:,} ({seen:.1f} passes over the {unique:,} unique training tokens, the last "
            f"quarter of the curve or more) held-out acceptance moved {gain:+.3f} ({where}) while the training "
            f"loss went {_loss(a)} -> {_loss(b)}.")


def _measured_table(recipe: Recipe, report: dict) -> str:
    rows = ["| measure | value |", "|---|---|", *recipe.teacher_forced_rows(report["teacher_forced"]),
            f"| draft-vocabulary coverage of the target's greedy tokens (upper bound) | {report['coverage']:.3f} |"]
    engine = report.get("engine")
    if engine:
        rows.append(f"| engine `{engine['method']}` tree {engine['tree']}, greedy: acceptance rate | "
                    f"{engine['acceptance_rate']:.3f} ({', '.join(f'{d} {v:.3f}' for d, v in engine['by_domain'].items())}) |")
        rows.append(f"| engine: mean accepted length (tokens per round, incl. the target's) | "
                    f"{engine['mean_accepted_len']:.2f} |")
        rows.append(f"| engine: tokens/s SD vs target alone (fp32, this CPU) | {engine['sd_tokens_per_s']:.1f} vs "
                    f"{engine['ar_tokens_per_s']:.1f} (x{engine['speedup']:.2f}); greedy outputs identical: "
                    f"{engine['identical']} |")
    lat = report["latency_ms"]
    rows.append(f"| step latency, batch 1: drafter fp32 / bf16 vs target fp32 | {lat['drafter_fp32']:.2f} / "
                f"{lat['drafter_bf16']:.2f} ms vs {lat['target_fp32']:.2f} ms "
                f"(ratio {lat['drafter_fp32'] / lat['target_fp32']:.3f}) |")
    return "\n".join(rows)


def model_card(name: str, run: Path, report: dict, counters: dict, teacher_summary: dict, size: int,
               params: int, recipe: Recipe | None = None) -> str:
    """A short card: what the drafter is, its data, budget, measured acceptance and learning curve, and the
    commands that rebuild it; the recipe (the run's `arch`) writes what is its own."""
    config = counters["config"]
    recipe = recipe or recipe_for(config["arch"])
    segments = _segments(run, config, teacher_summary)
    data = "\n".join(f"- `{k}`: {v['labelled_tokens']:,} labelled tokens in {v['shards']} shards"
                     + (f" ({v['answer_tokens']:,} in the target's answers, the rest in prompts)"
                        if k.startswith("responses") else "") + _shards_read(segments, k, v["shards"])
                     for k, v in teacher_summary.items())
    unique = segments[-1]["unique_labelled"]
    budgets = "; then ".join(f"{s['minutes']} min / " + (f"{s['max_tokens']:,}" if s["max_tokens"] else "no")
                             + f" token cap on {segment_data(s)}"
                             + (f" (from step {s['from_step']:,})" if s["from_step"] else "") for s in segments)
    acceptance = report["teacher_forced"][recipe.headline]
    status = ("meets" if acceptance >= 0.7 else "is below") + " the project's figure of 0.70 greedy acceptance"
    engine = report.get("engine") or {}
    return f"""# {name}

{recipe.describe(config, len(load_draft_vocab(str(run))), params, size)}

## Data (teacher: the target itself, bf16, top-{config.get('topk', 8)} log-probabilities)
{data}

Prompts are written templates in four domains (code, math, chat, summary) with snippets and passages from the
Python standard library, and where the corpus was made with `--long-prompts` a fifth (long: questions about
passages of 750-2,800 tokens of long documents); `responses/train` holds the target's greedy answers to them,
`responses/train-partK` (if any) those to the prompts appended as corpus part K, `responses/train-t<T>-<i>` (if
any) answers sampled at temperature T, labelled with the untempered top-k; {recipe.describe_text()}
Held-out prompts (16 per domain) and their sources never appear in training.

## Training
{recipe.describe_loss()} AdamW, lr {config['lr']}, batch
{config['batch_size']} x {config['seq_len']} tokens (target answers at each segment's share, the rest labelled text),
on a 2-core machine shared with other jobs.
Budget{' (the run was continued on more data)' if len(segments) > 1 else ''}: {budgets}.
Spent: {counters['step']:,} steps, {counters['tokens']:,} window tokens ({counters['labelled']:,} labelled),
{counters['wall_s'] / 60:.1f} min of training wall time: {counters['labelled'] / unique:.1f} passes' worth of the
{unique:,} unique labelled training tokens it ends with.

## Status
Held-out greedy acceptance {acceptance:.3f} {status}. {_trend(run, unique, recipe.headline)}

## Measured (held-out prompts)
{_measured_table(recipe, report)}

## Learning curve (held-out greedy acceptance vs teacher tokens seen)
{_curve_table(recipe, run, segments)}

## Reproduce
One group of teacher and training commands per training segment (a resumed run continues with more data):
```
{_reproduce(recipe, name, config, segments)}
python -m specdec.distill evaluate --name {name} --engine-prompts {engine.get('prompts', 0) // len(DOMAINS)} --max-new-tokens-eval {engine.get('max_new_tokens', 0)}
python -m specdec.distill export --name {name}
```
"""


def earlier_card(init: str | None) -> str:
    """The model card of the folder a warm-started run began from (`train --init`), as the last section of the
    new run's card: its text after the title, every heading one level down (to level 6 at most), so the card of a
    drafter trained in several rounds lists them newest first. Empty where that folder has no card."""
    card = Path(init) / "README.md" if init else None
    if card is None or not card.is_file():
        return ""
    lines, fenced = card.read_text(encoding="utf-8").splitlines()[1:], False
    for i, line in enumerate(lines):
        fenced ^= line.startswith("```")
        if not fenced and line.startswith("#") and not line.startswith("######"):
            lines[i] = "#" + line
    return f"\n## Before this run: the card of `{init}`\n" + "\n".join(lines).rstrip() + "\n"


def export(run: Path, folder: Path, tokenizer: PreTrainedTokenizerBase, teacher: Path) -> Path:
    """Write the run's drafter and its card into `folder` (e.g. assets/drafters/<name>), without a tokenizer;
    a warm-started run's card ends with the card of the folder it began from (`earlier_card`).

    `tokenizer` is the target's, which the run must fit (`Recipe.check_target`).
    """
    model, draft_ids, counters = load_run(run)
    earlier = earlier_card(counters["config"].get("init"))  # before saving: `folder` may be the one it began from
    recipe = recipe_for(counters["config"]["arch"], tokenizer=counters["config"].get("tokenizer"),
                        target_tokenizer=tokenizer)
    recipe.check_target(model, tokenizer, run)
    params = sum(p.numel() for p in model.parameters())
    recipe.save(model, draft_ids, folder)
    report = json.loads((run / "eval.json").read_text())
    summary = json.loads((teacher / "teacher_summary.json").read_text())
    card = model_card(folder.name, run, report, counters, summary, folder_bytes(folder), params, recipe)
    (folder / "README.md").write_text(card + earlier)
    return folder
