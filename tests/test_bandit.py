import math
import random

import pytest

from specdec import bandit as bandit_module
from specdec.bandit import ACCEPT_MEMORY, DISCOUNT, NEW_PROMPT_KEEP, UCBBandit, depth_outcomes, paper_reward
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


DEAR, CHEAP = (0.3, 0.08), (0.04, 0.05)  # a machine's cost of verifying a node and of drafting a level, in steps


def test_depth_outcomes_follow_the_accepted_path():
    """A (2,1) tree with a copied branch grafted under node 3, past the shape: nodes 5 and 6."""
    parents = [-1, 0, 0, 1, 2, 3, 5]
    assert depth_outcomes(parents, [0, 1, 3, 5], (2, 1)) == [(1, 2, True, True, None), (2, 1, True, True, None),
                                                              (3, 0, True, True, None), (4, 0, False, False, None)]
    assert depth_outcomes(parents, [0, 2], (2, 1)) == [(1, 2, True, False, None), (2, 1, False, False, None)]
    assert depth_outcomes(parents, [0], (2, 1)) == [(1, 2, False, False, None)]
    assert depth_outcomes([-1], [0], (2, 1)) == [(1, 2, False, False, None)]  # trimmed to its root: a failure
    assert depth_outcomes([-1], [0], ()) == []  # arm "0": nothing drafted, nothing learnt


def test_depth_outcomes_carry_the_first_childs_chance_where_it_is_alone_or_has_drafted_siblings():
    parents = [-1, 0, 0, 1, 2, 3, 5]  # as above: (2,1) with a copied branch grafted under node 3
    outcomes = depth_outcomes(parents, [0, 1, 3, 5], (2, 1), [0.4, 0.3, 0.9, 0.0])
    assert [o.chance for o in outcomes] == [0.4, 0.3, 0.9, 0.0]
    chain_with_copy = [-1, 0, 0]  # width 1, and a copied sibling at depth 1: the coin, not the drafted child's chance
    assert depth_outcomes(chain_with_copy, [0, 2], (1,), [0.4, 0.0])[0].chance is None


def test_under_sampling_the_pooled_bandit_learns_the_chance_not_the_coin():
    """A round whose first drafted token was rejected, though it had a 0.6 chance: the bandit that reads the
    chance counts 0.6 kept, not 0 (FIRST_PRIOR 0.5 over one round: 0.55 against 0.25)."""
    shape = parse_arms("3")[0]
    coin, chance = (UCBBandit(parse_arms("0; 3")) for _ in range(2))
    coin.observe(1, 1, 3, 0.05, depth_outcomes(shape.parents, [0], shape.widths))
    chance.observe(1, 1, 3, 0.05, depth_outcomes(shape.parents, [0], shape.widths, [0.6]))
    assert coin.first.rate(1, 0, bandit_module.FIRST_PRIOR) == pytest.approx(0.25)
    assert chance.first.rate(1, 0, bandit_module.FIRST_PRIOR) == pytest.approx(0.55)


def test_reading_the_chance_keeps_the_bandit_off_arm_0_when_drafting_pays_a_little():
    """Each first guess kept with probability 0.3 on the stand-in machine: drafting pays about 10%, but ten
    rounds of coins often say otherwise, and the bandit spends rounds on arm "0". Learning from the chance each
    guess had (what the engine passes under sampling) it spends far fewer, and is at least as fast."""
    coins = [_run(GenerationConfig(method="mamba-ucb"), [(0.3, CHEAP)], seed, prompt_rounds=50)
             for seed in (1, 2, 3, 4)]
    chances = [_run(GenerationConfig(method="mamba-ucb"), [(0.3, CHEAP)], seed, prompt_rounds=50, chances=True)
               for seed in (1, 2, 3, 4)]
    idle = [sum(chosen.count(0) for chosen, _ in runs) for runs in (coins, chances)]
    assert idle[1] < idle[0] / 2, idle
    assert sum(speed for _, (speed,) in chances) >= sum(speed for _, (speed,) in coins), (coins, chances)


