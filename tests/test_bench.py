"""The benchmark on tiny models: interleaved runs, the JSON fields, the table, the context-length study."""

import json

import pytest

from specdec import bench
from specdec.config import LOOKUP_BRANCH, GenerationConfig
from specdec.records import depth_reached


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"p{i}", "kind": k, "prompt": t}) for i, (k, t) in
                              enumerate([("code", "abcabcab"), ("chat", "badcab"), ("math", "cabbage")])))
    return bench.load_prompts([str(path)])


def test_shipped_prompt_sets():
    items = bench.load_prompts(None)
    assert len(items) >= 40
    assert {i["kind"] for i in items} >= {"code", "math", "chat", "summary"}
    assert len({i["id"] for i in items}) == len(items)
    assert [i["kind"] for i in bench.load_prompts(None, limit=4)] == ["chat", "code", "math", "summary"]


def test_benchmark_compares_methods(tiny_models, prompts):
    methods = ["ar", "mamba-tree:2,2", "mamba-ucb", "tf-chain", "lookup-chain", "hf-ar", "hf-lookup", "hf-assisted"]
    result = bench.benchmark(tiny_models, prompts, methods, max_new_tokens=12, log=lambda _: None)
    rows = result["methods"]
    assert list(rows) == methods
    for name, row in rows.items():
        for key in ("tokens_per_s", "speedup_vs_ar", "mean_accepted_len", "acceptance_rate", "draft_ms_per_round",
                    "verify_ms_per_round", "peak_rss_mb", "identical_to_ar"):
            assert key in row
        assert row["tokens_per_s"] > 0 and row["peak_rss_mb"] > 0
    assert rows["ar"]["speedup_vs_ar"] == 1.0
    assert rows["hf-ar"]["identical_to_ar"] is True  # transformers' own greedy loop: the independent reference
    assert rows["ar"]["mean_accepted_len"] == 1.0 and rows["ar"]["acceptance_rate"] is None  # one token a round
    for name in methods[1:5]:  # the engine's drafting methods are exact, and their drafts were accepted
        assert rows[name]["identical_to_ar"] is True
        assert rows[name]["mean_accepted_len"] > 1.0 and rows[name]["acceptance_rate"] > 0
    assert rows["hf-ar"]["mean_accepted_len"] is None  # not measured for transformers' own loops
    table = bench.markdown_table(result)
    main, _, rest = table.partition("Per prompt, tok/s over ar's:")
    assert main.count("\n| ") == len(methods) and "| mamba-tree:2,2 |" in main
    per_prompt = [line for line in rest.strip().split("\n\n")[0].splitlines()]
    assert len(per_prompt) == 2 + len(methods) - 1  # header, rule, every method but ar
    ar, mine = rows["ar"]["per_prompt_tokens_per_s"], rows["mamba-ucb"]["per_prompt_tokens_per_s"]
    ratios = [mine[k] / ar[k] for k in ar]
    assert f"| mamba-ucb | {' | '.join(f'{x:.2f}' for x in ratios)} | {sum(ratios) / len(ratios):.2f} | " \
           f"{min(ratios):.2f} | {sum(x < 0.95 for x in ratios)} |" in per_prompt
    assert rows["ar"]["depth_reached"] is None and rows["hf-ar"]["depth_reached"] is None  # nothing drafted
    tree = rows["mamba-tree:2,2"]["depth_reached"]
    assert len(tree) == 2 and all(0 <= x <= 1 for x in tree) and tree[0] > 0
    assert "Acceptance by depth" in table and f"| mamba-tree:2,2 | {tree[0]:.2f} | {tree[1]:.2f} |" in table


def test_depth_reached_counts_each_depth_over_the_rounds_that_drafted_it():
    # (depth drafted, drafted tokens accepted): a 3-deep round kept 2, another kept none, a 1-deep kept 1, one drafted
    # nothing
    assert depth_reached([(3, 2), (3, 0), (1, 1), (0, 0)]) == [2 / 3, 1 / 2, 0.0]
    assert depth_reached([(0, 0)]) == []


def test_aggregate_counts_and_compares_tokens():
    ar = [bench.Run("p0", "code", [1, 2, 3], 1.0, 2**20, rounds=3),
          bench.Run("p1", "chat", [4, 5], 1.0, 2**20, rounds=2)]
    same = [bench.Run("p0", "code", [1, 2, 3], 0.5, 2**21, rounds=1, accepted=2, tested=2),
            bench.Run("p1", "chat", [4, 5], 0.5, 2**21, rounds=1, accepted=1, tested=2)]
    row = bench._aggregate(same, ar, greedy=True, engine=True)
    assert row["identical_to_ar"] is True and row["mean_accepted_len"] == 5 / 2 and row["acceptance_rate"] == 3 / 4
    assert row["tokens_per_s"] == 5.0 and row["peak_rss_mb"] == 2.0
    other = [same[0], bench.Run("p1", "chat", [4, 6], 0.5, 2**21, rounds=1)]  # one token differs on one prompt
    assert bench._aggregate(other, ar, greedy=True, engine=True)["identical_to_ar"] is False
    assert bench._aggregate(same, ar, greedy=False, engine=True)["identical_to_ar"] is None


