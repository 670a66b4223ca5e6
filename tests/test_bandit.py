import math
import random

import pytest

from specdec.bandit import DISCOUNT, UCBBandit, paper_reward
from specdec.config import GenerationConfig
from specdec.tree import parse_arms


def test_paper_reward():
    assert paper_reward(4, 4, 0.1) == -(1 / 4 + 0.1 * 4 / 4)
    assert paper_reward(1, 0, 0.1) == -1.0


def test_tries_every_arm_first_then_converges_to_the_best():
    arms = parse_arms("1; 2; 3; 4")
    bandit = UCBBandit(arms, lambda_ucb=0.5, reward_kind="paper")
    rng = random.Random(0)
    means = [0.3, 0.5, 0.8, 0.45]
    first = []
    for t in range(3000):
        k = bandit.select()
        if t < len(arms):
            first.append(k)
        bandit.update(k, means[k] + rng.gauss(0, 0.2))
    assert first == [0, 1, 2, 3]
    assert bandit.pulls[2] > 0.8 * sum(bandit.pulls)
    snap = bandit.snapshot(bandit.select())
    assert snap.chosen == 2 and [a.name for a in snap.arms] == ["chain 1", "chain 2", "chain 3", "chain 4"]
    assert max(range(4), key=lambda k: snap.arms[k].mean_reward) == 2
    t = sum(bandit.pulls)
    for arm, n in zip(snap.arms, bandit.pulls):  # UCB1: mean + λ sqrt(2 ln t / n), from the pulls alone
        assert arm.pulls == n and math.isclose(arm.ucb, arm.mean_reward + 0.5 * math.sqrt(2 * math.log(t) / n))


@pytest.mark.parametrize("lambda_ucb, chosen", [(1.0, 1), (0.0, 0)])
def test_exploration_picks_a_rarely_tried_arm(lambda_ucb, chosen):
    """Arm 0: mean 0.5 over 10 pulls; arm 1: 0.4 once. The bonus (2.19 vs 0.69 at λ = 1) outweighs the means."""
    bandit = UCBBandit(parse_arms("1; 2"), lambda_ucb=lambda_ucb, reward_kind="paper")
    for _ in range(10):
        bandit.update(0, 0.5)
    bandit.update(1, 0.4)
    assert bandit.select() == chosen


def test_throughput_is_each_arms_tokens_over_its_seconds_normalised_by_the_best():
    bandit = UCBBandit(parse_arms("1; 2"), reward_kind="throughput")
    bandit.observe(0, n_accept=3, depth=1, seconds=0.1)  # 30 tok/s
    bandit.observe(1, n_accept=6, depth=2, seconds=0.1)  # 60 tok/s
    assert bandit.means() == [0.5, 1.0]
    assert bandit.select() == 1 and bandit.snapshot(1).last_reward == 1.0  # equal pulls: the higher mean wins
    bandit.observe(0, n_accept=12, depth=1, seconds=0.1)  # arm 0: 3 + 12 tokens in 0.2 s, older rounds discounted
    rate = (3 * DISCOUNT ** 2 + 12) / (0.1 * DISCOUNT ** 2 + 0.1)  # about 75 tok/s: the new best
    assert bandit.means() == pytest.approx([1.0, 60 / rate])
    assert bandit.snapshot(0).last_reward == pytest.approx(120 / rate)  # the round itself, on the same scale
    assert bandit.pulls == [2, 1]
    with pytest.raises(ValueError, match="observe"):
        bandit.update(0, 1.0)


def _stand_in_round(shape, pays: bool, rng: random.Random) -> tuple[int, float]:
    """One round of a stand-in engine: (tokens emitted, seconds). A target step takes 50 ms; verifying a tree
    costs more per node and drafting costs per level, in steps; each level's guess is kept with a fixed
    probability. Where drafting does not pay, each drafted token is often kept (so the paper's reward, which counts
    target passes per token, prefers drafting) but every verified node costs a third of a step."""
    keep, per_node, per_level = (0.8, 0.02, 0.01) if pays else (0.55, 0.3, 0.08)
    depth = 0
    while depth < shape.depth and rng.random() < keep:
        depth += 1
    seconds = 0.05 * (1 + per_node * shape.num_drafted + per_level * shape.depth)
    return depth + 1, seconds * rng.uniform(0.9, 1.1)  # the machine's timing noise


