"""UCB1 bandit that picks the draft-tree shape of each round (docs/method.md, "The bandit").

    k* = argmax_k  value_k + λ_UCB * sqrt(2 ln t / n_k)

Rewards (`value_k` is the arm's mean reward):
    pooled      (the default) the arm's tokens per second, predicted: the tokens a round of its shape emits
                (from the chance that each depth of the accepted path goes on, learnt from every drafting
                round whatever its shape) over the seconds a round of that arm takes (measured), divided by
                the best arm's, so values lie in (0, 1]. The cost of a shape is a fact about the machine and
                changes slowly (COST_DISCOUNT); how well the drafter guesses is a fact about the text: it is
                pooled over all shapes, forgets fast (ACCEPT_MEMORY a round, drafting or not) and counts for
                less when a new prompt starts (NEW_PROMPT_KEEP). So on a text the
                drafter cannot guess, every drafting arm falls at once, after a few rounds of any of them, and
                arm "0" wins; while it does, the chances drift back to the priors until a drafting arm is tried
                again, and each such try that keeps nothing makes the next drift slower (IDLE_BACKOFF).
                Under sampling a first guess counts the chance it had of being kept (`DepthOutcome.chance`),
                not the outcome of the acceptance test's coin.
    throughput  the arm's measured tokens per second: the tokens its rounds emitted over the seconds they took,
                divided by the best arm's. Every round weighs past rounds by DISCOUNT (discounted UCB). Each
                arm learns from its own rounds only.
    paper       the paper's r = -(1/N_accept + λ_γ * γ(T) / N_accept), N_accept = tokens emitted in the round:
                fewer target calls per token, blind to what a pass over a larger tree costs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from specdec.records import ArmStat, BanditSnapshot
from specdec.sampling import children_of
from specdec.tree import TreeShape

DISCOUNT = 0.97  # throughput: the weight of a round one round older (a memory of about 1 / (1 - 0.97) rounds)
COST_DISCOUNT = 0.99  # pooled: the same for an arm's seconds per round and its pulls (costs change slowly)
ACCEPT_MEMORY = 0.9  # pooled: the weight of a round's depth outcomes one round (drafting or not) older
NEW_PROMPT_KEEP = 0.1  # pooled: the weight left to the depth outcomes of earlier prompts when a new one starts
IDLE_BACKOFF = 4  # pooled: rounds of arm "0" fade the outcomes up to this many times slower after failed tries
FIRST_PRIOR = (0.5, 1.0)  # pooled: (mean, weight in rounds) of the chance that a depth's first child is kept
OTHER_PRIOR = (0.2, 1.0)  # pooled: the same for a sibling being kept when the first child is not
BEYOND_PRIOR = (0.0, 1.0)  # pooled: the same for a grafted branch going on past the shape


class DepthOutcome(NamedTuple):
    """What one depth of a round's tree did, along the accepted path (`depth_outcomes`)."""

    depth: int  # 1 = the root's children
    width: int  # the arm's shape's children per node at this depth; 0 past its depth (a prompt-lookup graft)
    kept: bool  # the path went on to this depth
    first: bool  # ... through the parent's first child (the drafter's best guess)
    chance: float | None = None  # sampling: the chance the first child had to be kept (the coin `first` came from)


def depth_outcomes(parents: Sequence[int], path: Sequence[int], widths: Sequence[int],
                   chances: Sequence[float] | None = None) -> list[DepthOutcome]:
    """A verified tree (`parents`, -1 for the root) and its accepted path (node indices from the root) -> one
    outcome per depth the path reached, and the depth where it stopped; none for arm "0" (no `widths`), but a
    failure at depth 1 for a drafting shape whose tree was trimmed to its root. `chances` (sampling,
    `sampling.first_child_chances`): per path node, the chance its first child had to be kept."""
    if not widths:
        return []
    children, out = children_of(parents), []
    for depth in range(1, len(parents) + 1):
        kept = depth < len(path)
        first = kept and children[path[depth - 1]][0] == path[depth]
        width = widths[depth - 1] if depth <= len(widths) else 0
        alone = width >= 2 or len(children[path[depth - 1]]) <= 1  # width 1 with a copied sibling: the coin
        chance = chances[depth - 1] if chances is not None and alone else None
        out.append(DepthOutcome(depth, width, kept, first, chance))
        if not kept:
            break
    return out


