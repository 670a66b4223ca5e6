"""The engine's speed under the live page against the `complete` API, on the same prompts: a benchmark, one run.

Starts `python app.py` (the real default models), then for each prompt, with the page's default method and
settings:
- `complete`: the answer as JSON, no page (the reference);
- `rounds` through `gradio_client`: every round's record streamed as JSON;
- the page in Debian's Chromium at 1440x900, Generate pressed as a user would;
- the page's Compare in Chromium: its verdict against the ratio of `complete`'s two runs (the method, `ar`).
Then, the app closed, the page's Generate handler in this process (`tests.page.Page` over the real engine): every
frame built as the page builds it, nobody sending or drawing it, against `complete`'s call (`Live.answer`) on the
same engine thread. The page's events are not API endpoints, so this is how they run without a browser.
Each speed is the engine's own (`Summary.engine_tokens_per_s`: tokens over the prompt's pass, the drafter's start
and the rounds), read from the run's export. Prints a markdown table. Nothing else should run meanwhile.

    .venv/bin/python scripts/page_speed.py [--prompts FILE] [--max-new-tokens 96] [--screenshots DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gradio_client import Client  # noqa: E402

from specdec.bench import machine_description  # noqa: E402
from specdec.records import Summary  # noqa: E402
from tests.app_process import app_process  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
PROMPTS = [  # not among the page's examples
    "Give me three tips for staying focused while studying at home.",
    "Explain how a refrigerator keeps food cold, in a short paragraph.",
    "Write a Python function that counts the vowels in a string.",
]
SIZES = {"1440x900": (1440, 900), "1280x720": (1280, 720)}


def engine_rate(summary: dict) -> float:
    """Tokens over the engine's own seconds, from a summary as the export gives it."""
    return Summary(**summary).engine_tokens_per_s


def export_of(value) -> dict:
    path = value["path"] if isinstance(value, dict) else value
    return json.loads(Path(path).read_text(encoding="utf-8"))


def through_rounds(client: Client, prompt: str, tokens: int) -> float:
    """`rounds` with the page's defaults: each round's record streamed as JSON, nobody drawing it."""
    events = list(client.submit(prompt, {"max_new_tokens": tokens}, api_name="/rounds"))
    return engine_rate(events[-1]["summary"])


def in_process(prompts: list[str], tokens: int) -> list[tuple[float, float]]:
    """(`complete`'s engine tok/s, the page handler's) per prompt, both in this process on one engine thread."""
    import threading

    import app
    from tests.page import Page

    options = app.parse_args([])
    page = Page(app.real_engine(options.target, app.drafter_specs(options), options.device, options.dtype,
                                options.drafter_dtype))
    settings = app.settings_of({"max_new_tokens": tokens})
    page.live.answer(prompts[0], app.settings_of({"max_new_tokens": 8}), threading.Event())  # load and warm up
    rates = []
    for prompt in prompts:
        api = page.live.answer(prompt, settings, threading.Event())["engine_tokens_per_s"]
        final = page.last("run", prompt, None, max_new_tokens=tokens)
        rates.append((api, engine_rate(export_of(page.value(final, "export"))["summary"])))
    return rates


def in_browser(page, prompt: str, tokens: int, button: str) -> tuple[dict, str]:
    """Press `button` on the page for `prompt`; the run's export and the verdict the page shows."""
    page.locator("#prompt textarea").fill(prompt)
    if not page.locator("#max-new-tokens input[type=number]").is_visible():
        page.locator("#settings").get_by_text("Settings").first.click()
    box = page.locator("#max-new-tokens input[type=number]")
    box.fill(str(tokens))
    box.press("Tab")
    page.locator(button).click()
    # Polled twice a second from here, not by Playwright's waits (they poll every animation frame, and would
    # spend the machine's cores as a user's browser does not).
    wait_for(page, "document.querySelector('#export-btn').disabled")  # the run has begun
    wait_for(page, "!document.querySelector('#export-btn').disabled && "
                   "!(document.querySelector('#verdict').innerText || 'Step').startsWith('Step')")
    with page.expect_download() as download:
        page.locator("#export-btn").click()
    data = json.loads(Path(download.value.path()).read_text(encoding="utf-8"))
    return data, page.locator("#verdict").inner_text()


def wait_for(page, condition: str, seconds: float = 300.0) -> None:
    deadline = time.monotonic() + seconds
    while not page.evaluate(f"() => Boolean({condition})"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the page did not reach {condition!r} within {seconds:.0f} s")
        time.sleep(0.5)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=Path, help="a file of prompts, one a line (default: three built in)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--screenshots", type=Path, help="save the first screen at 1440x900 and 1280x720 here")
    args = p.parse_args()
    prompts = [line for line in args.prompts.read_text().splitlines() if line.strip()] if args.prompts else PROMPTS
    from playwright.sync_api import sync_playwright

    log = Path(tempfile.mkdtemp()) / "app.log"
    rows = []
    with app_process(log, 300) as (url, _), sync_playwright() as pw:
        client = Client(url, verbose=False)
        client.predict(prompts[0], max_new_tokens=8, api_name="/complete")  # the models load and warm up
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1440, "height": 900}, accept_downloads=True)
        page.set_default_timeout(60_000)
        page.goto(url)
        page.wait_for_selector("#generate-btn")
        for prompt in prompts:
            alone = client.predict(prompt, method="ar", max_new_tokens=args.max_new_tokens, api_name="/complete")
            api = client.predict(prompt, max_new_tokens=args.max_new_tokens, api_name="/complete")
            sent = through_rounds(client, prompt, args.max_new_tokens)
            shown, _ = in_browser(page, prompt, args.max_new_tokens, "#generate-btn")
            compared, verdict = in_browser(page, prompt, args.max_new_tokens, "#compare-btn")
            ratio = float(re.search(r"Speed-up: ([\d.]+)×", verdict).group(1))
            rows.append((prompt, api["engine_tokens_per_s"], sent, engine_rate(shown["summary"]),
                         api["engine_tokens_per_s"] / alone["engine_tokens_per_s"], ratio,
                         engine_rate(compared["summary"]) / engine_rate(compared["baseline"])))
        if args.screenshots:
            args.screenshots.mkdir(parents=True, exist_ok=True)
            for name, (width, height) in SIZES.items():
                page.set_viewport_size({"width": width, "height": height})
                page.evaluate("window.scrollTo(0, 0)")
                page.screenshot(path=str(args.screenshots / f"app-{name}.png"))
        browser.close()
    built = in_process(prompts, args.max_new_tokens)
    print(f"{machine_description()}; {args.max_new_tokens} new tokens, the page's default method and settings\n")
    print("| prompt | `complete` tok/s | `rounds` via client | ratio | page in Chromium | ratio | "
          "`complete` speed-up vs ar | Compare shows | Compare's runs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for prompt, api, sent, shown, api_ratio, verdict, runs in rows:
        print(f"| {prompt[:40]} | {api:.1f} | {sent:.1f} | {sent / api:.2f} | {shown:.1f} | {shown / api:.2f} | "
              f"{api_ratio:.2f}x | {verdict:.2f}x | {runs:.2f}x |")
    print("\n| prompt | `complete`'s call in-process tok/s | the page's Generate handler, frames built | ratio |")
    print("|---|---|---|---|")
    for prompt, (api, page) in zip(prompts, built, strict=True):
        print(f"| {prompt[:40]} | {api:.1f} | {page:.1f} | {page / api:.2f} |")


if __name__ == "__main__":
    main()
