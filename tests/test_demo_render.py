"""The render functions of `demo/`: tree SVG, token stream, captions, comparison, legend."""

from __future__ import annotations

import re

from demo.captions import caption_html, round_caption, status_text, summary_caption
from demo.colours import SWATCHES, legend_html
from demo.compare import compare_html, headline
from demo.session import Session
from demo.tokens_html import conversation_html, stream_html
from demo.tree_svg import TARGET, boxes, rows, tree_html, tree_svg, visible
from specdec.records import ArmStat, BanditSnapshot, EmittedToken, RoundRecord, Summary, TreeNode


def record(nodes, emitted, shape, index=0, bandit=None) -> RoundRecord:
    accepted = sum(t.source == "draft" for t in emitted)
    name = "(" + ",".join(map(str, shape)) + ")"
    return RoundRecord(index, shape, name, nodes, emitted, accepted, 3.0, 20.0, 24.0, 10 + len(emitted), 0.5,
                       300 << 20, None, None, 4096, 8192, bandit)


def tree_with_correction() -> RoundRecord:
    """Shape (2,1): ' cat' accepted, ' dog' rejected, ' sat' rejected under ' cat', '<b>' never reached; the
    target corrects with ' ran' after ' cat'."""
    nodes = [
        TreeNode(0, 1, "The", -1, 0, 1.0, 1.0, "root"),
        TreeNode(1, 2, " cat", 0, 1, 0.6, 0.7, "accepted"),
        TreeNode(2, 3, " dog", 0, 1, 0.25, 0.05, "rejected"),
        TreeNode(3, 4, " sat", 1, 2, 0.5, 0.1, "rejected"),
        TreeNode(4, 5, "<b>", 2, 2, 0.3, 0.2, "not_reached"),
    ]
    emitted = [EmittedToken(2, " cat", "draft"), EmittedToken(6, " ran", "correction")]
    return record(nodes, emitted, [2, 1])


def chain_with_bonus() -> RoundRecord:
    nodes = [TreeNode(0, 1, "x", -1, 0, 1.0, 1.0, "root")]
    nodes += [TreeNode(i, 10 + i, f" t{i}", i - 1, i, 0.9, 0.8, "accepted") for i in (1, 2, 3)]
    emitted = [EmittedToken(10 + i, f" t{i}", "draft") for i in (1, 2, 3)] + [EmittedToken(99, "\n", "bonus")]
    return record(nodes, emitted, [1, 1, 1], index=4)


def statuses(svg: str) -> list[str]:
    return re.findall(r'class="sd-node" data-status="(\w+)"', svg)


def test_tree_has_one_node_per_draft_plus_the_target_token():
    svg = tree_svg(tree_with_correction())
    assert statuses(svg) == ["root", "accepted", "rejected", "rejected", "not_reached", "target"]
    assert svg.count("<path ") == 5  # one edge into every node but the root


def test_tree_fills_follow_status_colours():
    svg = tree_svg(tree_with_correction())
    found = re.findall(r'<g class="sd-node" data-status="(\w+)".*?<rect [^>]*fill="([^"]+)"', svg, flags=re.DOTALL)
    assert len(found) == 6
    for status, fill in found:
        assert fill == SWATCHES[status].fill
    assert 'stroke-dasharray' in svg  # not reached nodes are dashed
    assert 'text-decoration="line-through"' in svg  # rejected tokens are struck through


def test_tree_escapes_token_text_and_shows_white_space():
    svg = tree_svg(tree_with_correction())
    assert "<b>" not in svg and "&lt;b&gt;" in svg
    assert ">␣cat<" in svg and ">␣ran<" in svg


def test_tree_hover_gives_q_and_p():
    svg = tree_svg(tree_with_correction())
    titles = re.findall(r"<title>(.*?)</title>", svg, flags=re.DOTALL)
    assert "q (drafter) = 0.600" in titles[1] and "p (target) = 0.700" in titles[1]
    assert "q (drafter)" not in titles[0]  # the root was not drafted
    assert "correction" in titles[-1]


