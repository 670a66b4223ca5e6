"""UCB1 bandit that picks the draft-tree shape of each round (PAPER.md, step 5).

    k* = argmax_k  mean_reward_k + λ_UCB * sqrt(2 ln t / n_k)

Rewards:
    paper       r = -(1/N_accept + λ_γ * γ(T) / N_accept), N_accept = tokens emitted in the round
    throughput  the round's measured tokens per second, divided by the best round seen so far so it lies in
                (0, 1] like the paper's reward scale (the argmax of the means is unchanged by the division)
"""

from __future__ import annotations

import math

from specdec.records import ArmStat, BanditSnapshot
from specdec.tree import TreeShape


def paper_reward(n_accept: int, depth: int, lambda_gamma: float) -> float:
    """The paper's reward: fewer target calls per token, with a penalty on deep trees."""
    return -(1.0 / n_accept + lambda_gamma * depth / n_accept)


class UCBBandit:
    """One instance per generation session; arms are tree shapes."""

    def __init__(self, arms: list[TreeShape], lambda_ucb: float = 1.0, reward_kind: str = "paper",
                 lambda_gamma: float = 0.1) -> None:
        self.arms = arms
        self.lambda_ucb = lambda_ucb
        self.lambda_gamma = lambda_gamma
        self.reward_kind = reward_kind
        self.pulls = [0] * len(arms)
        self.reward_sums = [0.0] * len(arms)
        self.scale = 0.0  # throughput: best round tokens/s seen so far
        self.last: tuple[int, float] | None = None

    @classmethod
    def for_config(cls, config) -> UCBBandit:
        """A fresh bandit over a `GenerationConfig`'s arms and reward settings."""
        return cls(config.shapes(), config.lambda_ucb, config.reward, config.lambda_gamma)

    def matches(self, config) -> bool:
        """Whether this bandit can go on learning for `config` (same arms, reward and λ's)."""
        return ([a.name for a in self.arms] == [s.name for s in config.shapes()] and self.reward_kind == config.reward
                and self.lambda_ucb == config.lambda_ucb and self.lambda_gamma == config.lambda_gamma)

    @property
    def _divisor(self) -> float:
        return self.scale if self.reward_kind == "throughput" and self.scale > 0 else 1.0

    @property
    def t(self) -> int:
        return sum(self.pulls)

    def means(self) -> list[float | None]:
        return [s / n / self._divisor if n else None for s, n in zip(self.reward_sums, self.pulls)]

    def ucb_values(self) -> list[float | None]:
        if 0 in self.pulls:
            return [None] * len(self.arms)
        log_t = math.log(self.t)
        return [m + self.lambda_ucb * math.sqrt(2 * log_t / n) for m, n in zip(self.means(), self.pulls)]

    def select(self) -> int:
        """Untried arms first, in order; then the highest UCB value (ties to the lower index)."""
        if 0 in self.pulls:
            return self.pulls.index(0)
        values = self.ucb_values()
        return max(range(len(values)), key=lambda k: values[k])

    def reward(self, n_accept: int, depth: int, seconds: float) -> float:
        if self.reward_kind == "paper":
            return paper_reward(n_accept, depth, self.lambda_gamma)
        return n_accept / max(seconds, 1e-9)

    def update(self, arm: int, reward: float) -> None:
        self.pulls[arm] += 1
        self.reward_sums[arm] += reward
        if self.reward_kind == "throughput":
            self.scale = max(self.scale, reward)
        self.last = (arm, reward)

    def snapshot(self, chosen: int) -> BanditSnapshot:
        stats = [ArmStat(a.name, n, m, u) for a, n, m, u in zip(self.arms, self.pulls, self.means(), self.ucb_values())]
        last_reward = self.last[1] / self._divisor if self.last else None
        return BanditSnapshot(stats, chosen, self.reward_kind, last_reward)
