"""The "Long documents" tab: speed and memory against prompt length, from a `bench --long` result shipped as JSON
(`assets/bench/long-context.json`; docs/benchmarks.md has the command that makes it)."""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr

from demo.plots import context_figures

INTRO = (
    "A Mamba drafter's whole context is a fixed-size state, so drafting costs the same at 100 tokens or 8,000, and "
    "so does its memory; a Transformer drafter's KV cache grows with the prompt, and so does each of its steps. "
    "The figures come from one benchmark run on the page's three *Long document* examples (`python -m specdec bench "
    "--long examples`), on the machine named below. Speed includes reading the prompt, which every method does the "
    "same way."
)


def load_result(path: Path) -> dict | None:
    """The benchmark's JSON, or None when the file is absent or not a `bench --long` result."""
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    methods = result.get("methods") if isinstance(result, dict) else None
    if not methods or not all("by_kind" in row for row in methods.values()):
        return None
    return result


def result_table(result: dict) -> str:
    """Per method and prompt length: tok/s, speed-up over `ar`, acceptance and the drafter's memory (markdown)."""
    rows = ["| method | prompt tokens | tok/s | speed-up vs ar | acceptance | drafter MiB |",
            "|---|---|---|---|---|---|"]
    for name, row in result["methods"].items():
        for part in sorted(row["by_kind"].values(), key=lambda part: part["prompt_tokens"]):
            acceptance = part.get("acceptance_rate")
            drafter = part.get("drafter_mb")
            rows.append(f"| {name} | {part['prompt_tokens']:,.0f} | {part['tokens_per_s']:.1f} | "
                        f"{part['speedup_vs_ar']:.2f}x | {'-' if acceptance is None else f'{acceptance:.2f}'} | "
                        f"{'-' if not drafter else f'{drafter:.2f}'} |")
    c = result.get("config", {})
    repeats = c.get("repeats") or 1
    each = f"; each prompt's tok/s the mean of {repeats} runs" if repeats > 1 else ""
    rows.append(f"\n{c.get('date', '?')}, {c.get('machine', '?')}; target {c.get('target', '?')} "
                f"({c.get('dtype', '?')}), {c.get('max_new_tokens', '?')} new tokens, greedy{each}.")
    return "\n".join(rows)


def recorded_header(result: dict) -> str:
    """One line above the figures: when, on what machine and in what dtype the benchmark ran."""
    c = result.get("config", {})
    device = f" ({c['device']})" if c.get("device") else ""
    return (f"Recorded {c.get('date') or 'on an unrecorded date'} on {c.get('machine') or 'a machine not recorded'}"
            f"{device}, {c.get('dtype') or 'dtype not recorded'}.")


def long_context_tab(path: Path) -> None:
    """The tab's contents (inside a `gr.Tab`)."""
    result = load_result(path)
    gr.Markdown(INTRO)
    if result:
        gr.Markdown(recorded_header(result), elem_id="context-recorded")
    speed, memory = context_figures(result)
    with gr.Row():
        gr.Plot(speed, label="Speed", elem_id="context-speed-plot")
        gr.Plot(memory, label="Memory", elem_id="context-memory-plot")
    if result:
        gr.Markdown(result_table(result), elem_id="context-table")
