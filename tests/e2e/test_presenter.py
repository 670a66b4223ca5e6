"""Presenter view and replay in a real browser (Playwright, headless Debian Chromium).

Presenter view at 1440x900 and 1920x1080: the answer's box and the tree's box both lie within the first screen,
tree labels are legible, the N key steps a round. Replay: `python app.py --replay-only` serves recorded runs
with no model (torch is never even loaded into the process), and rounds advance by Play, by button and by key.
Screenshots go to artifacts/presenter-*.png and artifacts/replay-*.png.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import app
from demo.replay import load_replay
from tests.app_process import app_process, served
from tests.test_app_client import fake_engine

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
SIZES = [(1440, 900), (1920, 1080)]
CODE_RUN = "Code: a Python function (greedy)"
SUMMARY_RUN = "Summary with the lookup branch (greedy)"


@pytest.fixture(scope="module")
def live_url():
    """The full app in-process, `demo.fake` standing in for the engine."""
    with served(app.build_app(fake_engine(delay=0.005)), **app.page_look()) as url:
        yield url


@pytest.fixture(scope="module")
def replay_app(tmp_path_factory):
    """`python app.py --replay-only` in its own process: (url, pid)."""
    log = tmp_path_factory.mktemp("replay") / "app.log"
    with app_process(log, seconds=90, args=("--replay-only",)) as (url, pid):
        yield url, pid


def open_page(browser, url: str, size: tuple[int, int]):
    page = browser.new_page(viewport={"width": size[0], "height": size[1]})
    page.set_default_timeout(30_000)
    page.goto(url)
    page.wait_for_selector("#conversation .sd-conversation")
    return page


def caption_starts(page, text: str, timeout: float = 30_000) -> None:
    page.wait_for_function(
        f"(document.querySelector('#caption .sd-caption')?.innerText || '').startsWith('{text}')", timeout=timeout)


def press_until(page, key: str, n: int, first_timeout: float = 5_000) -> None:
    """Press `key` until the caption reads round `n`: a press while the previous round's event is still pending
    is dropped by the page (one step at a time), so press again while the caption still shows round n-1."""
    for attempt in range(12):
        page.keyboard.press(key)
        try:
            caption_starts(page, f"Round {n}:", first_timeout if attempt == 0 else 5_000)
            return
        except Exception:
            text = page.locator("#caption").inner_text()
            assert n == 1 or text.startswith(f"Round {n - 1}:"), text
    caption_starts(page, f"Round {n}:")


def pick_run(page, title: str) -> None:
    page.locator("#replay-run input").click()
    page.get_by_role("option", name=title).click()
    page.wait_for_selector("#conversation .sd-status:has-text('Replay loaded')")


def within_first_screen(page, selector: str, size: tuple[int, int]) -> dict:
    box = page.locator(selector).bounding_box()
    assert box is not None, selector
    assert box["x"] >= 0 and box["y"] >= 0, (selector, box)
    assert box["x"] + box["width"] <= size[0] + 1 and box["y"] + box["height"] <= size[1] + 1, (selector, box)
    return box


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_presenter_view_shows_answer_and_tree_on_the_first_screen(browser, live_url, size):
    page = open_page(browser, f"{live_url}?presenter", size)
    page.wait_for_function("document.body.classList.contains('sd-presenter')")
    page.locator("#prompt textarea").fill("Explain speculative decoding to a class.")
    page.locator("body").click(position={"x": size[0] - 5, "y": size[1] - 5})  # leave the text field
    for n in (1, 2, 3):  # the N key presses "Step"
        press_until(page, "n", n, 60_000 if n == 1 else 5_000)  # the first step reads the settings (imports)
    assert not page.locator("#max-new-tokens").is_visible()  # the settings are collapsed
    stream = within_first_screen(page, "#conversation", size)
    tree = within_first_screen(page, "#tree", size)
    assert tree["x"] >= stream["x"] + stream["width"] - 1  # side by side
    assert page.locator("#tree .sd-node").count() >= 2 and page.locator("#conversation .sd-tok").count() >= 3
    label = page.locator("#tree .sd-node .sd-label").first.bounding_box()
    assert label["height"] >= 12  # node labels legible: at least 12 px high on screen
    page.locator("#large-type input").check()
    page.wait_for_function("document.body.classList.contains('sd-large')")
    page.wait_for_function("document.querySelector('#tree .sd-label')?.getAttribute('font-size') === '21'")
    within_first_screen(page, "#conversation", size)
    within_first_screen(page, "#tree", size)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"presenter-{size[0]}x{size[1]}.png"))
    page.close()


def test_replay_only_mode_says_so_and_loads_no_model(browser, replay_app):
    url, pid = replay_app
    page = open_page(browser, url, (1440, 900))
    assert "Replay-only mode" in page.locator(".sd-replay-only").inner_text()
    assert not page.locator("#generate-btn").is_visible()
    maps = Path(f"/proc/{pid}/maps")
    if maps.exists():  # Linux: the process never loaded torch, let alone a model
        assert "libtorch" not in maps.read_text()
    page.close()


def test_replay_advances_round_by_round_by_button_key_and_play(browser, replay_app):
    url, _ = replay_app
    page = open_page(browser, f"{url}?presenter", (1440, 900))
    pick_run(page, CODE_RUN)
    page.locator("#replay-step-btn").click()
    caption_starts(page, "Round 1:")
    first = page.locator("#conversation .sd-tok").count()
    page.locator("body").click(position={"x": 1435, "y": 895})
    press_until(page, "ArrowRight", 2)
    assert page.locator("#conversation .sd-tok").count() > first >= 1
    total = len(load_replay(ROOT / "assets" / "runs" / "code-greedy.json").rounds)
    assert f"Round 2 of {total}" in page.locator("#tree .sd-tree-head").inner_text()
    for plot in ("#speed-plot", "#memory-plot"):
        page.wait_for_selector(f"{plot} svg.sd-chart-svg .sd-series")
    page.wait_for_selector("#bandit-plot .sd-bandit")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "replay-step-1440x900.png"))

    pick_run(page, SUMMARY_RUN)
    page.locator("#replay-speed input[type=number]").fill("10")
    page.locator("#replay-speed input[type=number]").press("Enter")
    page.locator("#replay-play-btn").click()
    page.wait_for_selector("#conversation .sd-status:has-text('Done:')", timeout=60_000)
    summary = load_replay(ROOT / "assets" / "runs" / "summary-lookup.json").summary
    assert page.locator("#conversation .sd-tok").count() == summary.new_tokens
    page.get_by_role("tab", name="How it works").click()
    # the tab opens on the generic text (it has every step too); the round's own text replaces it when the tab's
    # select event has run
    page.wait_for_function("(document.querySelector('#explainer')?.innerText || '').includes('How it works: round')",
                           timeout=30_000)
    explained = page.locator("#explainer").inner_text()
    assert "How it works: round" in explained and "one forward pass" in explained and "bandit" in explained
    page.screenshot(path=str(ARTIFACTS / "replay-explainer-1440x900.png"))
    page.close()
