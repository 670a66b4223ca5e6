"""The presenter's pieces: the readable tree (sizes, depth labels, the text's path, notes), the explainer with the
round's numbers, the page's style and keys, and the replay-only page."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import app
from demo import presenter
from demo.explainer import explainer_html
from demo.tree_svg import headers, boxes, notes_html, path_text, tree_html, tree_svg
from specdec.records import ArmStat, BanditSnapshot, TreeNode
from tests.test_demo_render import chain_with_bonus, tree_with_correction


def test_labels_and_boxes_grow_with_the_font():
    small, large = tree_svg(tree_with_correction()), tree_svg(tree_with_correction(), font=21)
    assert set(re.findall(r'class="sd-label"[^>]*font-size="(\d+)"', large)) == {"21"}
    assert 'height="42"' in large and 'height="30"' in small
    width = lambda svg: float(re.search(r'viewBox="0 0 ([\d.]+)', svg).group(1))  # noqa: E731
    assert width(large) > width(small)


def test_columns_fit_their_labels_and_long_tokens_are_shortened_with_the_whole_text_on_hover():
    rec = tree_with_correction()
    rec.nodes[2].text = " internationalisation"
    svg = tree_svg(rec)
    assert ">␣internati…<" in svg and "“␣internationalisation”" in svg
    rects = dict(re.findall(r'data-index="(-?\d+)"><title>[^<]*</title><rect x="[\d.]+" y="[\d.]+" width="(\d+)"',
                            svg))
    assert rects["1"] == rects["2"]  # one width per column, the longest label's
    assert int(rects["1"]) >= 11 * 15 * 0.6


def test_depth_labels_name_each_column_and_a_deep_lookup_branch_is_not_called_target():
    rec = tree_with_correction()  # shape (2,1); a copied branch 4 deep hangs from the root
    parent = 0
    for depth in range(1, 5):
        rec.nodes.append(TreeNode(len(rec.nodes), 50 + depth, f" c{depth}", parent, depth, 1.0, 0.1,
                                  "rejected" if depth == 1 else "not_reached", copied=True))
        parent = len(rec.nodes) - 1
    assert headers(rec, boxes(rec)) == ["root", "depth 1 (×2)", "depth 2 (×1)", "depth 3", "depth 4"]
    assert headers(chain_with_bonus(), boxes(chain_with_bonus()))[-1] == "target"
    assert tree_svg(rec).count('class="sd-depth"') == 5


def test_a_band_runs_under_the_path_the_text_took():
    svg = tree_svg(tree_with_correction())
    points = re.search(r'class="sd-text-path" points="([^"]+)"', svg).group(1).split()
    assert len(points) == 3  # root, " cat", the target's correction
    assert svg.count("<path ") == 5  # the band is not an edge
    assert path_text(tree_with_correction()) == "␣cat → ␣ran (correction)"
    assert "The text took the shaded path" in tree_html(tree_with_correction())


def test_the_legend_explains_correction_and_bonus_in_one_line_each():
    notes = notes_html()
    lines = re.findall(r'<div class="sd-note" data-kind="(\w+)"><b>\w+</b>: ([^<]+)</div>', notes)
    assert [kind for kind, _ in lines] == ["correction", "bonus"]
    assert "rejected" in lines[0][1] and "accepted" in lines[1][1]
    assert notes in tree_html(chain_with_bonus())


def test_explainer_fills_in_the_rounds_own_numbers():
    rec = tree_with_correction()
    rec.bandit = BanditSnapshot([ArmStat("(3)", 2, -0.51, 1.2), ArmStat("(2,1)", 4, -0.42, 1.53)], 1, "paper", -0.4)
    text = re.sub(r"<[^>]+>", "", explainer_html(rec, [rec]))
    assert "How it works: round 1" in text
    assert "guessed 4 tokens as a tree of shape (2,1)" in text and "in 3.0 ms" in text
    assert "all 4 guesses in one forward pass (20.0 ms)" in text
    assert "kept 1 of them, “ cat”" in text and "added “ ran”, a correction" in text
    assert "wrote 2 tokens for one target pass" in text
    assert "shape (2,1), one of 2" in text and "4 times" in text and "-0.42" in text and "1.53" in text
    assert "This round scored -0.40" in text
    assert "12 tokens in 1 target pass, 12.00 tokens per pass" in text


def test_explainer_says_what_the_drafter_left_out():
    """A trimmed tree: fewer nodes than its shape holds, or none at all although a shape was chosen."""
    rec = tree_with_correction()
    rec.shape, rec.shape_name = [2, 2], "(2,2)"  # 6 nodes allowed, 4 drafted
    text = re.sub(r"<[^>]+>", "", explainer_html(rec, [rec]))
    assert "guessed 4 tokens as a tree of shape (2,2)" in text and "It left out 2 more the shape allows" in text
    whole = re.sub(r"<[^>]+>", "", explainer_html(tree_with_correction(), [tree_with_correction()]))
    assert "left out" not in whole
    rec.mapping_ms = 1.0  # another tokenizer's tree is re-encoded: its nodes are not counted against the shape
    assert "left out" not in re.sub(r"<[^>]+>", "", explainer_html(rec, [rec]))
    alone = chain_with_bonus()
    alone.nodes, alone.emitted, alone.accepted_len = alone.nodes[:1], alone.emitted[-1:], 0
    text = re.sub(r"<[^>]+>", "", explainer_html(alone, [alone]))
    assert "the shape (1,1,1) was chosen, but the drafter found none of its guesses likely enough" in text


def test_explainer_without_a_bandit_or_a_run():
    text = re.sub(r"<[^>]+>", "", explainer_html(chain_with_bonus(), [chain_with_bonus()]))
    assert "a bonus token" in text and "fixed shape" in text
    assert "Run a prompt (or replay a recorded run)" in explainer_html(None, [])


def test_the_next_round_key_and_url_switches_are_in_the_page_script():
    for key in presenter.NEXT_KEYS:
        assert f"'{key}'" in presenter.ON_LOAD
    assert "replay-step-btn" in presenter.ON_LOAD and "step-btn" in presenter.ON_LOAD
    assert "presenter-toggle" in presenter.ON_LOAD and "large-type" in presenter.ON_LOAD
    assert "body.sd-presenter #conversation" in presenter.CSS and "body.sd-large" in presenter.CSS


def test_replay_only_page_has_no_model_endpoints(tmp_path):
    full = app.build_app(app.Engine(None, None, None))
    alone = app.build_app(None, replay_only="Replay-only mode (test).")
    names = lambda blocks: {d.api_name for d in blocks.fns.values()}  # noqa: E731
    assert {"generate", "step", "compare", "replay_play", "replay_step"} <= names(full)
    assert "generate" not in names(alone) and {"replay_play", "replay_step"} <= names(alone)


def test_replay_only_flag_and_runtime_check(monkeypatch):
    assert app.parse_args(["--replay-only"]).replay_only and not app.parse_args([]).replay_only
    monkeypatch.setenv("SPECDEC_REPLAY_ONLY", "1")
    assert app.parse_args([]).replay_only
    assert app.missing_runtime() == ""  # torch and transformers are installed here
    monkeypatch.setattr(app.importlib.util, "find_spec", lambda name: None)
    assert app.missing_runtime() == "torch and transformers are not installed"


NO_TORCH = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "transformers"):
            raise ImportError(f"{name} is blocked by the test")
sys.meta_path.insert(0, Refuse())
import app
app.build_app(None, replay_only="no torch")
"""


def test_the_replay_only_page_builds_without_torch():
    """`demo/` reads its drafters and defaults from `specdec.registry` and `specdec.config`, which need no torch."""
    subprocess.run([sys.executable, "-c", NO_TORCH], cwd=Path(app.__file__).parent, check=True, timeout=120)