def test_copied_tokens_are_tagged_and_explained():
    rec = tree_with_correction()
    rec.nodes.append(TreeNode(5, 7, " mat", 0, 1, 1.0, 0.05, "rejected", copied=True))
    svg = tree_svg(rec)
    assert svg.count('class="sd-copy"') == 1
    copy_title = re.findall(r"<title>(.*?)</title>", svg, flags=re.DOTALL)[5]
    assert "copied from the context" in copy_title and "q (drafter)" not in copy_title
    assert "p (target) = 0.050" in copy_title
    assert "proposed 4 tokens in a (2,1) tree and prompt lookup 1 token copied from the text" in round_caption(rec)


def test_correction_hangs_under_the_last_accepted_node():
    nodes = boxes(tree_with_correction())
    extra = nodes[-1]
    assert (extra.key, extra.parent, extra.depth, extra.kind) == (TARGET, 1, 2, "target")


def test_bonus_follows_the_accepted_leaf_in_its_own_column():
    rec = chain_with_bonus()
    extra = boxes(rec)[-1]
    assert (extra.parent, extra.depth, extra.label) == (3, 4, "↵")
    svg = tree_svg(rec)
    assert ">bonus<" in svg and ">target<" in svg  # label beside the node, column header


def test_layout_gives_leaves_distinct_rows_and_centres_parents():
    row = rows(boxes(tree_with_correction()))
    leaves = [row[3], row[TARGET], row[4]]
    assert sorted(leaves) == [0.0, 1.0, 2.0]
    assert row[1] == (row[3] + row[TARGET]) / 2
    assert row[0] == (row[1] + row[2]) / 2


def test_visible_marks_white_space_and_shortens():
    assert visible(" a\tb\n") == "␣a⇥b↵"
    assert visible("") == "∅"
    assert visible("x" * 30, limit=8) == "xxxxxxx…"


def test_tree_html_heads_with_round_shape_and_bandit_arm():
    arms = [ArmStat("(3)", 2, -0.5, 1.2), ArmStat("(2,1)", 1, -0.4, 1.5), ArmStat("(5)", 0, None, None)]
    rec = tree_with_correction()
    rec.bandit = BanditSnapshot(arms, 1, "paper", -0.4)
    out = tree_html(rec, rounds_total=7)
    assert "Round 1 of 7 · shape (2,1) · chosen by the bandit (arm 2 of 3)" in out
    assert out.count('class="sd-legend-item"') == 5
    assert "appears here" in tree_html(None)


def test_target_only_round_draws_root_and_target_token():
    rec = record([TreeNode(0, 1, "Hi", -1, 0, 1.0, 1.0, "root")], [EmittedToken(3, "!", "bonus")], [])
    assert statuses(tree_svg(rec)) == ["root", "target"]
    assert "no draft (target only)" in tree_html(rec)


def test_stream_colours_each_token_by_origin():
    html = stream_html([tree_with_correction(), chain_with_bonus()])
    spans = re.findall(r'<span class="sd-tok" data-source="(\w+)" data-round="(\d)" title="[^"]*">([^<]*)</span>',
                       html)
    assert spans == [
        ("draft", "0", " cat"), ("correction", "0", " ran"),
        ("draft", "4", " t1"), ("draft", "4", " t2"), ("draft", "4", " t3"), ("bonus", "4", "\n")]
    rules = dict(re.findall(r'\.sd-tok\[data-source="(\w+)"\]\{([^}]*)\}', html))
    assert SWATCHES["accepted"].fill in rules["draft"]
    assert SWATCHES["target"].fill in rules["correction"] and SWATCHES["target"].fill in rules["bonus"]
    assert "white-space:pre-wrap" in html


def test_long_answers_stream_little_markup_per_token():
    """Colours come from one style block, so a token costs its text plus a short tag, however long the answer."""
    emitted = [EmittedToken(i, " word", "draft") for i in range(500)]
    html = stream_html([record([TreeNode(0, 1, "a", -1, 0, 1.0, 1.0, "root")], emitted, [1])])
    assert html.count("<style>") == 1
    assert len(html) / 500 < 110