class _Rates:
    """Discounted (trials, successes) per key, read with a prior: (successes + mean * weight) / (trials + weight)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[int, int], list[float]] = {}

    def add(self, key: tuple[int, int], success: bool | float) -> None:
        """One trial: its outcome, or the chance it had (its expected outcome)."""
        c = self.counts.setdefault(key, [0.0, 0.0])
        c[0] += 1.0
        c[1] += float(success)

    def scale(self, factor: float) -> None:
        for c in self.counts.values():
            c[0] *= factor
            c[1] *= factor

    def rate(self, depth: int, width: int, prior: tuple[float, float], shallower: bool = True) -> float | None:
        """The rate at (depth, width), else (`shallower`) at the nearest shallower depth seen, else the prior;
        None where nothing was seen and `shallower` is off."""
        depths = range(depth, 0, -1) if shallower else (depth,)
        seen = next(((d, width) for d in depths if (d, width) in self.counts), None)
        if seen is None and not shallower:
            return None
        trials, successes = self.counts.get(seen, (0.0, 0.0))
        mean, weight = prior
        return (successes + mean * weight) / (trials + weight)


def paper_reward(n_accept: int, depth: int, lambda_gamma: float) -> float:
    """The paper's reward: fewer target calls per token, with a penalty on deep trees."""
    return -(1.0 / n_accept + lambda_gamma * depth / n_accept)


