"""Generation settings and the named methods (drafter kind + tree policy) the CLI, app and benchmark offer.

Importable without torch: the app's page reads its defaults from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.registry import KINDS, POLICY_TEXT
from specdec.tree import MAX_DEPTH, TreeShape, parse_arms, parse_shape

MAX_NEW_TOKENS = 4096
MAX_SEED = 2**63 - 1  # torch generators take seeds up to this


@dataclass(frozen=True)
class Method:
    drafter: str  # a kind of `specdec.registry.KINDS`
    policy: str  # "none" | "chain" | "tree" | "ucb"
    default_tree: str | None
    description: str

    @property
    def has_model(self) -> bool:
        """Whether the drafter is a trained model, not prompt lookup or nothing."""
        return KINDS[self.drafter].has_model


# Default shapes are sized for a CPU, where a verification pass grows with the tree (`python -m specdec bench
# --cost-curve 400,2000`, docs/benchmarks.md); "0" is a plain target step, for when drafting does not pay. The
# rewards span about 1; λ_UCB is 0.3 where each arm learns from its own rounds alone, 0.1 for the pooled reward,
# whose values are steadier (docs/method.md, "Choose the next tree shape"); the arms were chosen with fixed-shape
# runs, e.g. `python -m specdec bench --methods "ar,mamba-tree:3,mamba-tree:2;1;1,mamba-tree:2;1;1;1"`.
DEFAULT_ARMS = "0; 3; 2,1,1; 2,1,1,1"
# Under sampling a second child is kept less often than a deeper first guess, and a wider tree pays for rows that
# add little: given the tree arms too, the bandit ran slower than with chains only, with siblings drawn
# independently and without replacement alike (docs/benchmarks.md, "The bandit against fixed shapes" and "#54's
# figures after siblings without replacement").
DEFAULT_SAMPLING_ARMS = "0; 3; 4"


def default_arms(temperature: float) -> str:
    """The `*-ucb` arms when none are given: `DEFAULT_ARMS` under greedy decoding, else `DEFAULT_SAMPLING_ARMS`."""
    return DEFAULT_ARMS if temperature == 0 else DEFAULT_SAMPLING_ARMS


DEFAULT_TREES = {"chain": "4", "tree": "2,1,1", "ucb": None, "none": None}


def build_methods() -> dict[str, Method]:
    """One method per (drafter kind, policy) of the registry, "ar" first."""
    methods = {}
    for kind in sorted(KINDS.values(), key=lambda k: bool(k.policies)):  # "ar" first
        for name, policy in kind.methods.items():
            text = kind.summary if policy == "none" or len(kind.methods) == 1 else \
                f"{kind.summary}, {POLICY_TEXT[policy]}"
            methods[name] = Method(kind.name, policy, DEFAULT_TREES[policy], text)
    return methods


METHODS: dict[str, Method] = build_methods()

# Trimming by the drafter's confidence (docs/method.md, "Trim the tree by confidence"): the drafter's q predicts
# acceptance closely, so the expected tokens a node adds are its branch probability (q along its branch).
# Greedy decoding drops a drafted child below MIN_BRANCH_Q: a node costs a verification row it rarely repays.
# A node's children are drafted only from MIN_EXPAND_Q: a level costs a drafter step, a tenth of a target step
# or so on a CPU, which a child of a node less likely than this rarely repays.
MIN_BRANCH_Q = 0.05
MIN_EXPAND_Q = 0.3
WHOLE_SHAPES = {"min_branch_q": 0.0, "min_expand_q": 0.0}  # GenerationConfig(**WHOLE_SHAPES): no trimming
LOOKUP_BRANCH = 6  # tokens of a prompt-lookup branch, when one is asked for without a length
REWARDS = ("pooled", "throughput", "paper")
LAMBDA_UCB = {"pooled": 0.05, "throughput": 0.3, "paper": 0.3}  # each reward's default λ_UCB
BANDIT_SCOPES = ("session", "prompt")  # one bandit for a whole session (or benchmark run), or one per prompt


@dataclass
class GenerationConfig:
    method: str = "mamba-ucb"
    tree: str | None = None  # overrides the method's shape: "4" (chain) or "3,2,1"
    arms: str | None = None  # bandit arms for `*-ucb`, e.g. "4; 2,2,1; 3,1,1"
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    max_new_tokens: int = 128
    seed: int = 0
    lambda_ucb: float | None = None  # λ_UCB, weight of the exploration term; None: the reward's (LAMBDA_UCB)
    lambda_gamma: float = 0.1  # λ_γ, depth penalty of the paper's reward
    reward: str = "pooled"  # "pooled" or "throughput" (the round's measured cost counts), or "paper"
    lookup_branch: int = 0  # mamba-*/tf-*: graft up to this many tokens copied from the context onto each tree
    min_branch_q: float = MIN_BRANCH_Q  # greedy: drop a drafted child whose branch probability is below this
    min_expand_q: float = MIN_EXPAND_Q  # draft a node's children only from this branch probability (both 0: whole)

    def __post_init__(self) -> None:
        if self.lambda_ucb is None:
            self.lambda_ucb = LAMBDA_UCB.get(self.reward, 0.0)  # an unknown reward is refused by `validate`

    @property
    def spec(self) -> Method:
        return METHODS[self.method]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> GenerationConfig:
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if not isinstance(self.max_new_tokens, int) or not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise ValueError(f"max_new_tokens must be an integer from 1 to {MAX_NEW_TOKENS}, got {self.max_new_tokens}")
        if not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"the seed must be a whole number from 0 to {MAX_SEED}, got {self.seed}")
        if not 0.0 <= self.temperature <= 5.0:
            raise ValueError(f"temperature must be between 0 and 5, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.lambda_ucb < 0 or self.lambda_gamma < 0:
            raise ValueError("lambda_ucb and lambda_gamma must be >= 0")
        if not isinstance(self.lookup_branch, int) or not 0 <= self.lookup_branch <= MAX_DEPTH:
            raise ValueError(f"lookup_branch must be an integer from 0 to {MAX_DEPTH}, got {self.lookup_branch}")
        if not 0.0 <= self.min_branch_q < 1.0:
            raise ValueError(f"min_branch_q must be in [0, 1), got {self.min_branch_q}")
        if not 0.0 <= self.min_expand_q <= 1.0:
            raise ValueError(f"min_expand_q must be in [0, 1], got {self.min_expand_q}")
        if self.reward not in REWARDS:
            raise ValueError(f"reward must be one of {', '.join(REWARDS)}, got {self.reward!r}")
        arms = self.shapes()
        if self.spec.drafter == "lookup" and any(not a.is_chain for a in arms):  # a point mass has no siblings
            raise ValueError("prompt lookup drafts one deterministic chain; give a chain length such as '4'")
        return self

    @property
    def grafts_lookup(self) -> bool:
        """Whether each drafted tree gets a prompt-lookup branch (neural drafters only)."""
        return self.lookup_branch > 0 and self.spec.has_model

    def shapes(self) -> list[TreeShape]:
        """The tree shapes this run may use: one for fixed policies, the bandit's arms for `*-ucb`."""
        spec = self.spec
        if spec.policy == "none":
            return [TreeShape(())]
        if spec.policy == "ucb":
            return parse_arms(self.arms or default_arms(self.temperature))
        shape = parse_shape(self.tree or spec.default_tree)
        if shape.depth == 0:
            raise ValueError("the tree shape must draft at least one token; use method 'ar' for target-only decoding")
        if spec.policy == "chain" and not shape.is_chain:
            raise ValueError(f"method {self.method} drafts a chain; give a chain length such as '4' "
                             "or use a *-tree method")
        return [shape]
