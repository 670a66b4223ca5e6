"""The speculative decoding loop: draft a tree, verify it in one target pass, accept, catch up, repeat.

`generate` yields one `RoundRecord` per round and then a `Summary`; it knows nothing of its consumers. It reads
as a ladder: `_setup` (settings against the models), `_prefill`, then per round `_round` (the timed work) and
`_record` (what the display needs), and last `_summary`.
The target's KV cache holds every emitted token except the last one, `x`, which is the root of the next
tree: a round feeds `[x] + tree` to the target with a tree attention mask, so `p` is known at every node.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import psutil
import torch

from specdec import registry
from specdec.bandit import UCBBandit, depth_outcomes
from specdec.config import GenerationConfig
from specdec.drafters import Drafter, DraftTree, LookupBranch, Sampler
from specdec.verify import TreeLM
from specdec.models import LoadedModel, Models
from specdec.records import EmittedToken, RoundRecord, Summary, TreeNode
from specdec.sampling import Acceptance, accept_greedy, accept_sampling, first_child_chances, logits_to_probs
from specdec.tree import TreeShape


def encode_prompt(tokenizer, prompt: str, chat: bool = True) -> list[int]:
    """Wrap the prompt in the target's chat template (when it has one) and tokenize it."""
    if not prompt or not prompt.strip():
        raise ValueError("the prompt is empty")
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    return tokenizer(prompt)["input_ids"]


def make_drafter(models: Models, kind: str) -> Drafter:
    """A fresh drafter of `kind` (`specdec.registry.KINDS`) for one generation."""
    spec = registry.kind(kind)
    loaded = models.drafter(kind) if spec.has_model else None
    return spec.implementation_class().build(loaded, models.target, models.cuda_graphs)


def make_verifier(model) -> TreeLM:
    """The target's tree verifier."""
    return TreeLM(model)


class Detokenizer:
    """Incremental detokenisation: the text each new token adds (byte-level BPE pieces join correctly)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.ids, self.text = tokenizer, [], ""

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            return ""
        piece, self.text = text[len(self.text):], text
        return piece


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _memory(device: torch.device) -> tuple[int, int | None, int | None]:
    rss = psutil.Process().memory_info().rss
    if device.type == "cuda":
        return rss, torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device)
    return rss, None, None


@dataclass
class _Generation:
    """What one generation holds from its set-up to its summary."""

    config: GenerationConfig
    target: LoadedModel
    prompt_ids: list[int]
    shapes: list[TreeShape]
    drafter: Drafter
    drafter_label: str
    verifier: TreeLM
    bandit: UCBBandit | None
    sampler: Sampler  # its generator draws every random choice of the generation
    detok: Detokenizer
    eos_ids: set[int]
    new_ids: list[int] = field(default_factory=list)
    rounds: int = 0
    accepted: int = 0
    tested: int = 0
    drafted: int = 0
    seconds: float = 0.0  # the generation's own time since the first round (not the consumer's between rounds)
    stop_reason: str = "max_new_tokens"


@dataclass
class _Round:
    """One round's outcome, before it is dressed as a `RoundRecord` for display."""

    arm: int
    tree: DraftTree
    acc: Acceptance
    logits: torch.Tensor  # [n, V]
    p: torch.Tensor | None  # [n, V] the target's distribution, when acceptance needed it (sampling)
    emitted: list[EmittedToken]
    draft_s: float
    verify_s: float
    round_s: float


def _setup(models: Models, prompt: str, config: GenerationConfig, chat: bool,
           bandit: UCBBandit | None) -> _Generation:
    """Check the settings against the models, and make the drafter, verifier and bandit of one generation."""
    config.validate()
    target = models.target
    prompt_ids = encode_prompt(target.tokenizer, prompt, chat)
    shapes = config.shapes()
    if max((w for s in shapes for w in s.widths), default=1) > target.vocab_size:
        raise ValueError(f"a tree is wider than the vocabulary ({target.vocab_size} tokens)")
    drafter = make_drafter(models, config.spec.drafter).for_decoding(config.greedy)
    label = models.drafter(config.spec.drafter).name if config.spec.has_model else config.spec.drafter
    if config.grafts_lookup:
        drafter, label = LookupBranch(drafter, config.lookup_branch), f"{label}+lookup"
    max_depth = max([s.depth for s in shapes] + [config.lookup_branch if config.grafts_lookup else 0])
    limits = [getattr(target.model.config, "max_position_embeddings", None), drafter.max_context]
    limit = min((x for x in limits if x), default=None)
    if limit and len(prompt_ids) + config.max_new_tokens + max_depth + 1 > limit:
        raise ValueError(f"the prompt has {len(prompt_ids)} tokens; with max_new_tokens={config.max_new_tokens} "
                         f"it exceeds the context of {limit} tokens")
    if config.spec.policy != "ucb":
        bandit = None
    elif bandit is None:
        bandit = UCBBandit.for_config(config)
    elif not bandit.matches(config):
        raise ValueError("the bandit passed in was made for other arms or reward settings")
    else:
        bandit.new_prompt()
    eos = target.model.generation_config.eos_token_id
    generator = torch.Generator(device=target.device).manual_seed(config.seed)
    sampler = Sampler(config.temperature, config.top_p, generator, config.min_branch_q, config.min_expand_q)
    return _Generation(config, target, prompt_ids, shapes, drafter, label, make_verifier(target.model), bandit,
                       sampler, Detokenizer(target.tokenizer),
                       set(eos if isinstance(eos, list) else [eos] if eos is not None else []))


