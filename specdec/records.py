"""Plain records the engine yields: one `RoundRecord` per draft-verify round, then one `Summary`.

These are the only things the UI, the CLI and the benchmark see of a generation. They hold Python
scalars, strings and lists (no tensors), so they serialise with `dataclasses.asdict` + `json.dumps`.

Glossary (docs/method.md): `q` drafter probability, `p` target probability, `γ` tree depth,
`T = (N1, ..., Nγ)` tree shape, "bonus" the target token after an accepted leaf, "correction" the
target token sampled from the residual after every child of a node was rejected.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Literal

NodeStatus = Literal["root", "accepted", "rejected", "not_reached"]
TokenSource = Literal["draft", "correction", "bonus"]


@dataclass
class TreeNode:
    """One node of a round's draft tree. Node 0 is the root: the last token already emitted."""

    index: int
    token_id: int
    text: str
    parent: int  # index of the parent node, -1 for the root
    depth: int  # 0 for the root, 1..γ for drafted nodes
    q: float  # drafter probability of this token at its parent (1.0 for the root)
    p: float  # target probability of this token at its parent (1.0 for the root)
    status: NodeStatus
    copied: bool = False  # proposed by prompt lookup (copied from the context), not drafted by the model
    drafted_as: list[str] | None = None  # a drafter of another tokenizer: the text of its own tokens whose branch
    # added this node, one piece per token


@dataclass
class EmittedToken:
    token_id: int
    text: str  # the text this token adds to the output (incremental detokenisation)
    source: TokenSource


@dataclass
class ArmStat:
    name: str  # the tree shape, e.g. "(2,2,1)" or "chain 4"
    pulls: int
    mean_reward: float | None  # None until the arm is pulled
    ucb: float | None  # None until every arm has been pulled once (unpulled arms are tried first)


@dataclass
class BanditSnapshot:
    arms: list[ArmStat]
    chosen: int  # index into `arms` of the arm used this round
    reward_kind: str  # "pooled", "throughput" or "paper"
    last_reward: float | None = None  # reward credited to `chosen` after this round


@dataclass
class RoundRecord:
    """Everything that happened in one round."""

    index: int  # 0-based round number
    shape: list[int]  # tree shape (N1, ..., Nγ) actually drafted; [] for a target-only step
    shape_name: str
    nodes: list[TreeNode]  # the draft tree, node 0 is the root
    emitted: list[EmittedToken]  # accepted draft tokens, then one correction or bonus token
    accepted_len: int  # number of drafted tokens accepted this round (emitted minus the target's token)
    draft_ms: float
    verify_ms: float
    round_ms: float
    new_tokens_total: int  # tokens emitted so far in this generation
    elapsed_s: float  # the generation's own seconds so far (after prefill; not the consumer's between rounds)
    rss_bytes: int  # resident memory of this process
    cuda_allocated_bytes: int | None  # None on CPU
    cuda_peak_bytes: int | None
    drafter_state_bytes: int  # Mamba: state buffers; Transformer drafter: its KV cache; else 0
    target_kv_bytes: int
    bandit: BanditSnapshot | None = None
    drafter_read_target: bool = False  # the drafter read the target's hidden state (mamba-feat)
    mapping_ms: float | None = None  # time spent mapping between two tokenizers (a drafter with its own), in round_ms

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Summary:
    """Totals for one generation, yielded after the last round."""

    method: str
    text: str
    token_ids: list[int]  # the new tokens only
    new_tokens: int
    rounds: int
    prefill_ms: float  # the target's pass over the prompt
    seconds: float  # the rounds' own time: excludes prefill, each record's display work, and the time the
    # consumer spent between rounds (`generate` is a generator)
    tokens_per_s: float
    mean_accepted_len: float  # tokens emitted per round, the target's own token included
    acceptance_rate: float | None  # accepted / tested draft positions (None when nothing was drafted)
    drafted_tokens: int  # tree nodes drafted over the whole run
    stop_reason: Literal["max_new_tokens", "eos", "stopped"]
    accepted_tokens: int = 0  # drafted tokens accepted over the run
    tested_positions: int = 0  # tree depths at which the target tested a drafted token
    drafter_start_ms: float = 0.0  # the drafter's own reading of the prompt (its state or cache), after the prefill
    extra: dict = field(default_factory=dict)

    @property
    def engine_seconds(self) -> float:
        """The engine's own time for the whole run: the prompt's pass, the drafter's start and the rounds (what
        `bench` times, less the setup); the time a consumer spent between rounds is not in it."""
        return (self.prefill_ms + self.drafter_start_ms) / 1e3 + self.seconds

    @property
    def engine_tokens_per_s(self) -> float:
        return self.new_tokens / self.engine_seconds if self.engine_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def depth_reached(rounds: Iterable[tuple[int, int]]) -> list[float]:
    """Acceptance by depth, from (depth drafted, drafted tokens accepted) per round: for d = 1, 2, ..., the share of
    the rounds that drafted at least d deep whose accepted path reached depth d. The first entry is how often the
    first drafted token is right; where the list falls off is where a tree stops paying for its depth."""
    drafted: list[int] = []
    reached: list[int] = []
    for depth, accepted in rounds:
        for d in range(depth):
            if d == len(drafted):
                drafted.append(0)
                reached.append(0)
            drafted[d] += 1
            reached[d] += accepted > d
    return [r / n for r, n in zip(reached, drafted)]