def test_stream_escapes_and_shows_cursor_while_live():
    rec = record([TreeNode(0, 1, "a", -1, 0, 1.0, 1.0, "root")], [EmittedToken(1, "<i>&", "bonus")], [])
    html = stream_html([rec], live=True)
    assert "&lt;i&gt;&amp;" in html and "<i>" not in html
    assert "sd-cursor" in html and "sd-cursor" not in stream_html([rec])


def test_conversation_shows_prompt_tokens_status_and_legend():
    html = conversation_html("Why <is> the sky blue?", [tree_with_correction()], status="Done: 2 tokens")
    assert "Why &lt;is&gt; the sky blue?" in html
    assert html.count('class="sd-tok"') == 2 and "Done: 2 tokens" in html
    assert 'data-kind="accepted"' in html and 'data-kind="target"' in html
    assert "Generate" in conversation_html("", [])  # the empty state says what to do


def test_a_long_prompt_is_folded_to_its_first_lines_and_its_size():
    document = "".join(f"Line {i} <of> the document, padded out to some length.\n" for i in range(150))
    html = conversation_html(document, [])
    user = re.search(r'<div class="sd-user".*?</details></div>', html, flags=re.DOTALL).group(0)
    summary = re.search(r"<summary.*?</summary>", user, flags=re.DOTALL).group(0)
    assert "Line 0 &lt;of&gt;" in summary and "Line 2 " in summary and "Line 3 " not in summary
    assert f"{len(document):,} characters, 150 lines" in summary
    assert document.replace("<", "&lt;").replace(">", "&gt;") in user.split("</summary>", 1)[1]  # opened: all
    assert "<of>" not in html and html.count("<details") == 1
    one_line = "word " * 200  # no line break, over the character limit: folded, its preview cut
    summary = re.search(r"<summary.*?</summary>", conversation_html(one_line, []), flags=re.DOTALL).group(0)
    assert "1,000 characters, 1 line:" in summary and len(summary) < 600


def test_a_short_prompt_is_shown_whole_without_folding():
    prompt = "\n".join(f"line {i}" for i in range(6))
    html = conversation_html(prompt, [])
    assert "<details" not in html and 'class="sd-user"' in html and prompt in html


def test_tokens_of_a_round_that_drafted_nothing_are_the_target_alone_not_a_bonus():
    alone = record([TreeNode(0, 1, "Hi", -1, 0, 1.0, 1.0, "root")], [EmittedToken(3, "!", "bonus")], [], index=2)
    html = stream_html([alone, chain_with_bonus()])
    tips = re.findall(r'data-source="(\w+)" data-round="(\d)" title="([^"]*)"', html)
    assert tips[0] == ("bonus", "2", "round 3: written by the target alone")  # the CSS rule still colours it
    assert tips[-1] == ("bonus", "4", "round 5: target&#x27;s bonus")  # after an accepted leaf it is a bonus
    assert "target&#x27;s bonus" not in stream_html([alone])


def test_legend_uses_the_same_colours_as_nodes_and_tokens():
    html = legend_html(("accepted", "rejected", "target"))
    for kind in ("accepted", "rejected", "target"):
        assert SWATCHES[kind].fill in html and SWATCHES[kind].label in html


def test_round_caption_says_what_happened():
    assert round_caption(tree_with_correction()) == (
        "Round 1: the drafter proposed 4 tokens in a (2,1) tree; the target accepted 1 (“ cat”) "
        "and added 1 of its own (“ ran”, a correction).")
    assert round_caption(chain_with_bonus()) == (
        "Round 5: the drafter proposed 3 tokens in a chain; the target accepted 3 (“ t1 t2 t3”) "
        "and added 1 of its own (“↵”, a bonus token).")
    reading = tree_with_correction()
    reading.drafter_read_target = True  # a mamba-feat round says so
    assert round_caption(reading).startswith("Round 1: the drafter proposed 4 tokens in a (2,1) tree (it read the "
                                             "target's hidden state at the last accepted token")
    tips = {b.depth: b.tip for b in boxes(reading) if b.kind != "target"}
    assert "hidden state at the last accepted token" in tips[1] and "own guesses" in tips[2]
    assert all("hidden state" not in b.tip for b in boxes(tree_with_correction()))  # a plug-in drafter's: silent


