import math
import random

import pytest

from specdec.bandit import UCBBandit, paper_reward
from specdec.config import GenerationConfig
from specdec.tree import parse_arms


def test_paper_reward():
    assert paper_reward(4, 4, 0.1) == -(1 / 4 + 0.1 * 4 / 4)
    assert paper_reward(1, 0, 0.1) == -1.0


def test_tries_every_arm_first_then_converges_to_the_best():
    arms = parse_arms("1; 2; 3; 4")
    bandit = UCBBandit(arms, lambda_ucb=0.5)
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
    bandit = UCBBandit(parse_arms("1; 2"), lambda_ucb=lambda_ucb)
    for _ in range(10):
        bandit.update(0, 0.5)
    bandit.update(1, 0.4)
    assert bandit.select() == chosen


def test_throughput_reward_is_normalised():
    bandit = UCBBandit(parse_arms("1; 2"), reward_kind="throughput")
    bandit.update(0, bandit.reward(n_accept=3, depth=1, seconds=0.1))  # 30 tok/s
    bandit.update(1, bandit.reward(n_accept=6, depth=2, seconds=0.1))  # 60 tok/s
    assert bandit.means() == [0.5, 1.0]
    assert bandit.select() == 1 and bandit.snapshot(1).last_reward == 1.0  # equal pulls: the higher mean wins
    bandit.update(0, bandit.reward(n_accept=12, depth=1, seconds=0.1))  # 120 tok/s: the new scale
    assert bandit.means() == [(30 + 120) / 2 / 120, 60 / 120]


def test_the_default_exploration_recovers_from_an_unlucky_first_pull():
    """Arm 0 (no drafting) always earns -1; a chain of 3 that keeps each drafted token with probability 0.5 earns
    -0.91 on average but -1.3 on a round that keeps nothing. After such a first round the default λ_UCB must still
    find the better arm and keep it most of the time; at λ_UCB = 0.1 it stays on arm 0 (as a session-wide bandit
    did for a whole 12-prompt benchmark run)."""
    rng = random.Random(0)
    config = GenerationConfig(method="mamba-ucb", arms="0; 3")
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
            bandit.update(arm, bandit.reward(emitted, depth, 0.05))
        assert (bandit.pulls[1] > 400) == wins, (lambda_ucb, bandit.pulls)