def test_sampling_benchmark_has_no_identity(tiny_models, prompts):
    result = bench.benchmark(tiny_models, prompts[:1], ["ar", "mamba-chain"], max_new_tokens=6, temperature=0.8,
                             log=lambda _: None)
    assert result["methods"]["mamba-chain"]["identical_to_ar"] is None


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="unknown method"):
        bench.parse_method("fast-please")
    with pytest.raises(ValueError, match="@"):
        bench.parse_method("mamba-chain@throughput")  # only a bandit has a reward


def test_lookup_branch_suffix(tiny_models, prompts):
    assert bench.parse_method("mamba-tree:2;1+lookup6") == ("mamba-tree", "2;1", None, 6, None, None)
    assert bench.parse_method("mamba-ucb@throughput+lookup") == ("mamba-ucb", None, "throughput", LOOKUP_BRANCH,
                                                                 None, None)
    assert bench.parse_method("mamba-ucb+lookup~0") == ("mamba-ucb", None, None, LOOKUP_BRANCH, 0.0, 0.0)
    assert bench.parse_method("tf-tree:2;1~0.2") == ("tf-tree", "2;1", None, 0, 0.2, 0.2)
    assert bench.parse_method("mamba-chain:4~0.02/0.3") == ("mamba-chain", "4", None, 0, 0.02, 0.3)
    for bad in ("lookup-chain+lookup", "ar+lookup", "mamba-ucb+lookahead", "mamba-ucb+lookupx"):
        with pytest.raises(ValueError, match="lookup"):
            bench.parse_method(bad)
    methods = ["ar", "mamba-tree:2,1", "mamba-tree:2,1+lookup3"]
    result = bench.benchmark(tiny_models, prompts[:2], methods, max_new_tokens=16, log=lambda _: None)
    rows = result["methods"]
    assert rows["mamba-tree:2,1+lookup3"]["lookup_branch"] == 3 and rows["mamba-tree:2,1"]["lookup_branch"] == 0
    assert rows["mamba-tree:2,1+lookup3"]["identical_to_ar"] is True


def test_bandit_settings_per_method(tiny_models, prompts):
    assert bench.parse_method("mamba-ucb@throughput") == ("mamba-ucb", None, "throughput", 0, None, None)
    methods = ["ar", "mamba-ucb", "mamba-ucb@throughput", "mamba-ucb@paper", "mamba-ucb:0|3"]
    result = bench.benchmark(tiny_models, prompts[:2], methods, max_new_tokens=10, arms="0; 2,1",
                             log=lambda _: None)
    assert set(result["methods"]["mamba-ucb:0|3"]["bandit_rounds"]) == {"none", "chain 3"}  # its own arms
    methods = methods[:-1]
    assert result["config"]["arms"] == "0; 2,1" and result["config"]["reward"] == "pooled"
    assert result["config"]["lambda_ucb"] is None  # each reward's default, in each method's row
    assert [result["methods"][m]["lambda_ucb"] for m in methods] == [None, 0.05, 0.3, 0.3]
    assert result["config"]["bandit_scope"] == "session"
    for name in methods[1:]:
        assert result["methods"][name]["identical_to_ar"] is True
        assert set(result["methods"][name]["bandit_rounds"]) <= {"none", "(2,1)"}
    assert [result["methods"][m]["reward"] for m in methods] == [None, "pooled", "throughput", "paper"]
    assert result["methods"]["ar"]["bandit_rounds"] is None
    assert "mamba-ucb (one bandit for the whole run), rounds per arm:" in bench.markdown_table(result)


@pytest.mark.parametrize("scope, bandits_made", [("session", 1 + 1), ("prompt", 1 + 3)])
def test_bandit_scope(tiny_models, prompts, scope, bandits_made, monkeypatch):
    """One bandit for the whole run, or one per prompt (the warm-up makes one of its own either way)."""
    made = []
    make = bench.UCBBandit.for_config
    monkeypatch.setattr(bench.UCBBandit, "for_config", lambda config: made.append(make(config)) or made[-1])
    result = bench.benchmark(tiny_models, prompts[:3], ["ar", "mamba-ucb"], max_new_tokens=6, bandit_scope=scope,
                             log=lambda _: None)
    assert len(made) == bandits_made
    rounds = sum(result["methods"]["mamba-ucb"]["bandit_rounds"].values())
    assert sum(sum(b.pulls) for b in made[1:]) == rounds  # every measured round taught the measured bandit(s)
    with pytest.raises(ValueError, match="bandit_scope"):
        bench.benchmark(tiny_models, prompts[:1], ["ar"], max_new_tokens=2, bandit_scope="forever")


def test_context_study(tiny_models, tmp_path):
    study = bench.context_study(tiny_models, [32, 128], steps=3, log=lambda _: None)
    small, large = study["rows"]
    assert small["mamba_state_bytes"] == large["mamba_state_bytes"]  # a fixed-size state
    assert large["tf_kv_bytes"] / 127 == small["tf_kv_bytes"] / 31  # a KV cache grows with the context
    bench.save_context_plot(study, str(tmp_path / "c.html"))
    assert "Mamba step ms" in (tmp_path / "c.html").read_text()


