"""UCB1 bandit that picks the draft-tree shape of each round (docs/method.md, "The bandit").

    k* = argmax_k  value_k + λ_UCB * sqrt(2 ln t / n_k)

Rewards (`value_k` is the arm's mean reward):
    throughput  (the default) the arm's measured tokens per second: the tokens its rounds emitted over the
                seconds they took, divided by the best arm's, so values lie in (0, 1] and the best arm scores 1.
                It counts what a round really costs (drafting, a verification pass that grows with the tree,
                the commit), so where drafting does not pay the plain target step (arm "0") wins. Every round
                weighs past rounds by DISCOUNT (discounted UCB): a bandit that lives over many prompts follows
                the prompt at hand, so one whose text the drafter cannot guess falls back to arm "0".
    paper       the paper's r = -(1/N_accept + λ_γ * γ(T) / N_accept), N_accept = tokens emitted in the round:
                fewer target calls per token, blind to what a pass over a larger tree costs.
"""

from __future__ import annotations

import math

from specdec.records import ArmStat, BanditSnapshot
from specdec.tree import TreeShape

DISCOUNT = 0.97  # throughput: the weight of a round one round older (a memory of about 1 / (1 - 0.97) rounds)


def paper_reward(n_accept: int, depth: int, lambda_gamma: float) -> float:
    """The paper's reward: fewer target calls per token, with a penalty on deep trees."""
    return -(1.0 / n_accept + lambda_gamma * depth / n_accept)


class UCBBandit:
    """One instance per generation session; arms are tree shapes."""

    def __init__(self, arms: list[TreeShape], lambda_ucb: float = 1.0, reward_kind: str = "throughput",
                 lambda_gamma: float = 0.1) -> None:
        self.arms = arms
        self.lambda_ucb = lambda_ucb
        self.lambda_gamma = lambda_gamma
        self.reward_kind = reward_kind
        self.pulls = [0] * len(arms)
        self.reward_sums = [0.0] * len(arms)  # paper: the rewards; throughput: the tokens emitted
        self.seconds = [0.0] * len(arms)  # throughput: the seconds the arm's rounds took
        self.weights = [0.0] * len(arms)  # throughput: the arm's rounds, each discounted by its age
        self.last: tuple[int, float] | None = None  # (arm, the last round's raw reward: paper's r, or tokens/s)

    @classmethod
    def for_config(cls, config) -> UCBBandit:
        """A fresh bandit over a `GenerationConfig`'s arms and reward settings."""
        return cls(config.shapes(), config.lambda_ucb, config.reward, config.lambda_gamma)

    def matches(self, config) -> bool:
        """Whether this bandit can go on learning for `config` (same arms, reward and λ's)."""
        return ([a.name for a in self.arms] == [s.name for s in config.shapes()] and self.reward_kind == config.reward
                and self.lambda_ucb == config.lambda_ucb and self.lambda_gamma == config.lambda_gamma)

    @property
    def t(self) -> int:
        return sum(self.pulls)

    def _counts(self) -> list[float]:
        """The rounds the exploration bonus counts: all pulls (paper), or their discounted weights (throughput)."""
        return self.weights if self.reward_kind == "throughput" else self.pulls

    def _rates(self) -> list[float | None]:
        """throughput: each arm's tokens per second over all its rounds."""
        return [tokens / max(s, 1e-9) if n else None for tokens, s, n in zip(self.reward_sums, self.seconds,
                                                                             self.pulls)]

    @property
    def _scale(self) -> float:
        """throughput: the best arm's tokens per second (1 for the paper's reward)."""
        if self.reward_kind != "throughput":
            return 1.0
        return max((r for r in self._rates() if r is not None), default=0.0) or 1.0

    def means(self) -> list[float | None]:
        if self.reward_kind == "throughput":
            scale = self._scale
            return [r / scale if r is not None else None for r in self._rates()]
        return [s / n if n else None for s, n in zip(self.reward_sums, self.pulls)]

    def ucb_values(self) -> list[float | None]:
        if 0 in self.pulls:
            return [None] * len(self.arms)
        counts = self._counts()
        log_t = math.log(max(sum(counts), 1.0))
        return [m + self.lambda_ucb * math.sqrt(2 * log_t / n) for m, n in zip(self.means(), counts)]

    def select(self) -> int:
        """Untried arms first, in order; then the highest UCB value (ties to the lower index)."""
        if 0 in self.pulls:
            return self.pulls.index(0)
        values = self.ucb_values()
        return max(range(len(values)), key=lambda k: values[k])

    def observe(self, arm: int, n_accept: int, depth: int, seconds: float) -> None:
        """Learn from one round of `arm`: it emitted `n_accept` tokens with a tree `depth` deep in `seconds`."""
        if self.reward_kind == "paper":
            self.update(arm, paper_reward(n_accept, depth, self.lambda_gamma))
            return
        for k in range(len(self.arms)):  # every arm's past fades by one round
            self.reward_sums[k] *= DISCOUNT
            self.seconds[k] *= DISCOUNT
            self.weights[k] *= DISCOUNT
        self.pulls[arm] += 1
        self.weights[arm] += 1.0
        self.reward_sums[arm] += n_accept
        self.seconds[arm] += seconds
        self.last = (arm, n_accept / max(seconds, 1e-9))

    def update(self, arm: int, reward: float) -> None:
        """Add one scalar reward to `arm` (the paper's reward; `observe` is the engine's entry point)."""
        if self.reward_kind != "paper":
            raise ValueError("a throughput bandit learns from rounds' tokens and seconds: use observe()")
        self.pulls[arm] += 1
        self.reward_sums[arm] += reward
        self.last = (arm, reward)

    def snapshot(self, chosen: int) -> BanditSnapshot:
        stats = [ArmStat(a.name, n, m, u) for a, n, m, u in zip(self.arms, self.pulls, self.means(), self.ucb_values())]
        last_reward = self.last[1] / self._scale if self.last else None
        return BanditSnapshot(stats, chosen, self.reward_kind, last_reward)
