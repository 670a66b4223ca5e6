"""End to end in a real browser: Playwright drives headless Debian Chromium against `python app.py`.

Types a prompt, sees tokens stream in, sees a draft tree with coloured nodes and the plots, steps through a
round, and saves a screenshot to artifacts/e2e-app.png. Needs /usr/bin/chromium (scripts/ensure_chromium.sh).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from playwright.sync_api import expect

from demo.colours import swatch_for_source
from tests.app_process import running_app

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "artifacts" / "e2e-app.png"


def css_rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    with running_app(tmp_path_factory.mktemp("app") / "app.log") as url:
        yield url


@pytest.fixture(scope="module")
def page(browser, app_url):
    tab = browser.new_page(viewport={"width": 1400, "height": 1000})
    tab.set_default_timeout(20_000)
    tab.goto(app_url)
    yield tab
    tab.close()


def open_settings(page) -> None:
    """The settings are folded away when the page opens."""
    if not page.locator("#max-new-tokens input[type=number]").is_visible():
        page.locator("#settings").get_by_text("Settings").first.click()
    expect(page.locator("#max-new-tokens input[type=number]")).to_be_visible()


def test_generate_streams_tokens_tree_and_plots(page):
    """Long (the page is served with the real models, which load first): the one test of the whole page in a
    browser, streaming and all."""
    expect(page.locator("#stop-btn")).to_be_disabled()  # nothing runs yet
    page.wait_for_selector("#models-state .sd-models[data-ready=true]", timeout=180_000)
    page.locator("#prompt textarea").fill("Give me three tips for staying focused while studying.")
    open_settings(page)
    page.locator("#max-new-tokens input[type=number]").fill("26")
    page.locator("#max-new-tokens input[type=number]").press("Enter")
    page.get_by_text("Advanced", exact=True).click()  # the paper's reward: the rounds do not depend on timings
    page.locator("#bandit-reward label").filter(has_text="paper").click()
    assert page.locator("#bandit-reward input[value=paper]").is_checked()
    expect(page.locator("#lambda-ucb input[type=number]")).to_have_value("0.3")  # the paper's reward's default
    trim = page.locator("#min-branch-q input[type=number]")
    assert float(trim.input_value()) == 0.05  # the engine's default
    trim.fill("0")  # whole shapes
    trim.press("Enter")
    expand = page.locator("#min-expand-q input[type=number]")
    assert float(expand.input_value()) == 0.3  # the engine's default
    expand.fill("0")
    expand.press("Enter")
    page.locator("#generate-btn").click()

    # tokens stream in: some appear while the run is still going
    page.wait_for_selector("#conversation .sd-tok", timeout=180_000)
    streaming = page.locator("#conversation .sd-cursor").count()
    page.wait_for_selector("#conversation .sd-status:has-text('Done')", timeout=240_000)
    tokens = page.locator("#conversation .sd-tok")
    assert tokens.count() >= 2 and streaming == 1
    for i in (0, tokens.count() - 1):  # coloured by the stream's style block, by origin
        token = tokens.nth(i)
        fill = swatch_for_source(token.get_attribute("data-source")).fill
        assert token.evaluate("e => getComputedStyle(e).backgroundColor") == css_rgb(fill)
        assert token.evaluate("e => getComputedStyle(e).borderTopWidth") == "0px"  # underlined, not boxed

    # the run's round records download as JSON: what the page shows is checked against them below
    with page.expect_download() as download:
        page.locator("#export-btn").click()
    data = json.loads(Path(download.value.path()).read_text(encoding="utf-8"))
    assert data["settings"]["min_branch_q"] == data["settings"]["min_expand_q"] == 0
    assert data["settings"]["lambda_ucb"] == 0.3
    assert data["summary"]["new_tokens"] == tokens.count() == len(data["rounds"][-1]["emitted"]) + sum(
        len(r["emitted"]) for r in data["rounds"][:-1])
    last = data["rounds"][-1]

    # the draft tree of the last round: every node, the target's token when the round ended with one
    nodes = page.locator("#tree .sd-node")
    fills = {nodes.nth(i).locator("rect").get_attribute("fill") for i in range(nodes.count())}
    assert len(fills) >= 2
    ends_with_target = last["emitted"][-1]["source"] != "draft"  # not cut inside the drafts by max tokens / EOS
    assert page.locator("#tree .sd-node[data-status=target]").count() == int(ends_with_target)
    assert f"Round {len(data['rounds'])} " in page.locator("#tree .sd-tree-head").inner_text()
    drafted = page.locator("#tree .sd-node:not([data-status=root]):not([data-status=target]) title")
    assert drafted.count() == len(last["nodes"]) - 1
    # greedy decoding and the paper's reward make this run deterministic; its last round drafts (a tree to hover)
    assert drafted.count() >= 1, "the last round drafted nothing: pick a prompt whose last round drafts"
    tip = drafted.first.text_content()  # hover text of a drafted node
    assert "p (target) = " in tip and ("q (drafter) = " in tip or "copied from the context" in tip)

    # the live graphs, drawn as SVG
    for plot in ("#speed-plot", "#memory-plot"):
        page.wait_for_selector(f"{plot} svg.sd-chart-svg .sd-series", timeout=30_000)
    page.wait_for_selector("#bandit-plot .sd-arm[data-chosen=true]", timeout=30_000)
    assert page.locator("#speed-plot .sd-series rect").count() >= len(data["rounds"])  # a bar a round at least

    SCREENSHOT.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)


def test_step_mode_explains_one_round(page):
    page.locator("#step-btn").click()
    caption = page.locator("#caption .sd-caption")
    caption.wait_for(timeout=180_000)
    page.wait_for_function("(document.querySelector('#caption .sd-caption')?.innerText || '').startsWith('Round 1:')")
    assert "the drafter proposed" in caption.inner_text() or "nothing was drafted" in caption.inner_text()
    page.locator("#step-btn").click()
    page.wait_for_function("(document.querySelector('#caption .sd-caption')?.innerText || '').startsWith('Round 2:')",
                           timeout=60_000)


def test_stop_cancels_and_the_page_stays_usable(page):
    page.locator("#max-new-tokens input[type=number]").fill("256")
    page.locator("#max-new-tokens input[type=number]").press("Enter")
    page.locator("#generate-btn").click()
    page.wait_for_selector("#conversation .sd-cursor", timeout=180_000)
    page.wait_for_selector("#conversation .sd-tok", timeout=180_000)
    page.locator("#stop-btn").click()
    page.wait_for_selector("#conversation .sd-status:has-text('you pressed Stop')", timeout=60_000)
    assert page.locator("#conversation .sd-tok").count() < 256
    assert page.locator("#generate-btn").is_enabled()


def engine_rate(summary: dict) -> float:
    """Tokens over the engine's own seconds (`Summary.engine_seconds`), from a summary as the export holds it."""
    return summary["new_tokens"] / ((summary["prefill_ms"] + summary["drafter_start_ms"]) / 1e3 + summary["seconds"])