def test_where_the_time_goes_per_kind(tiny_models, prompts):
    methods = ["ar", "mamba-chain", "hf-ar"]
    result = bench.benchmark(tiny_models, prompts, methods, max_new_tokens=8, log=lambda _: None)
    kinds = ["code", "chat", "math"]
    for name, row in result["methods"].items():
        assert list(row["by_kind"]) == kinds
        for kind, part in row["by_kind"].items():
            assert part["prompt_tokens"] == len(next(p for p in prompts if p["kind"] == kind)["prompt"])
            engine = not name.startswith("hf-")
            assert (part["prefill_ms"] is not None and part["prefill_ms"] > 0) is engine  # a peer's is not apart
            assert (part["rounds"] is not None and part["rounds"] >= 1) is engine
            if engine:
                assert part["drafter_start_ms"] >= 0 and part["commit_ms_per_round"] >= 0
    assert all(part["speedup_vs_ar"] == part["decode_speedup_vs_ar"] == 1.0
               for part in result["methods"]["ar"]["by_kind"].values())
    assert result["methods"]["hf-ar"]["decode_speedup_vs_ar"] is None  # its rounds are not timed apart
    mamba = result["methods"]["mamba-chain"]
    assert mamba["rounds"] == sum(part["rounds"] for part in mamba["by_kind"].values())
    table = bench.breakdown_table(result)
    assert table.count("\n| ") == len(methods) * len(kinds) and "| mamba-chain | math | 7 |" in table


def test_long_prompts_cut_each_passage_at_each_length(tiny_models):
    tokenizer = tiny_models.target.tokenizer  # one token a character
    items = bench.long_prompts(tokenizer, [300, 900], bench.LONG_TOPICS[:2])
    assert [i["kind"] for i in items] == ["long-300", "long-300", "long-900", "long-900"]
    assert len({i["id"] for i in items}) == 4
    for short, long in zip(items[:2], items[2:]):
        assert len(tokenizer(short["prompt"])["input_ids"]) >= 300
        assert long["prompt"].startswith(short["prompt"].rstrip())  # the same passage, cut later
    with pytest.raises(ValueError, match="too short"):
        bench.long_prompts(tokenizer, [10**6], bench.LONG_TOPICS[:1])


def test_trim_suffix_per_method(tiny_models, prompts, monkeypatch):
    """`~Q` sets one method's `min_branch_q` and `min_expand_q`, `~Q/E` each, the others keep the run's."""
    for bad in ("ar~0", "lookup-chain~0.1", "mamba-tree~x", "mamba-tree~0.1/x"):
        with pytest.raises(ValueError, match="~"):
            bench.parse_method(bad)
    seen, run_engine = {}, bench.run_engine
    monkeypatch.setattr(bench, "run_engine", lambda models, prompt, config, bandit=None: seen.setdefault(
        (config.method, config.min_branch_q, config.min_expand_q), 0) or run_engine(models, prompt, config, bandit))
    methods = ["ar", "mamba-tree:3,2~0", "mamba-tree:3,2~0.3", "mamba-tree:2,2~0.01/0.5", "mamba-chain:2"]
    result = bench.benchmark(tiny_models, prompts[:2], methods, max_new_tokens=16, min_branch_q=0.1,
                             log=lambda _: None)
    expand = GenerationConfig.min_expand_q
    assert {("mamba-tree", 0.0, 0.0), ("mamba-tree", 0.3, 0.3), ("mamba-tree", 0.01, 0.5),
            ("mamba-chain", 0.1, expand)} <= set(seen)
    rows = result["methods"]
    assert [rows[m]["min_branch_q"] for m in methods] == [None, 0.0, 0.3, 0.01, 0.1]
    assert [rows[m]["min_expand_q"] for m in methods] == [None, 0.0, 0.3, 0.5, expand]
    assert result["config"]["min_branch_q"] == 0.1 and result["config"]["min_expand_q"] == expand
    assert all(rows[m]["identical_to_ar"] for m in methods)


def test_verification_cost_is_averaged_over_consecutive_positions(tiny_models, monkeypatch):
    """Each repeat starts one position later: the passes cover `repeats` consecutive positions from the length."""
    starts, verify = [], bench._verify_block
    monkeypatch.setattr(bench, "_verify_block", lambda lm, tokens: starts.append(lm.length) or verify(lm, tokens))
    cost = bench.verification_cost(tiny_models, [40], [1, 3], repeats=4, log=lambda _: None)
    row = cost["rows"][0]
    assert starts == [39, 39] + [39, 39, 40, 40, 41, 41, 42, 42]  # the warm-up, then one position a repeat
    assert set(row["ms"]) == set(row["at_length"]) == {1, 3} and row["steps"][1] == 1.0
    assert "mean over 4 consecutive positions" in bench.cost_table(cost)


def test_the_licence_and_long_prompt_sets_are_one_or_the_other(capsys):
    from specdec import cli

    assert cli.main(["bench", "--long", "--licences", "--methods", "ar"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error: --long and --licences are two prompt sets: pick one" in err