def test_pooled_predicts_each_shapes_tokens_from_every_drafting_round():
    """The chance to go on at each depth is learnt from rounds of any shape, with a prior (FIRST_PRIOR: 0.5 over
    one round; OTHER_PRIOR: 0.2 over one) and older drafting rounds weighed by ACCEPT_MEMORY; a shape's tokens per
    round are 1 + the chances of reaching each of its depths."""
    bandit = UCBBandit(parse_arms("0; 2; 2,1"), reward_kind="pooled")
    bandit.observe(0, 1, 0, 0.05, depth_outcomes([-1], [0], ()))  # the engine's outcomes of a plain step
    assert bandit.first.counts == bandit.beyond.counts == {}  # a plain step says nothing about the drafter
    bandit.observe(1, 2, 2, 0.06, [(1, 1, True, True), (2, 1, False, False)])
    assert bandit.tokens_per_round(1) == pytest.approx(1 + 0.75 + 0.75 * 0.25)  # depth 1: 1.5 / 2; depth 2: 0.5 / 2
    assert bandit.tokens_per_round(2) == pytest.approx(1 + 0.8 + 0.8 * 0.25)  # two children: 0.75 + 0.25 * 0.2
    bandit.observe(2, 2, 2, 0.07, [(1, 2, True, False), (2, 1, False, False)])  # the second child kept
    m = ACCEPT_MEMORY
    first1, first2, other1 = (m + 0.5) / (m + 1 + 1), 0.5 / (m + 1 + 1), (1 + 0.2) / (1 + 1)
    reach1 = first1 + (1 - first1) * other1
    assert bandit.tokens_per_round(2) == pytest.approx(1 + reach1 + reach1 * first2)
    assert bandit.tokens_per_round(0) == 1.0
    rates = [bandit.tokens_per_round(k) / s for k, s in enumerate((0.05, 0.06, 0.07))]
    assert bandit.means() == pytest.approx([r / max(rates) for r in rates])
    bandit.new_prompt()  # earlier text counts for less: the chances move toward the priors
    assert bandit.first.counts[(1, 0)] == pytest.approx([(m + 1) * NEW_PROMPT_KEEP, m * NEW_PROMPT_KEEP])
    with pytest.raises(ValueError, match="outcomes"):
        bandit.observe(1, 1, 2, 0.06)


def _stand_in_round(shape, keep: float, machine: tuple[float, float], rng: random.Random,
                    chances: bool = False) -> tuple[int, float, list]:
    """One round of a stand-in engine: (tokens emitted, seconds, depth outcomes). A target step takes 50 ms;
    verifying a tree costs more per node and drafting costs per level (`machine`, in steps); each level's first
    guess is kept with probability `keep` (the text: how well the drafter guesses it). With `chances` the
    outcomes carry that probability too, as the engine's do under sampling."""
    per_node, per_level = machine
    depth = 0
    while depth < shape.depth and rng.random() < keep:
        depth += 1
    seconds = 0.05 * (1 + per_node * shape.num_drafted + per_level * shape.depth)
    parents, path = shape.parents, [0]
    for _ in range(depth):  # down the first child of each level
        path.append(parents.index(path[-1]))
    first_chances = [keep if node in parents else 0.0 for node in path]  # a leaf has no child to keep
    outcomes = depth_outcomes(parents, path, shape.widths, first_chances if chances else None) if shape.depth else []
    return depth + 1, seconds * rng.uniform(0.9, 1.1), outcomes  # the machine's timing noise


