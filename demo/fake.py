"""A scripted stand-in for `specdec.engine.generate`: plausible records without any model.

Used by the UI's tests (and handy when working on the UI): same call signature, same event stream
(one `RoundRecord` per round, then one `Summary`), deterministic for a given seed.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

from specdec.records import ArmStat, BanditSnapshot, EmittedToken, RoundRecord, Summary, TreeNode
from specdec.tree import TreeShape, parse_shape

TEXT = ("Speculative decoding lets a small drafter guess several tokens ahead , and the large target checks every "
        "guess in one pass . Accepted guesses are free tokens ; a rejected guess costs little , because the target "
        "then writes the next token itself .\n")
WORDS = tuple(" " + w for w in TEXT.split(" "))
ARMS = ((3,), (5,), (2, 1, 1, 1), (2, 2, 1, 1), (3, 1, 1))


def shape_name(shape: tuple[int, ...]) -> str:
    return TreeShape(shape).name  # as the engine names shapes: "chain 3", "(2,1,1)"


def draft_tree(shape: tuple[int, ...], rng: random.Random, start: int, accept_p: float) -> tuple[list[TreeNode], int]:
    """Nodes of a `shape` tree under a root (only first children can be accepted) and the accepted path's length."""
    nodes = [TreeNode(0, 0, WORDS[(start - 1) % len(WORDS)], -1, 0, 1.0, 1.0, "root")]
    level, accepted, alive = [0], 0, True
    for depth, width in enumerate(shape, start=1):
        nxt = []
        for parent in level:
            for k in range(width):
                on_path = alive and nodes[parent].status in ("root", "accepted")
                take = on_path and k == 0 and rng.random() < accept_p
                status = "accepted" if take else ("rejected" if on_path else "not_reached")
                text = WORDS[(start + depth - 1 + (0 if take else 7 + k)) % len(WORDS)]
                q, p = round(rng.uniform(0.05, 0.9), 3), round(rng.uniform(0.05, 0.9), 3)
                nodes.append(TreeNode(len(nodes), len(nodes), text, parent, depth, q, p, status))
                nxt.append(len(nodes) - 1)
                accepted += take
        alive = any(nodes[i].status == "accepted" for i in nxt)
        level = nxt
    return nodes, accepted


def fake_generate(models: object, prompt: str, config: object, stop: threading.Event | None = None,
                  delay: float = 0.02) -> Iterator[RoundRecord | Summary]:
    """Rounds of made-up drafts over a fixed text; `config` needs method, tree, max_new_tokens, seed, reward."""
    if not prompt.strip():
        raise ValueError("the prompt is empty")
    rng = random.Random(getattr(config, "seed", 0))
    method = getattr(config, "method", "mamba-ucb")
    limit = getattr(config, "max_new_tokens", 32)
    fixed = parse_shape(getattr(config, "tree", None) or "2,1,1").widths
    pulls, rewards = [0] * len(ARMS), [0.0] * len(ARMS)
    emitted_total, ms_total, rounds = 0, 0.0, []
    while emitted_total < limit:
        if stop is not None and stop.is_set():
            break
        time.sleep(delay)
        chosen = len(rounds) % len(ARMS) if method.endswith("ucb") else None
        shape = () if method == "ar" else ARMS[chosen] if chosen is not None else fixed
        nodes, accepted = draft_tree(shape, rng, emitted_total, 0.7)
        path = [n for n in nodes if n.status == "accepted"]
        leaf = bool(path) and path[-1].depth == len(shape)
        extra = WORDS[(emitted_total + accepted) % len(WORDS)]
        emitted = [EmittedToken(n.token_id, n.text, "draft") for n in path]
        emitted.append(EmittedToken(999, extra, "bonus" if leaf or not shape else "correction"))
        emitted = emitted[: limit - emitted_total]
        emitted_total += len(emitted)
        draft_ms, verify_ms = 4.0 * len(shape), 30.0 + len(nodes)
        ms_total += draft_ms + verify_ms
        bandit = None
        if chosen is not None:
            pulls[chosen] += 1
            rewards[chosen] += -1.0 / max(len(emitted), 1)
            stats = [ArmStat(shape_name(a), n, rewards[i] / n if n else None, None) for i, (a, n) in
                     enumerate(zip(ARMS, pulls, strict=True))]
            bandit = BanditSnapshot(stats, chosen, "paper", -1.0 / max(len(emitted), 1))
        rounds.append(RoundRecord(
            len(rounds), list(shape), shape_name(shape), nodes, emitted,
            sum(t.source == "draft" for t in emitted), draft_ms, verify_ms, draft_ms + verify_ms, emitted_total,
            ms_total / 1000, 400_000_000 + 1000 * emitted_total, None, None, 90_000 if shape else 0,
            9216 * (len(prompt) // 4 + emitted_total), bandit))
        yield rounds[-1]
    tokens = [t for r in rounds for t in r.emitted]
    drafted = sum(len(r.nodes) - 1 for r in rounds)
    yield Summary(method, "".join(t.text for t in tokens), [t.token_id for t in tokens], len(tokens), len(rounds),
                  12.0, ms_total / 1000, len(tokens) / (ms_total / 1000) if ms_total else 0.0,
                  len(tokens) / max(len(rounds), 1), 0.6 if drafted else None, drafted,
                  "stopped" if stop is not None and stop.is_set() else "max_new_tokens",
                  extra={"dtype": "float32"})
