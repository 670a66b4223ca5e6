"""The run's figures: the bandit's bars (`demo/bandit_html.py`), per-round speed and memory (`demo/plots.py`)."""

from __future__ import annotations

import dataclasses
import html
import json
import re

import pytest

from demo.colours import SWATCHES
from demo.live import WAYS
from demo.long_context import load_result, recorded_header, result_table
from demo.bandit_html import CHOSEN, OTHER, bandit_html
from demo.charts import ACCEPTED, MIB, memory_chart, running_rate, speed_chart
from demo.plots import context_figures
from demo.views import bandit_view
from specdec.records import ArmStat, BanditSnapshot, EmittedToken, RoundRecord, TreeNode


def rounds(n: int = 3, cuda: bool = False) -> list[RoundRecord]:
    out = []
    for i in range(n):
        emitted = [EmittedToken(1, "a", "draft")] * i + [EmittedToken(2, "b", "bonus")]
        out.append(RoundRecord(
            i, [2, 1], "(2,1)", [TreeNode(0, 0, "x", -1, 0, 1.0, 1.0, "root")], emitted, i,
            draft_ms=5.0 + i, verify_ms=20.0, round_ms=25.0 + i, new_tokens_total=sum(range(i + 2)),
            elapsed_s=0.1 * (i + 1), rss_bytes=(100 + i) * MIB, cuda_allocated_bytes=(50 * MIB if cuda else None),
            cuda_peak_bytes=None, drafter_state_bytes=MIB // 2, target_kv_bytes=(i + 1) * MIB))
    return out


def snapshot() -> BanditSnapshot:
    arms = [ArmStat("(3)", 4, -0.61, 1.1), ArmStat("(2,2,1)", 6, -0.42, 0.9), ArmStat("chain 5", 0, None, None)]
    return BanditSnapshot(arms, chosen=1, reward_kind="paper", last_reward=-0.4)


def series(chart: str) -> dict[str, list[tuple[float, float]]]:
    """The chart's series by name: a bar series' (x, height) per bar, a line's (x, y) points, in SVG units."""
    out = {}
    for name, body in re.findall(r'class="sd-series" data-name="([^"]+)"([^<]*(?:<rect[^>]*/>)*)', chart):
        if "points=" in body:
            pts = re.search(r'points="([^"]*)"', body).group(1).split()
            out[html.unescape(name)] = [tuple(float(v) for v in p.split(",")) for p in pts]
        else:
            out[html.unescape(name)] = [(float(x), float(h)) for x, h in
                                        re.findall(r'<rect x="([\d.]+)" y="[\d.]+" width="[\d.]+" height="([\d.]+)"',
                                                   body)]
    return out


def test_bandit_bars_per_arm_with_the_chosen_arm_highlighted():
    panel = bandit_html(snapshot(), round_index=6)
    arms = re.findall(r'class="sd-arm" data-chosen="(\w+)"[^>]*>([^<]+)<', panel)
    assert arms == [("false", "(3)"), ("true", "(2,2,1)"), ("false", "chain 5")]
    numbers = re.findall(r"<span>([^<]+)</span>", panel)  # by arm: pulls, mean reward, UCB value
    assert numbers == ["4", "-0.61", "1.10", "6", "-0.42", "0.90", "0", "untried", "untried"]
    assert panel.count(CHOSEN) == 3 and panel.count(OTHER) == 6  # the chosen arm's three bars in orange
    assert "arm (2,2,1) chosen in round 7" in panel and "paper reward" in panel


def test_bandit_placeholder_without_a_bandit():
    assert WAYS["ucb"] in bandit_view(None)  # names the control that brings it


def test_running_rate_uses_round_time_only():
    assert running_rate(rounds()) == pytest.approx([1 / 0.025, 3 / 0.051, 6 / 0.078])


def test_speed_chart_has_times_tokens_and_rate_per_round():
    chart = speed_chart(rounds())
    by_name = series(chart)
    assert list(by_name) == ["draft ms", "verify ms", "accepted drafts", "target's token", "tokens/s", "depth reached"]
    draft, verify = [h for _, h in by_name["draft ms"]], [h for _, h in by_name["verify ms"]]
    assert draft[2] / draft[0] == pytest.approx(7.0 / 5.0, rel=0.02) and verify[0] == pytest.approx(verify[2])
    assert len(by_name["accepted drafts"]) == 2  # rounds 2 and 3 accepted a draft, round 1 none
    assert len(by_name["target's token"]) == 3 and len(by_name["tokens/s"]) == 3
    rate = [y for _, y in by_name["tokens/s"]]
    assert rate[0] > rate[1] > rate[2]  # SVG y grows downwards: the running rate rises, 40 -> 59 -> 77 tokens/s
    assert f'fill="{ACCEPTED}"' in chart


def test_memory_chart_compares_drafter_state_with_kv_cache():
    by_name = series(memory_chart(rounds()))
    assert set(by_name) == {"process RSS", "drafter state", "target KV cache"}  # no CUDA line on CPU
    assert len({y for _, y in by_name["drafter state"]}) == 1  # a fixed-size state
    kv = [y for _, y in by_name["target KV cache"]]
    assert kv[0] > kv[1] > kv[2]  # the target's cache grows
    assert "CUDA allocated" in series(memory_chart(rounds(cuda=True)))


def test_empty_runs_give_placeholders():
    assert "while generating" in speed_chart([]) and "while generating" in memory_chart([])


def long_result() -> dict:
    """A `bench --long` result's shape: per method, one part per prompt length."""
    def part(tokens, tps, drafter=None, kv=None, acceptance=None):
        return {"prompt_tokens": tokens, "tokens_per_s": tps, "speedup_vs_ar": tps / (12 - tokens / 1000),
                "drafter_mb": drafter, "target_kv_mb": kv, "acceptance_rate": acceptance}
    return {"config": {"date": "2026-12-03", "machine": "test", "target": "t", "dtype": "float32",
                       "max_new_tokens": 128},
            "methods": {"ar": {"by_kind": {"long-4500": part(4500, 7.5, 0, 90),
                                           "long-2500": part(2500, 9.5, 0, 50)}},
                        "mamba-ucb": {"by_kind": {"long-2500": part(2500, 11, 1.41, 50, 0.6),
                                                  "long-4500": part(4500, 9, 1.41, 90, 0.5)}},
                        "mamba-ucb+lookup": {"by_kind": {"long-2500": part(2500, 12, 1.41, 50, 0.7),
                                                         "long-4500": part(4500, 10, 1.41, 90, 0.6)}},
                        "tf-tree": {"by_kind": {"long-2500": part(2500, 7, 11.0, 50, 0.3),
                                                "long-4500": part(4500, 5, 19.0, 90, 0.3)}}}}


def test_context_figures_plot_each_method_against_prompt_length():
    speed, memory = context_figures(long_result())
    assert [t.name for t in speed.data] == ["ar", "mamba-ucb", "mamba-ucb+lookup", "tf-tree"]
    assert list(speed.data[0].x) == [2500, 4500] and list(speed.data[0].y) == [9.5, 7.5]  # sorted by length
    names = [t.name for t in memory.data]  # ar drafts nothing; two methods of one drafter share its line
    assert names == ["mamba-ucb, mamba-ucb+lookup: drafter", "tf-tree: drafter", "target KV cache"]
    assert list(memory.data[0].y) == [1.41, 1.41] and list(memory.data[1].y) == [11.0, 19.0]
    empty_speed, _ = context_figures(None)
    assert not empty_speed.data and "No long-context" in empty_speed.layout.annotations[0].text


def test_the_long_context_result_loads_only_when_it_is_one(tmp_path):
    path = tmp_path / "long.json"
    assert load_result(path) is None  # absent
    path.write_text("{not json")
    assert load_result(path) is None
    path.write_text(json.dumps({"methods": {"ar": {"tokens_per_s": 1}}}))  # an ordinary bench result
    assert load_result(path) is None
    path.write_text(json.dumps(long_result()))
    table = result_table(load_result(path))
    assert "| mamba-ucb | 2,500 | 11.0 | 1.16x | 0.60 | 1.41 |" in table
    assert "| ar | 4,500 | 7.5 | 1.00x | - | - |" in table
    assert table.endswith("new tokens, greedy.")  # one run a prompt: nothing more to say
    three = long_result()
    three["config"]["repeats"] = 3
    assert result_table(three).endswith("greedy; each prompt's tok/s the mean of 3 runs.")


def test_the_long_context_header_says_when_and_on_what_machine_it_was_recorded():
    result = long_result()
    assert recorded_header(result) == "Recorded 2026-12-03 on test, float32."
    result["config"]["device"] = "cpu"
    assert recorded_header(result) == "Recorded 2026-12-03 on test (cpu), float32."
    assert recorded_header({"methods": {}}) == ("Recorded on an unrecorded date on a machine not recorded, "
                                                "dtype not recorded.")


def test_speed_chart_shows_acceptance_by_depth():
    by_name = series(speed_chart(rounds()))  # rounds of shape (2,1): round 1 kept none, round 2 one, round 3 two
    heights = [h for _, h in by_name["depth reached"]]
    assert len(heights) == 2 and heights[0] > heights[1] > 0  # depth 1: 2 of 3 rounds, depth 2: 1 of 3
    assert heights[0] / heights[1] == pytest.approx(2.0, rel=0.02)
    alone = [dataclasses.replace(r, shape=[], accepted_len=0) for r in rounds()]  # the target alone drafts nothing
    assert "depth reached" not in series(speed_chart(alone))