def test_compare_verdict_is_the_ratio_of_the_two_runs_engine_seconds(page):
    """The arithmetic and the wiring, not a speed: the verdict above the answer is what the two runs' records give."""
    page.locator("#prompt textarea").fill("Name three colours of the rainbow.")
    page.locator("#max-new-tokens input[type=number]").fill("24")
    page.locator("#max-new-tokens input[type=number]").press("Enter")
    page.locator("#compare-btn").click()
    expect(page.locator("#stop-btn")).to_be_enabled(timeout=30_000)  # enabled while the run goes
    page.wait_for_selector("#verdict .sd-verdict:has-text('Speed-up:')", timeout=240_000)
    expect(page.locator("#stop-btn")).to_be_disabled(timeout=30_000)
    with page.expect_download() as download:
        page.locator("#export-btn").click()
    data = json.loads(Path(download.value.path()).read_text(encoding="utf-8"))
    run, base = engine_rate(data["summary"]), engine_rate(data["baseline"])
    verdict = page.locator("#verdict").inner_text()
    assert f"Speed-up: {run / base:.2f}× ({run:.1f} vs {base:.1f} tokens/s)" in verdict
    assert f"{data['summary']['rounds']} instead of {data['baseline']['rounds']} target passes" in verdict
    assert data["baseline"]["method"] == "ar" and data["baseline"]["token_ids"] == data["summary"]["token_ids"]
    alone = page.locator("#comparison .sd-compare-col").first
    assert f"{base:.1f} tokens/s" in alone.inner_text()
    # the target alone's tokens are its own, not "bonus" tokens of a draft
    assert "written by the target alone" in alone.locator(".sd-tok").first.get_attribute("title")
