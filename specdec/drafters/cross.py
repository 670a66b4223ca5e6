"""Drafting with a drafter of another tokenizer: the `xmamba` kind (`CrossMamba`) and the two schemes it runs.

The drafter works in its own tokens, on the same text. Each round its tree's branches are turned into text and
re-encoded by the target's tokenizer, and the branches become one trie over target ids, which the target verifies
as any other tree. The target checks every proposal, so the output is the target's own whatever the mapping
does; the mapping decides only how much is accepted.

The boundary: a branch's text follows the committed text, and a tokenizer may merge across that boundary (the
target's last token with the branch's first characters). A branch is re-encoded together with the text of the
last `look_behind` committed target tokens and kept from where that re-encoding still starts with those tokens;
a branch whose re-encoding does not is left out this round. The same look-behind, on the drafter's side, turns
a branch of drafter tokens into the text it adds.

Catching up: after a round the text the target emitted (the accepted tokens and its own) is encoded in the
drafter's tokens and fed to the drafter as tokens it has not seen (`commit(path=[0], ..., unseen=...)`), as if it
had drafted nothing: its own branch, even one that matched, is fed again. Sampling needs `q` over target ids,
which re-encoded text does not give: `CrossTokenizerDrafter.for_decoding` hands sampling to the other scheme.

`SharedVocabDrafter` is the other scheme, exact under sampling too (token-level intersection, as in Timor et
al., ICML 2025): the drafter may propose only the tokens both vocabularies hold (the same string), its
distribution restricted to them and renormalised, so each drafted token is one target token and `q` is a proper
distribution over target ids; ordinary rejection sampling then keeps the target's distribution. Tokens the target
emits outside the shared set reach the drafter re-encoded as text.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from specdec.drafters.base import Drafter, DraftTree, Sampler
from specdec.drafters.mamba import MambaDrafter
from specdec.models import LoadedModel, ModelLoadError, load_model
from specdec.tree import TreeShape

LOOK_BEHIND = 4  # committed tokens re-encoded with a branch, on either side of the boundary


def _ids(tokenizer, text: str) -> list[int]:
    """The tokens of `text` alone: no special tokens added."""
    try:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    except TypeError:  # a minimal tokenizer without the keyword
        return list(tokenizer(text)["input_ids"])


def text_after(tokenizer, before: Sequence[int], ids: Sequence[int]) -> str:
    """The text `ids` add after `before` (decoded together, so a tokenizer that marks word starts on its tokens
    gives each piece its space)."""
    head = tokenizer.decode(list(before))
    return tokenizer.decode([*before, *ids])[len(head):]


def continuation(tokenizer, behind: Sequence[int], text: str) -> list[int] | None:
    """The tokens `tokenizer` gives `text` after the tokens `behind`, re-encoding both together; None when the
    re-encoding does not start with `behind` (the text merges with the last of them)."""
    encoded = _ids(tokenizer, tokenizer.decode(list(behind)) + text)
    if encoded[: len(behind)] != list(behind):
        return None
    return encoded[len(behind):]


class Trie:
    """Target-token sequences below a root, merged where they share a prefix; nodes in insertion order."""

    def __init__(self, root: int, max_nodes: int) -> None:
        self.tokens, self.parents, self.q_tok, self.sources = [root], [-1], [1.0], [None]
        self.children: list[dict[int, int]] = [{}]
        self.max_nodes = max_nodes  # drafted nodes, the root not counted

    def insert(self, sequence: Sequence[int], q: float, source: list[str] | None = None) -> None:
        """Add `sequence` below the root, as far as the node budget allows; `source` labels the nodes it adds."""
        node = 0
        for token in sequence:
            child = self.children[node].get(token)
            if child is None:
                if len(self.tokens) > self.max_nodes:
                    return
                child = len(self.tokens)
                self.children[node][token] = child
                self.tokens.append(token)
                self.parents.append(node)
                self.q_tok.append(q)
                self.sources.append(source)
                self.children.append({})
            node = child


class CrossTokenizerDrafter(Drafter):
    """`inner` drafts in the tokens of `drafter_tokenizer`; the trees it returns are over `target_tokenizer`'s.

    `vocab_size` (the target's logits width) and `drafter_vocab` (the inner drafter's) let `for_decoding` hand
    sampling over to `SharedVocabDrafter`; without them this drafter serves greedy decoding only."""

    def __init__(self, inner: Drafter, target_tokenizer, drafter_tokenizer, look_behind: int = LOOK_BEHIND,
                 vocab_size: int | None = None, drafter_vocab: int | None = None) -> None:
        self.inner, self.target_tokenizer, self.drafter_tokenizer = inner, target_tokenizer, drafter_tokenizer
        self.look_behind, self.vocab_size, self.drafter_vocab = look_behind, vocab_size, drafter_vocab
        self.name = f"{inner.name} (own tokenizer)"
        self.reads_target, self.max_context = False, None  # the drafter's context is counted in its own tokens
        self.map_s = 0.0  # the current round's time in re-encoding, drafting and catching up

    def for_decoding(self, greedy: bool) -> Drafter:
        if greedy:
            return self
        if self.vocab_size is None or self.drafter_vocab is None:
            raise ValueError("a drafter with another tokenizer drafts under greedy decoding only (temperature 0)")
        return SharedVocabDrafter(self.inner, self.target_tokenizer, self.drafter_tokenizer, self.vocab_size,
                                  self.drafter_vocab)

    def mapping_ms(self) -> float | None:
        return self.map_s * 1e3

    def start(self, context: list[int], max_nodes: int, features: torch.Tensor | None = None) -> None:
        self.context = list(context)  # target ids, the root last
        drafted = _ids(self.drafter_tokenizer, self.target_tokenizer.decode(self.context))
        if not drafted:
            raise ValueError("the drafter's tokenizer makes no tokens of this prompt")
        self.fed = drafted[-self.look_behind:]  # the last drafter tokens fed, the drafter's root last
        self.max_nodes = max_nodes
        self.inner.start(drafted, max_nodes, None)

    def draft(self, shape: TreeShape, sampler: Sampler) -> DraftTree:
        if not sampler.greedy:
            raise ValueError("a drafter with another tokenizer drafts under greedy decoding only (temperature 0)")
        inner = self.inner.draft(shape, sampler)
        tick = time.perf_counter()
        trie = Trie(self.context[-1], max(self.max_nodes, 1))
        behind = self.context[-self.look_behind:]
        branches: dict[int, list[int]] = {0: []}  # inner node -> its drafter tokens below the root
        texts: dict[int, str] = {0: ""}  # inner node -> the text its branch adds
        pieces: dict[int, list[str]] = {0: []}  # inner node -> that text, one piece per drafter token
        for node in range(1, len(inner.tokens)):  # parents come before children
            parent = inner.parents[node]
            branches[node] = [*branches[parent], inner.tokens[node]]
            texts[node] = text_after(self.drafter_tokenizer, self.fed, branches[node])
            pieces[node] = [*pieces[parent], texts[node][len(texts[parent]):]]
            mapped = continuation(self.target_tokenizer, behind, texts[node]) if texts[node] else None
            if mapped:
                trie.insert(mapped, inner.q_tok[node], pieces[node])
        self.tree = DraftTree(inner.shape, trie.tokens, trie.parents, trie.q_tok, None, sources=trie.sources)
        self.map_s = time.perf_counter() - tick
        return self.tree

    def commit(self, path: list[int], next_token: int, unseen: Sequence[int] = (),
               features: torch.Tensor | None = None) -> None:
        """`path` indexes the last trie; the emitted target tokens' text is fed to the drafter as unseen tokens."""
        tick = time.perf_counter()
        emitted = [*(self.tree.tokens[node] for node in path[1:]), *unseen, next_token]
        text = text_after(self.target_tokenizer, self.context[-self.look_behind:], emitted)
        self.context.extend(emitted)
        # Text that makes no drafter token (a token the decoder drops) still moves the drafter on one token: it
        # is given its last token again, which costs draft quality only.
        drafted = _ids(self.drafter_tokenizer, text) or self.fed[-1:]
        self.map_s += time.perf_counter() - tick
        self.inner.commit([0], drafted[-1], drafted[:-1])
        self.fed = [*self.fed, *drafted][-self.look_behind:]

    def state_bytes(self) -> int:
        return self.inner.state_bytes()