def _run(config: GenerationConfig, phases: list[tuple[float, tuple[float, float]]], seed: int = 1,
         prompt_rounds: int | None = None, chances: bool = False) -> tuple[list[int], list[float]]:
    """The bandit of `config` on the stand-in engine, one phase of 200 rounds per (keep, machine), a new prompt
    every `prompt_rounds` rounds. -> (the arm of every round, each phase's tokens per second over the target
    alone's)."""
    rng, bandit, chosen, speed = random.Random(seed), UCBBandit.for_config(config), [], []
    for keep, machine in phases:
        tokens = seconds = 0.0
        for _ in range(200):
            if prompt_rounds and chosen and len(chosen) % prompt_rounds == 0:
                bandit.new_prompt()
            arm = bandit.select()
            emitted, took, outcomes = _stand_in_round(bandit.arms[arm], keep, machine, rng, chances)
            bandit.observe(arm, emitted, bandit.arms[arm].depth, took, outcomes)
            chosen.append(arm)
            tokens, seconds = tokens + emitted, seconds + took
        speed.append(tokens / seconds * 0.05)  # the target alone: one token per 50 ms step
    return chosen, speed


@pytest.mark.parametrize("reward", ["pooled", "throughput"])
def test_a_bandit_that_counts_seconds_never_loses_much_to_the_target_alone(reward):
    """With the default arms (0; 3; 2,1,1; 2,1,1,1), on a stand-in machine where verification is dear, so that
    drafting never pays although each drafted token is often kept, the bandit keeps near the target alone's speed
    (what it loses is exploration); where drafting pays it drafts. The paper's reward, which counts target passes
    per token and not what they cost, keeps drafting at a loss."""
    ours, paper = [], []
    for seed in (1, 2, 3, 4):
        config = GenerationConfig(method="mamba-ucb", reward=reward)
        chosen, (loses,) = _run(config, [(0.55, DEAR)], seed)
        assert chosen.count(0) > 80 and loses > 0.8, seed
        chosen, (pays,) = _run(config, [(0.8, CHEAP)], seed)
        assert chosen[30:].count(0) < 20 and pays > 1.8, seed
        ours.append(loses)
        chosen, (loses,) = _run(GenerationConfig(method="mamba-ucb", reward="paper"), [(0.55, DEAR)], seed)
        assert chosen.count(0) < 40, seed
        paper.append(loses)
    assert sum(paper) / 4 < sum(ours) / 4 - 0.08  # the control: counting passes, not seconds, costs speed here


def test_the_pooled_bandit_follows_the_text_at_hand_faster():
    """A session-long bandit on one machine, a new prompt every 50 rounds: the drafter guesses the text well for
    200 rounds, then hardly ever (a text it cannot guess: every drafting arm loses), then well again. Both
    bandits that count seconds move to arm 0 and back; the pooled one, which learns how the guesses fare from
    every drafting round whatever its shape, moves sooner and loses less meanwhile (each with its default
    λ_UCB)."""
    phases = [(0.8, CHEAP), (0.1, CHEAP), (0.8, CHEAP)]
    lost = {}
    for reward in ("pooled", "throughput"):
        lost[reward] = []
        for seed in (1, 2, 3, 4):
            chosen, (first, loses, again) = _run(GenerationConfig(method="mamba-ucb", reward=reward), phases, seed,
                                                 prompt_rounds=50)
            assert first > 1.8 and again > 1.8 and chosen[250:400].count(0) > 60, (reward, seed)
            lost[reward].append(1 - loses)
    assert all(x < 0.10 for x in lost["pooled"]), lost  # 0.08-0.10, against 0.12-0.14
    assert sum(lost["pooled"]) < 0.8 * sum(lost["throughput"]), lost


def test_the_pooled_bandit_tries_ever_more_seldom_on_a_text_it_cannot_guess(monkeypatch):
    """A drafter that never guesses (a new prompt every 50 rounds): every drafting round is a loss, so what the
    bandit loses to the target alone is its tries. Each try that keeps nothing makes the fade that leads to the
    next one slower (IDLE_BACKOFF): it loses about 5%, against about 9% with the fade at one pace."""
    def lost() -> list[float]:
        return [1 - _run(GenerationConfig(method="mamba-ucb"), [(0.0, CHEAP)], seed, prompt_rounds=50)[1][0]
                for seed in (1, 2, 3, 4)]

    backing_off = lost()
    monkeypatch.setattr(bandit_module, "IDLE_BACKOFF", 1)
    one_pace = lost()
    assert all(x < 0.07 for x in backing_off), backing_off  # 0.049-0.064
    assert sum(backing_off) < 0.75 * sum(one_pace), (backing_off, one_pace)  # 0.090-0.096