def _prefill(g: _Generation) -> tuple[float, float]:
    """The prompt into the target's cache and the drafter's state; its last token is the first round's root.

    -> (the target's prefill, the drafter's start) in ms."""
    t0 = time.perf_counter()
    if len(g.prompt_ids) > 1:
        g.verifier.prefill(g.prompt_ids[:-1])
    _sync(g.target.device)
    t1 = time.perf_counter()
    g.drafter.start(g.prompt_ids, max(s.num_drafted for s in g.shapes), g.verifier.hidden)  # hidden: prompt[:-1]
    _sync(g.target.device)
    return (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3


def _accept(tree: DraftTree, logits: torch.Tensor, config: GenerationConfig, generator: torch.Generator,
            p: torch.Tensor | None) -> Acceptance:
    if config.greedy:
        # `max` rather than `argmax`: the same first maximal index, and cheaper over a large vocabulary
        return accept_greedy(tree.tokens, tree.parents, logits.max(-1).indices.tolist())
    q = tree.q.to(p.device) if tree.q is not None else None
    return accept_sampling(tree.tokens, tree.parents, p, q, generator, tree.point)


def _round(g: _Generation) -> _Round:
    """Draft a tree, verify it in one target pass, accept, catch both models up, and credit the bandit."""
    device, config = g.target.device, g.config
    arm = g.bandit.select() if g.bandit else 0
    t_round = time.perf_counter()
    tree = g.drafter.draft(g.shapes[arm], g.sampler)
    _sync(device)
    t_draft = time.perf_counter()
    logits = g.verifier.extend(tree.tokens, tree.parents)  # [n, V]: one pass over root + tree
    p = None if config.greedy else logits_to_probs(logits, config.temperature, config.top_p)  # [n, V]
    _sync(device)
    t_verify = time.perf_counter()
    acc = _accept(tree, logits, config, g.sampler.generator, p)
    g.verifier.commit(acc.path)
    g.drafter.commit(acc.path, acc.next_token, features=g.verifier.hidden[acc.path])  # root, then accepted nodes
    _sync(device)

    drafted_new = [tree.tokens[i] for i in acc.path[1:]]
    emitted_ids = (drafted_new + [acc.next_token])[: config.max_new_tokens - len(g.new_ids)]
    if g.eos_ids & set(emitted_ids):
        emitted_ids = emitted_ids[: next(i for i, t in enumerate(emitted_ids) if t in g.eos_ids) + 1]
        g.stop_reason = "eos"
    source = "bonus" if acc.is_bonus else "correction"
    emitted = [EmittedToken(t, g.detok.add(t), "draft" if i < len(drafted_new) else source)
               for i, t in enumerate(emitted_ids)]
    g.new_ids.extend(emitted_ids)
    round_s = time.perf_counter() - t_round
    if g.bandit:
        chances = None if config.greedy else first_child_chances(tree.tokens, tree.parents, acc.path, p,
                                                                   tree.q, tree.point)
        g.bandit.observe(arm, len(emitted_ids), tree.shape.depth, round_s,
                         depth_outcomes(tree.parents, acc.path, tree.shape.widths, chances))
    g.rounds += 1
    g.accepted += len(acc.path) - 1
    g.tested += acc.tested_depths
    g.drafted += len(tree.tokens) - 1
    return _Round(arm, tree, acc, logits, p, emitted, t_draft - t_round, t_verify - t_draft, round_s)


def _tree_nodes(r: _Round, config: GenerationConfig, tokenizer) -> list[TreeNode]:
    """The round's tree for display: each node's text, q and p, and whether it was accepted."""
    tree, acc = r.tree, r.acc
    accepted, rejected = set(acc.path), set(acc.rejected)
    parents = tree.parents
    rows = torch.tensor(parents[1:], dtype=torch.long, device=r.logits.device)
    cols = torch.tensor(tree.tokens[1:], dtype=torch.long, device=r.logits.device)
    p = r.p if r.p is not None else logits_to_probs(r.logits, config.temperature, config.top_p)  # greedy: for show
    p_tok = [1.0] + p[rows, cols].tolist()  # one gather: p of each node's token at its parent
    nodes = []
    for i, token in enumerate(tree.tokens):
        status = "root" if i == 0 else "accepted" if i in accepted else "rejected" if i in rejected else "not_reached"
        depth = 0 if i == 0 else nodes[parents[i]].depth + 1
        nodes.append(TreeNode(i, token, tokenizer.decode([token]), parents[i], depth, tree.q_tok[i], p_tok[i], status,
                              copied=bool(tree.point and tree.point[i]),
                              drafted_as=tree.sources[i] if tree.sources else None))
    return nodes


def _record(g: _Generation, r: _Round, details: bool) -> RoundRecord:
    """The round as the UI sees it (display work: not part of the generation's timed work)."""
    rss, cuda_alloc, cuda_peak = _memory(g.target.device)
    tree = r.tree
    return RoundRecord(
        index=g.rounds - 1, shape=list(tree.shape.widths), shape_name=tree.shape.name,
        nodes=_tree_nodes(r, g.config, g.target.tokenizer) if details else [], emitted=r.emitted,
        accepted_len=len(r.acc.path) - 1, draft_ms=r.draft_s * 1e3, verify_ms=r.verify_s * 1e3,
        round_ms=r.round_s * 1e3, new_tokens_total=len(g.new_ids), elapsed_s=g.seconds, rss_bytes=rss,
        cuda_allocated_bytes=cuda_alloc, cuda_peak_bytes=cuda_peak, drafter_state_bytes=g.drafter.state_bytes(),
        target_kv_bytes=g.verifier.kv_bytes, bandit=g.bandit.snapshot(r.arm) if g.bandit else None,
        drafter_read_target=g.drafter.reads_target, mapping_ms=g.drafter.mapping_ms(),
    )


def _summary(g: _Generation, prefill_ms: float, start_ms: float) -> Summary:
    seconds, n = g.seconds, len(g.new_ids)
    return Summary(
        method=g.config.method, text=g.target.tokenizer.decode(g.new_ids, skip_special_tokens=True),
        token_ids=g.new_ids, new_tokens=n, rounds=g.rounds, prefill_ms=prefill_ms, drafter_start_ms=start_ms,
        seconds=seconds,
        tokens_per_s=n / seconds if seconds > 0 else 0.0, mean_accepted_len=n / g.rounds if g.rounds else 0.0,
        acceptance_rate=g.accepted / g.tested if g.tested else None, drafted_tokens=g.drafted,
        stop_reason=g.stop_reason, accepted_tokens=g.accepted, tested_positions=g.tested,
        extra={"drafter": g.drafter_label, "prompt_tokens": len(g.prompt_ids),
               "dtype": str(g.target.model.dtype).removeprefix("torch.")},
    )


def generate(models: Models, prompt: str, config: GenerationConfig, stop: threading.Event | None = None,
             chat: bool = True, bandit: UCBBandit | None = None,
             details: bool = True) -> Iterator[RoundRecord | Summary]:
    """Decode `prompt` with the configured method; yields a RoundRecord per round, then a Summary.

    For `*-ucb` methods, pass a `bandit` (`UCBBandit.for_config(config)`) to keep learning across generations,
    e.g. over one user's session; by default each generation starts a fresh one. `details=False` leaves each
    record's tree nodes empty (a benchmark needs only the timings and counts).
    """
    g = _setup(models, prompt, config, chat, bandit)
    prefill_ms, start_ms = _prefill(g)
    while len(g.new_ids) < config.max_new_tokens:
        if stop is not None and stop.is_set():
            g.stop_reason = "stopped"
            break
        t0 = time.perf_counter()
        r = _round(g)
        g.seconds += time.perf_counter() - t0
        yield _record(g, r, details)
        if g.stop_reason == "eos":
            break
    yield _summary(g, prefill_ms, start_ms)