MIN_SHARED = 256  # fewer shared tokens than this leave a drafter nothing worth proposing


def shared_vocabulary(target_tokenizer, drafter_tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """(drafter ids, target ids) of the tokens both vocabularies hold, paired by their string, in string order."""
    target, drafter = target_tokenizer.get_vocab(), drafter_tokenizer.get_vocab()
    common = sorted(set(target) & set(drafter))
    return torch.tensor([drafter[t] for t in common], dtype=torch.long), \
        torch.tensor([target[t] for t in common], dtype=torch.long)


class SharedVocabSampler(Sampler):
    """A sampler whose children come from the drafter's distribution restricted to `allowed` drafter ids and
    renormalised (the restriction is applied to the logits, before temperature and top-p)."""

    def __init__(self, base: Sampler, allowed: torch.Tensor) -> None:
        super().__init__(base.temperature, base.top_p, base.generator, base.min_branch_q, base.min_expand_q)
        self.allowed = allowed  # [V_d] bool

    def children(self, logits: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        allowed = self.allowed.to(logits.device)
        return super().children(logits.masked_fill(~allowed[: logits.shape[-1]], float("-inf")), width)


class SharedVocabDrafter(Drafter):
    """`inner` drafts in `drafter_tokenizer`'s tokens, restricted to those `target_tokenizer` holds too; its trees
    come out one node per target token, with `q` over the target's `vocab_size` ids."""

    def __init__(self, inner: Drafter, target_tokenizer, drafter_tokenizer, vocab_size: int, drafter_vocab: int,
                 min_shared: int = MIN_SHARED) -> None:
        self.inner, self.target_tokenizer, self.drafter_tokenizer = inner, target_tokenizer, drafter_tokenizer
        drafter_ids, target_ids = shared_vocabulary(target_tokenizer, drafter_tokenizer)
        drafter_ids, target_ids = drafter_ids[drafter_ids < drafter_vocab], target_ids[drafter_ids < drafter_vocab]
        if len(drafter_ids) < min_shared:
            raise ValueError(f"the drafter's tokenizer shares {len(drafter_ids)} tokens with the target's; at least "
                             f"{min_shared} are needed to draft anything worth checking")
        self.vocab_size = vocab_size
        self.to_target = torch.full((drafter_vocab,), -1, dtype=torch.long)
        self.to_target[drafter_ids] = target_ids
        self.to_drafter = torch.full((vocab_size,), -1, dtype=torch.long)
        self.to_drafter[target_ids] = drafter_ids
        self.allowed = self.to_target >= 0  # [V_d]
        self.drafter_ids, self.target_ids = drafter_ids, target_ids
        self.name = f"{inner.name} (shared vocabulary)"
        self.reads_target, self.max_context = False, None
        self.map_s = 0.0

    def mapping_ms(self) -> float | None:
        return self.map_s * 1e3

    def _drafter_tokens(self, target_tokens: Sequence[int]) -> list[int]:
        """Target tokens as drafter tokens: a shared token as itself, a run of others re-encoded as text."""
        out, pending = [], []
        for token in target_tokens:
            mapped = int(self.to_drafter[token])
            if mapped < 0:
                pending.append(token)
                continue
            if pending:
                out += _ids(self.drafter_tokenizer, self.target_tokenizer.decode(pending))
                pending = []
            out.append(mapped)
        if pending:
            out += _ids(self.drafter_tokenizer, self.target_tokenizer.decode(pending))
        return out

    def start(self, context: list[int], max_nodes: int, features: torch.Tensor | None = None) -> None:
        self.root = context[-1]
        drafted = self._drafter_tokens(context)
        if not drafted:
            raise ValueError("the drafter's tokenizer makes no tokens of this prompt")
        self.last_fed = drafted[-1]
        self.inner.start(drafted, max_nodes, None)

    def draft(self, shape: TreeShape, sampler: Sampler) -> DraftTree:
        inner = self.inner.draft(shape, SharedVocabSampler(sampler, self.allowed))
        tick = time.perf_counter()
        tokens = [self.root, *self.to_target[torch.tensor(inner.tokens[1:], dtype=torch.long)].tolist()]
        q = None
        if inner.q is not None:  # [n, V_d] -> [n, V]: the restricted distribution sits on the shared ids
            q = inner.q.new_zeros(len(tokens), self.vocab_size)
            q[:, self.target_ids.to(q.device)] = inner.q[:, self.drafter_ids.to(q.device)]
        self.map_s = time.perf_counter() - tick
        return DraftTree(inner.shape, tokens, inner.parents, inner.q_tok, q)

    def commit(self, path: list[int], next_token: int, unseen: Sequence[int] = (),
               features: torch.Tensor | None = None) -> None:
        """The accepted nodes are the drafter's own; what follows them reaches it in its tokens."""
        # (text that makes no drafter token moves the drafter on by its last token again: draft quality only)
        tick = time.perf_counter()
        after = self._drafter_tokens([*unseen, next_token]) or [self.last_fed]
        self.map_s += time.perf_counter() - tick
        self.inner.commit(path, after[-1], after[:-1])
        self.root, self.last_fed = next_token, after[-1]

    def state_bytes(self) -> int:
        return self.inner.state_bytes()


class CrossMamba(CrossTokenizerDrafter):
    """The registry's `xmamba` kind: a Mamba language model with a tokenizer of its own, drafting for a target
    of another tokenizer (any pairing loads; greedy decoding re-encodes branches, sampling drafts the shared
    vocabulary, see `for_decoding`). A Mamba drafter that shares the target's tokenizer works here too, at the
    cost of the mapping."""

    @staticmethod
    def load(spec: str, device: torch.device, dtype: torch.dtype, target: LoadedModel) -> LoadedModel:
        loaded = load_model(spec, device, dtype, verified=False)
        if loaded.model.config.model_type != "mamba":
            raise ModelLoadError(f"drafter {spec!r} is a {loaded.model.config.model_type} model, not mamba")
        if loaded.tokenizer is None:
            raise ModelLoadError(f"drafter {spec!r} has no tokenizer of its own; a drafter for a target of another "
                                 "tokenizer must carry one")
        return loaded

    @classmethod
    def build(cls, loaded: LoadedModel, target: LoadedModel, cuda_graphs: bool | None = None) -> CrossMamba:
        width = loaded.model.get_output_embeddings().weight.shape[0]
        inner = MambaDrafter.from_folder(loaded.model, width, loaded.source, cuda_graphs)
        return cls(inner, target.tokenizer, loaded.tokenizer, vocab_size=target.vocab_size, drafter_vocab=width)
