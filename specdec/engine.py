"""The speculative decoding loop: draft a tree, verify it in one target pass, accept, catch up, repeat.

`generate` yields one `RoundRecord` per round and then a `Summary`; it knows nothing of its consumers.
The target's KV cache holds every emitted token except the last one, `x`, which is the root of the next
tree: a round feeds `[x] + tree` to the target with a tree attention mask, so `p` is known at every node.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psutil
import torch

from specdec.bandit import UCBBandit
from specdec.config import GenerationConfig
from specdec.drafters import (Drafter, LookupBranch, LookupDrafter, MambaDrafter, MambaFeatDrafter, NoDrafter, Sampler,
                              TransformerDrafter)
from specdec.drafters.base import DraftTree
from specdec.kvcache import TreeLM
from specdec.models import Models
from specdec.records import BanditSnapshot, EmittedToken, RoundRecord, Summary, TreeNode
from specdec.sampling import Acceptance, accept_greedy, accept_sampling, logits_to_probs
from specdec.tree import TreeShape
from specdec.vocab import load_draft_vocab


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
    vocab_size = models.target.vocab_size
    if kind == "none":
        return NoDrafter()
    if kind == "lookup":
        return LookupDrafter()
    loaded = models.drafter(kind)
    if kind == "mamba":
        return MambaDrafter.from_folder(loaded.model, vocab_size, loaded.source)
    if kind == "mamba-feat":
        return MambaFeatDrafter(loaded.model, models.target.model, load_draft_vocab(loaded.source))
    return TransformerDrafter.from_folder(loaded.model, vocab_size, loaded.source)


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


def _accept(tree: DraftTree, logits: torch.Tensor, config: GenerationConfig, generator: torch.Generator,
            p: torch.Tensor) -> Acceptance:
    if config.greedy:
        # `max` rather than `argmax`: the same first maximal index, at a quarter of the cost over a 49k vocabulary here
        return accept_greedy(tree.tokens, tree.parents, logits.max(-1).indices.tolist())
    q = tree.q.to(p.device) if tree.q is not None else None
    return accept_sampling(tree.tokens, tree.parents, p, q, generator, tree.point)


def _tree_nodes(tree: DraftTree, acc: Acceptance, p: torch.Tensor, tokenizer) -> list[TreeNode]:
    accepted, rejected = set(acc.path), set(acc.rejected)
    parents = tree.parents
    rows = torch.tensor(parents[1:], dtype=torch.long, device=p.device)
    cols = torch.tensor(tree.tokens[1:], dtype=torch.long, device=p.device)
    p_tok = [1.0] + p[rows, cols].tolist()  # one gather: p of each node's token at its parent
    nodes = []
    for i, token in enumerate(tree.tokens):
        status = "root" if i == 0 else "accepted" if i in accepted else "rejected" if i in rejected else "not_reached"
        depth = 0 if i == 0 else nodes[parents[i]].depth + 1
        nodes.append(TreeNode(i, token, tokenizer.decode([token]), parents[i], depth, tree.q_tok[i], p_tok[i], status,
                              copied=bool(tree.point and tree.point[i])))
    return nodes


def generate(models: Models, prompt: str, config: GenerationConfig, stop: threading.Event | None = None,
             chat: bool = True, bandit: UCBBandit | None = None) -> Iterator[RoundRecord | Summary]:
    """Decode `prompt` with the configured method; yields a RoundRecord per round, then a Summary.

    For `*-ucb` methods, pass a `bandit` (`UCBBandit.for_config(config)`) to keep learning across generations,
    e.g. over one user's session; by default each generation starts a fresh one.
    """
    config.validate()
    if not prompt or not prompt.strip():
        raise ValueError("the prompt is empty")
    target = models.target
    tokenizer, device = target.tokenizer, target.device
    prompt_ids = encode_prompt(tokenizer, prompt, chat)
    shapes = config.shapes()
    if max((w for s in shapes for w in s.widths), default=1) > target.vocab_size:
        raise ValueError(f"a tree is wider than the vocabulary ({target.vocab_size} tokens)")
    max_depth = max(s.depth for s in shapes)
    if config.grafts_lookup:
        max_depth = max(max_depth, config.lookup_branch)
    kind = config.spec.drafter
    limits = [getattr(target.model.config, "max_position_embeddings", None)]
    if kind == "transformer":  # a Mamba drafter (either kind) has no context limit
        limits.append(getattr(models.drafter(kind).model.config, "max_position_embeddings", None))
    limit = min((x for x in limits if x), default=None)
    if limit and len(prompt_ids) + config.max_new_tokens + max_depth + 1 > limit:
        raise ValueError(f"the prompt has {len(prompt_ids)} tokens; with max_new_tokens={config.max_new_tokens} "
                         f"it exceeds the context of {limit} tokens")
    eos = target.model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])

    drafter = make_drafter(models, kind)
    drafter_label = models.drafter(kind).name if config.spec.has_model else kind
    if config.grafts_lookup:
        drafter, drafter_label = LookupBranch(drafter, config.lookup_branch), f"{drafter_label}+lookup"
    if config.spec.policy != "ucb":
        bandit = None
    elif bandit is None:
        bandit = UCBBandit.for_config(config)
    elif not bandit.matches(config):
        raise ValueError("the bandit passed in was made for other arms or reward settings")
    generator = torch.Generator(device=device).manual_seed(config.seed)
    sampler = Sampler(config.temperature, config.top_p, generator)
    verifier = make_verifier(target.model)
    detok = Detokenizer(tokenizer)

    t0 = time.perf_counter()
    if len(prompt_ids) > 1:
        verifier.prefill(prompt_ids[:-1])  # the last prompt token is the first round's root
    features = {"features": verifier.hidden} if drafter.uses_features else {}  # the target's, at prompt[:-1]
    drafter.start(prompt_ids, max(s.num_drafted for s in shapes), **features)
    _sync(device)
    prefill_ms = (time.perf_counter() - t0) * 1e3

    new_ids: list[int] = []
    rounds = accepted_total = tested_total = drafted_total = 0
    stop_reason = "max_new_tokens"
    start = time.perf_counter()
    while len(new_ids) < config.max_new_tokens:
        if stop is not None and stop.is_set():
            stop_reason = "stopped"
            break
        arm = bandit.select() if bandit else 0
        shape: TreeShape = shapes[arm]
        t_round = time.perf_counter()
        tree = drafter.draft(shape, sampler)
        _sync(device)
        t_draft = time.perf_counter()
        logits = verifier.extend(tree.tokens, tree.parents)  # [n, V]: one pass over root + tree
        p = logits_to_probs(logits, config.temperature, config.top_p)  # [n, V]
        _sync(device)
        t_verify = time.perf_counter()
        acc = _accept(tree, logits, config, generator, p)
        verifier.commit(acc.path)
        features = {"features": verifier.hidden[acc.path]} if drafter.uses_features else {}  # root, accepted
        drafter.commit(acc.path, acc.next_token, **features)
        _sync(device)
        round_s = time.perf_counter() - t_round

        drafted_new = [tree.tokens[i] for i in acc.path[1:]]
        emitted_ids = (drafted_new + [acc.next_token])[: config.max_new_tokens - len(new_ids)]
        if eos_ids & set(emitted_ids):
            emitted_ids = emitted_ids[: next(i for i, t in enumerate(emitted_ids) if t in eos_ids) + 1]
            stop_reason = "eos"
        target_source = "bonus" if acc.is_bonus else "correction"
        emitted = [EmittedToken(t, detok.add(t), "draft" if i < len(drafted_new) else target_source)
                   for i, t in enumerate(emitted_ids)]
        new_ids.extend(emitted_ids)

        snapshot: BanditSnapshot | None = None
        if bandit:
            bandit.observe(arm, len(emitted_ids), tree.shape.depth, round_s)
            snapshot = bandit.snapshot(arm)
        rounds += 1
        accepted_total += len(acc.path) - 1
        tested_total += acc.tested_depths
        drafted_total += len(tree.tokens) - 1
        rss, cuda_alloc, cuda_peak = _memory(device)
        yield RoundRecord(
            index=rounds - 1, shape=list(tree.shape.widths), shape_name=tree.shape.name,
            nodes=_tree_nodes(tree, acc, p, tokenizer), emitted=emitted, accepted_len=len(acc.path) - 1,
            draft_ms=(t_draft - t_round) * 1e3, verify_ms=(t_verify - t_draft) * 1e3, round_ms=round_s * 1e3,
            new_tokens_total=len(new_ids), elapsed_s=time.perf_counter() - start, rss_bytes=rss,
            cuda_allocated_bytes=cuda_alloc, cuda_peak_bytes=cuda_peak, drafter_state_bytes=drafter.state_bytes(),
            target_kv_bytes=verifier.kv_bytes, bandit=snapshot, drafter_read_target=drafter.uses_features,
        )
        if stop_reason == "eos":
            break

    seconds = time.perf_counter() - start
    yield Summary(
        method=config.method, text=tokenizer.decode(new_ids, skip_special_tokens=True), token_ids=new_ids,
        new_tokens=len(new_ids), rounds=rounds, prefill_ms=prefill_ms, seconds=seconds,
        tokens_per_s=len(new_ids) / seconds if seconds > 0 else 0.0,
        mean_accepted_len=len(new_ids) / rounds if rounds else 0.0,
        acceptance_rate=accepted_total / tested_total if tested_total else None,
        drafted_tokens=drafted_total, stop_reason=stop_reason, accepted_tokens=accepted_total,
        tested_positions=tested_total,
        extra={"drafter": drafter_label, "prompt_tokens": len(prompt_ids),
               "dtype": str(target.model.dtype).removeprefix("torch.")},
    )