class UCBBandit:
    """One instance per generation session; arms are tree shapes."""

    def __init__(self, arms: list[TreeShape], lambda_ucb: float = 1.0, reward_kind: str = "pooled",
                 lambda_gamma: float = 0.1) -> None:
        self.arms = arms
        self.lambda_ucb = lambda_ucb
        self.lambda_gamma = lambda_gamma
        self.reward_kind = reward_kind
        self.pulls = [0] * len(arms)
        self.reward_sums = [0.0] * len(arms)  # paper: the rewards; throughput: the tokens emitted
        self.seconds = [0.0] * len(arms)  # throughput, pooled: the seconds the arm's rounds took, discounted
        self.weights = [0.0] * len(arms)  # throughput, pooled: the arm's rounds, each discounted by its age
        self.first = _Rates()  # pooled: (depth, 0) -> was the first child kept (any child, where the width is 1)
        self.other = _Rates()  # pooled: (depth, width >= 2) -> was a sibling kept when the first child was not
        self.beyond = _Rates()  # pooled: (depth, 0) -> did the path go on past the shape (a grafted branch)
        self.last: tuple[int, float] | None = None  # (arm, the last round's raw reward: paper's r, or tokens/s)
        self.backoff = 1  # pooled: how many times slower than ACCEPT_MEMORY a round of arm "0" fades the outcomes

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
        return self.pulls if self.reward_kind == "paper" else self.weights

    def tokens_per_round(self, arm: int) -> float:
        """pooled: the tokens a round of `arm` is predicted to emit, 1 + the sum over depths d of the chance that
        the path reaches d (the product of each depth's chance to go on, given the shape's width there)."""
        tokens = reach = 1.0
        widths = self.arms[arm].widths
        for depth, width in enumerate(widths, 1):
            first = self.first.rate(depth, 0, FIRST_PRIOR)
            if width >= 2:
                first += (1.0 - first) * self.other.rate(depth, width, OTHER_PRIOR)
            reach *= first
            tokens += reach
        depth = len(widths) + 1
        while widths and (on := self.beyond.rate(depth, 0, BEYOND_PRIOR, shallower=False)):  # a graft goes on
            reach *= on
            tokens += reach
            depth += 1
        return tokens

    def _rates(self) -> list[float | None]:
        """throughput: each arm's tokens per second over all its rounds; pooled: predicted tokens per round over
        the arm's measured seconds per round."""
        if self.reward_kind == "pooled":
            return [self.tokens_per_round(k) * w / max(s, 1e-9) if n else None
                    for k, (s, w, n) in enumerate(zip(self.seconds, self.weights, self.pulls))]
        return [tokens / max(s, 1e-9) if n else None for tokens, s, n in zip(self.reward_sums, self.seconds,
                                                                             self.pulls)]

    def _scale(self, rates: list[float | None] | None = None) -> float:
        """throughput, pooled: the best arm's tokens per second, of `rates` when given (1 for the paper's reward)."""
        if self.reward_kind == "paper":
            return 1.0
        return max((r for r in rates or self._rates() if r is not None), default=0.0) or 1.0

    def means(self) -> list[float | None]:
        if self.reward_kind != "paper":
            rates = self._rates()
            scale = self._scale(rates)
            return [r / scale if r is not None else None for r in rates]
        return [s / n if n else None for s, n in zip(self.reward_sums, self.pulls)]

    def ucb_values(self) -> list[float | None]:
        """Each arm's mean plus its exploration bonus. Pooled, arm "0" gets none: its value is its cost alone, a
        fact about the machine, and trying it teaches nothing about the guesses; when the drafter stops guessing,
        the drafting arms' means fall below it by themselves."""
        if 0 in self.pulls:
            return [None] * len(self.arms)
        counts = self._counts()
        log_t = math.log(max(sum(counts), 1.0))
        bonus = [0.0 if self.reward_kind == "pooled" and not arm.depth else self.lambda_ucb for arm in self.arms]
        return [m + b * math.sqrt(2 * log_t / n) for m, b, n in zip(self.means(), bonus, counts)]

    def select(self) -> int:
        """Untried arms first, in order; then the highest UCB value (ties to the lower index)."""
        if 0 in self.pulls:
            return self.pulls.index(0)
        values = self.ucb_values()
        return max(range(len(values)), key=lambda k: values[k])

    def new_prompt(self) -> None:
        """A new generation starts: pooled, what the drafter's guesses did on earlier text counts for less."""
        for rates in (self.first, self.other, self.beyond):
            rates.scale(NEW_PROMPT_KEEP)
        self.backoff = 1

    def observe(self, arm: int, n_accept: int, depth: int, seconds: float,
                outcomes: Sequence[DepthOutcome] = ()) -> None:
        """Learn from one round of `arm`: it emitted `n_accept` tokens with a tree `depth` deep in `seconds`;
        `outcomes` (`depth_outcomes`, the pooled reward needs them for a drafting arm) what each depth did."""
        if self.reward_kind == "paper":
            self.update(arm, paper_reward(n_accept, depth, self.lambda_gamma))
            return
        if self.reward_kind == "pooled":
            if self.arms[arm].depth and not outcomes:
                raise ValueError("a pooled bandit learns a drafting round from its depth outcomes: pass outcomes")
            self._learn_depths(outcomes)
        discount = COST_DISCOUNT if self.reward_kind == "pooled" else DISCOUNT
        for k in range(len(self.arms)):  # every arm's past fades by one round
            self.reward_sums[k] *= discount
            self.seconds[k] *= discount
            self.weights[k] *= discount
        self.pulls[arm] += 1
        self.weights[arm] += 1.0
        self.reward_sums[arm] += n_accept
        self.seconds[arm] += seconds
        self.last = (arm, n_accept / max(seconds, 1e-9))

    def _learn_depths(self, outcomes: Sequence[DepthOutcome]) -> None:
        """Every round fades what earlier rounds showed (ACCEPT_MEMORY), a round of arm "0" (no outcomes) too, so
        that while no arm drafts the chances drift back to their priors and a drafting arm is tried again: a few
        unlucky rounds do not settle the question for good. But each drafting round that keeps no drafted token
        doubles how many rounds of arm "0" that drift takes (up to IDLE_BACKOFF times), and one that keeps a
        token resets it: on a text the drafter cannot guess, the tries, each a loss, come ever more seldom. A
        drafting round adds its outcomes."""
        fade = ACCEPT_MEMORY if outcomes else ACCEPT_MEMORY ** (1 / self.backoff)
        for rates in (self.first, self.other, self.beyond):
            rates.scale(fade)
        if outcomes:
            self.backoff = 1 if DepthOutcome(*outcomes[0]).kept else min(2 * self.backoff, IDLE_BACKOFF)
        for depth, width, kept, first, chance in (DepthOutcome(*o) for o in outcomes):
            if width == 0:
                self.beyond.add((depth, 0), kept)
                continue
            if width == 1:
                self.first.add((depth, 0), kept if chance is None else chance)
            else:
                self.first.add((depth, 0), first if chance is None else chance)
                if not first:
                    self.other.add((depth, width), kept)

    def update(self, arm: int, reward: float) -> None:
        """Add one scalar reward to `arm` (the paper's reward; `observe` is the engine's entry point)."""
        if self.reward_kind != "paper":
            raise ValueError("a throughput bandit learns from rounds' tokens and seconds: use observe()")
        self.pulls[arm] += 1
        self.reward_sums[arm] += reward
        self.last = (arm, reward)

    def snapshot(self, chosen: int) -> BanditSnapshot:
        stats = [ArmStat(a.name, n, m, u) for a, n, m, u in zip(self.arms, self.pulls, self.means(), self.ucb_values())]
        last_reward = self.last[1] / self._scale() if self.last else None
        return BanditSnapshot(stats, chosen, self.reward_kind, last_reward)