def test_round_caption_for_rejections_and_target_only():
    rec = tree_with_correction()
    rec.nodes[1].status, rec.emitted, rec.accepted_len = "rejected", [EmittedToken(6, " ran", "correction")], 0
    assert "the target accepted none of them and added 1 of its own" in round_caption(rec)
    alone = record([TreeNode(0, 1, "a", -1, 0, 1.0, 1.0, "root")], [EmittedToken(1, " b", "bonus")], [])
    assert round_caption(alone) == (
        "Round 1: nothing was drafted; the target produced 1 token on its own (“ b”, a bonus token).")


def summary(method="mamba-ucb", tokens_per_s=40.0, rounds=10, ids=(1, 2, 3), reason="max_new_tokens",
            prefill_ms=0.0) -> Summary:
    """A run of `ids` whose engine time (prefill and rounds) gives `tokens_per_s`."""
    seconds = len(ids) / tokens_per_s - prefill_ms / 1e3
    return Summary(method, "abc", list(ids), len(ids), rounds, prefill_ms, seconds, len(ids) / seconds,
                   len(ids) / rounds, 0.5, 30, reason)


def test_summary_caption():
    text = summary_caption(summary(reason="eos"))
    assert text == ("Done: 3 tokens in 10 rounds (0.3 per round) at 40.0 tokens/s; 50% of checked drafts accepted; "
                    "stopped because the model ended its answer.")
    assert "you pressed Stop" in summary_caption(summary(reason="stopped"))


def test_compare_reports_both_speeds_and_the_speed_up():
    base, run = summary("ar", 20.0, rounds=3), summary(tokens_per_s=50.0, rounds=2)
    html = compare_html([chain_with_bonus()], base, [tree_with_correction()], run, "Mamba tree + bandit")
    assert headline(base, run, "M") == "Speed-up: 2.50× (50.0 vs 20.0 tokens/s), 2 instead of 3 target passes, " \
        "identical text."
    assert "Target alone" in html and "Mamba tree + bandit" in html
    assert html.count('class="sd-compare-speed"') == 2 and "50.0 tokens/s" in html


def test_the_verdict_is_measured_against_the_tabs_own_target_alone_run_or_estimated():
    from demo.compare import verdict

    run = summary(tokens_per_s=30.0, rounds=2, ids=(1, 2, 3, 4, 5, 6), prefill_ms=20.0)
    measured = verdict([], run, summary("ar", 20.0, rounds=6, ids=(1, 2, 3, 4, 5, 6)), "M", comparing=False)
    assert "1.50× the target alone (its run of this prompt in this tab, 20.0 tokens/s)" in measured
    plain, tree = chain_with_bonus(), tree_with_correction()
    estimate = verdict([plain, tree], run, None, "M", comparing=False)
    # the target alone: the prompt's 20 ms, then 6 passes at the cheapest measured verification
    step = min(plain.verify_ms, tree.verify_ms) / 1e3
    assert f"about {(0.02 + 6 * step) / run.engine_seconds:.2f}× the target alone (estimated: 4 target passes" \
        in estimate
    assert "one pass a token" in verdict([], summary("ar"), None, "M", comparing=False)


def test_compare_headline_while_running():
    assert "target alone" in headline(None, None, "X")
    assert "now “X”" in headline(summary("ar"), None, "X")
    assert "texts differ" in headline(summary("ar"), summary(ids=(9,)), "X")


def test_caption_box_escapes_token_text():
    html = caption_html("Round 1: the target added “<script>”.")
    assert "&lt;script&gt;" in html and "<script>" not in html and 'class="sd-caption"' in html
    assert caption_html("") == ""


def test_status_text_follows_the_run():
    s = Session()
    s.start("p", {})
    assert "Loading the models" in status_text(s, live=True) and status_text(s, live=False) == ""
    s.add(tree_with_correction())
    assert status_text(s, live=True) == "Generating… round 1 · 12 tokens · 500.0 tokens/s"
    s.add(summary())
    assert status_text(s, live=False).startswith("Done: 3 tokens")
    s.summary.extra["drafter"] = "random-mamba"
    assert "the trained drafter is not installed" in status_text(s, live=False)