def _run(config: GenerationConfig, phases: list[bool], seed: int = 1) -> tuple[list[int], list[float]]:
    """The bandit of `config` on the stand-in engine, one phase of 200 rounds per entry (drafting pays or not).
    -> (the arm of every round, each phase's tokens per second over the target alone's)."""
    rng, bandit, chosen, speed = random.Random(seed), UCBBandit.for_config(config), [], []
    for pays in phases:
        tokens = seconds = 0.0
        for _ in range(200):
            arm = bandit.select()
            emitted, took = _stand_in_round(bandit.arms[arm], pays, rng)
            bandit.observe(arm, emitted, bandit.arms[arm].depth, took)
            chosen.append(arm)
            tokens, seconds = tokens + emitted, seconds + took
        speed.append(tokens / seconds * 0.05)  # the target alone: one token per 50 ms step
    return chosen, speed


def test_the_default_bandit_never_loses_much_to_the_target_alone():
    """With the defaults (`mamba-ucb`: arms 0; 3; 2,1,1; 2,1,1,1, the throughput reward), on a stand-in engine
    whose drafting never pays the bandit keeps near the target alone's speed (what it loses is exploration), and
    where drafting pays it drafts; the paper's reward, blind to what a round costs, keeps drafting at a loss."""
    ours, paper = [], []
    for seed in (1, 2, 3, 4):
        chosen, (loses, pays) = _run(GenerationConfig(method="mamba-ucb"), [False, True], seed)
        assert chosen[:200].count(0) > 80 and chosen[230:].count(0) < 20, seed
        assert loses > 0.8 and pays > 2.4, seed
        ours.append(loses)
        chosen, (loses, _) = _run(GenerationConfig(method="mamba-ucb", reward="paper"), [False, True], seed)
        assert chosen[:200].count(0) < 40, seed
        paper.append(loses)
    assert sum(paper) / 4 < sum(ours) / 4 - 0.08  # the control: counting passes, not seconds, costs speed here


def test_the_throughput_bandit_follows_the_prompt_at_hand():
    """A session-long bandit: drafting pays for 200 rounds, then not (a text the drafter cannot guess), then it
    pays again. The discounted throughput moves to arm 0 and back; without the discount it stays longer on arms
    that paid before."""
    chosen, (first, loses, again) = _run(GenerationConfig(method="mamba-ucb"), [True, False, True])
    assert first > 2.4 and again > 2.4 and chosen[250:400].count(0) > 60
    assert loses > 0.8


def test_the_default_exploration_recovers_from_an_unlucky_first_pull():
    """Arm 0 (no drafting) always earns -1; a chain of 3 that keeps each drafted token with probability 0.5 earns
    -0.91 on average but -1.3 on a round that keeps nothing. After such a first round the default λ_UCB must still
    find the better arm and keep it most of the time; at λ_UCB = 0.1 it stays on arm 0 (as a session-wide bandit
    did for a whole 12-prompt benchmark run)."""
    rng = random.Random(0)
    config = GenerationConfig(method="mamba-ucb", arms="0; 3", reward="paper")
    for lambda_ucb, wins in ((config.lambda_ucb, True), (1.0, True), (0.1, False)):  # 600 rounds: 488, 413, 2
        bandit = UCBBandit(config.shapes(), lambda_ucb, config.reward, config.lambda_gamma)
        first = True
        for _ in range(600):
            arm = bandit.select()
            depth = bandit.arms[arm].depth
            if depth == 0:
                emitted = 1
            elif first:
                emitted, first = 1, False  # the unlucky first round: every drafted token rejected
            else:
                emitted = 1 + next((i for i in range(depth) if rng.random() >= 0.5), depth)
            bandit.observe(arm, emitted, depth, 0.05)
        assert (bandit.pulls[1] > 400) == wins, (lambda_ucb, bandit.pulls)