class _FrozenWhileIdle(UCBBandit):
    """The pooled bandit without the fade on rounds of arm "0": the control of the test below."""

    def _learn_depths(self, outcomes) -> None:
        if outcomes:
            super()._learn_depths(outcomes)


def test_the_pooled_bandit_recovers_from_unlucky_first_rounds():
    """Drafting pays a little (a chain of 3 whose first guesses are kept with probability 0.3: about 1.1 times
    the target alone), but the first three drafting rounds keep nothing, so the chances learnt from them say
    drafting loses. Rounds of arm "0" fade them back toward the priors (ACCEPT_MEMORY), so the bandit tries
    drafting again and mostly keeps to it, sooner than the same bandit without the fade."""
    def drafted(kind: type[UCBBandit]) -> float:
        counts = []
        for seed in range(10):
            rng, chosen = random.Random(seed), []
            bandit = kind.for_config(GenerationConfig(method="mamba-ucb", arms="0; 3"))
            for _ in range(300):
                arm = bandit.select()
                shape = bandit.arms[arm]
                emitted, took, outcomes = _stand_in_round(shape, 0.0 if sum(chosen) < 3 else 0.3, CHEAP, rng)
                bandit.observe(arm, emitted, shape.depth, took, outcomes)
                chosen.append(arm)
            counts.append(chosen[100:].count(1))
        return sum(counts) / len(counts)

    faded, frozen = drafted(UCBBandit), drafted(_FrozenWhileIdle)
    assert faded > 130 and faded > frozen + 40, (faded, frozen)  # about 158 against 78


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


class _ExploresArm0(UCBBandit):
    """The pooled bandit as it was before arm "0" lost its exploration bonus, at λ_UCB 0.1: the control below."""

    def ucb_values(self) -> list[float | None]:
        if 0 in self.pulls:
            return [None] * len(self.arms)
        counts = self._counts()
        log_t = math.log(max(sum(counts), 1.0))
        return [m + 0.1 * math.sqrt(2 * log_t / n) for m, n in zip(self.means(), counts)]


def test_the_pooled_bandit_does_not_explore_arm_0_where_drafting_pays_a_little(monkeypatch):
    """Each first guess kept with probability 0.3 or 0.4 (drafting pays 10-25% on the stand-in machine): with no
    exploration bonus on arm "0", whose value is its cost alone, the bandit spends far fewer rounds on it and is
    faster; on a text it cannot guess at all it still keeps near the target alone's speed."""
    def runs(kind: type[UCBBandit], keep: float) -> list[tuple[list[int], list[float]]]:
        monkeypatch.setattr(bandit_module.UCBBandit, "for_config", classmethod(
            lambda cls, config: kind(config.shapes(), config.lambda_ucb, config.reward, config.lambda_gamma)))
        return [_run(GenerationConfig(method="mamba-ucb"), [(keep, CHEAP)], seed, prompt_rounds=50)
                for seed in range(8)]

    for keep in (0.3, 0.4):
        now, before = runs(UCBBandit, keep), runs(_ExploresArm0, keep)
        idle = [sum(chosen.count(0) for chosen, _ in r) for r in (now, before)]
        speed = [sum(s for _, (s,) in r) / len(r) for r in (now, before)]
        assert idle[0] < 0.7 * idle[1] and speed[0] > speed[1] + 0.01, (keep, idle, speed)  # 0.3: 174 vs 432 rounds
    assert all(s > 0.93 for _, (s,) in runs(UCBBandit, 0.0))  # 0.956 on average
