"""Drafting with another tokenizer (greedy): the branch-to-target-token mapping, the trie, and the engine's promise
on a tiny target that reads one character a token beside drafters that read pairs of characters."""

import pytest
import torch

from specdec import engine
from specdec.config import GenerationConfig
from specdec.drafters import MambaDrafter
from specdec.drafters.base import Drafter, DraftTree
from specdec.drafters import cross
from specdec.drafters.cross import (CrossTokenizerDrafter, SharedVocabDrafter, SharedVocabSampler, Trie, continuation,
                                    shared_vocabulary, text_after)
from specdec.engine import generate
from specdec.tree import TreeShape
from tests.test_engine import _chi_square
from tests.test_engine_sampling import N_NEW, RUNS, reference
from tests.tiny import TinyTokenizer, tiny_mamba

PROMPT = "abcab"


class PairTokenizer:
    """Another tokenizer over the same text: some pairs of characters are one token, matched greedily."""

    chat_template = None

    def __init__(self) -> None:
        self.pieces = list("abcdef") + ["ab", "ca", "ba", "cc", "fa", "de"]

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        ids, i = [], 0
        while i < len(text):
            pair = text[i: i + 2]
            if len(pair) == 2 and pair in self.pieces:
                ids.append(self.pieces.index(pair))
                i += 2
            else:
                ids.append(self.pieces.index(text[i]) if text[i] in self.pieces else 0)
                i += 1
        return {"input_ids": ids}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(self.pieces[i] for i in ids)


class MergingTokenizer(TinyTokenizer):
    """A target tokenizer whose token "ab" merges across a boundary: "a" then "b..." re-encodes as "ab" ..."""

    def __init__(self) -> None:
        super().__init__(6)
        self.alphabet = "abcdef"

    def __call__(self, text: str) -> dict:
        ids, i = [], 0
        while i < len(text):
            if text[i: i + 2] == "ab":
                ids.append(6)
                i += 2
            else:
                ids.append(self.alphabet.index(text[i]))
                i += 1
        return {"input_ids": ids}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join("ab" if i == 6 else self.alphabet[i] for i in ids)


def test_a_branch_maps_to_the_target_tokens_after_the_boundary():
    target, drafter = TinyTokenizer(6), PairTokenizer()
    pieces = drafter.pieces
    assert text_after(drafter, [pieces.index("ab")], [pieces.index("ca"), pieces.index("f")]) == "caf"
    assert continuation(target, [0, 1], "caf") == [2, 0, 5]  # "ab" then "c", "a", "f"
    merging = MergingTokenizer()
    assert continuation(merging, [2, 0], "bc") is None  # "ca" + "bc": "a" and "b" merge into "ab"
    assert continuation(merging, [2, 1], "abc") == [6, 2]


def test_branches_with_a_common_prefix_merge_into_one_trie():
    trie = Trie(root=9, max_nodes=4)
    trie.insert([1, 2], 0.5)
    trie.insert([1, 3], 0.4)  # shares node 1
    trie.insert([4, 5, 6], 0.3)  # the budget of 4 drafted nodes ends at 4
    assert (trie.tokens, trie.parents) == ([9, 1, 2, 3, 4], [-1, 0, 1, 1, 0])
    assert trie.q_tok == [1.0, 0.5, 0.5, 0.4, 0.3]


class ScriptDrafter(Drafter):
    """Drafts the next tokens of a known text in the pair tokenizer's tokens (what a perfect drafter would), and
    checks that the text it is fed is that text."""

    def __init__(self, text: str, tokenizer: PairTokenizer) -> None:
        self.text, self.tokenizer = text, tokenizer

    def start(self, context, max_nodes, features=None):
        self.seen = self.tokenizer.decode(context)

    def draft(self, shape, sampler):
        assert self.text.startswith(self.seen)
        ahead = self.tokenizer(self.text[len(self.seen):])["input_ids"][: shape.depth]
        return DraftTree(TreeShape.chain(len(ahead)), [0, *ahead], list(range(-1, len(ahead))),
                         [1.0] * (len(ahead) + 1), None)

    def commit(self, path, next_token, unseen=(), features=None):
        assert path == [0]  # the wrapper feeds the emitted text as unseen tokens
        self.seen += self.tokenizer.decode([*unseen, next_token])


def _with_drafter(monkeypatch, make) -> None:
    monkeypatch.setattr(engine, "make_drafter", lambda models, kind: make(models))


@pytest.mark.parametrize("method, tree", [("mamba-chain", "4"), ("mamba-tree", "2,2,1"), ("mamba-tree", "3,1")])
def test_greedy_with_another_tokenizer_is_identical_to_target_alone(tiny_models, monkeypatch, method, tree):
    """A random Mamba drafter of the pair tokenizer's 12 tokens, its trees mapped to the target's characters."""
    config = dict(max_new_tokens=40, temperature=0.0)
    ar = list(generate(tiny_models, PROMPT, GenerationConfig(method="ar", **config), chat=False))[-1]
    pair = PairTokenizer()
    _with_drafter(monkeypatch, lambda models: CrossTokenizerDrafter(
        MambaDrafter(tiny_mamba(len(pair.pieces), seed=4), len(pair.pieces)), models.target.tokenizer, pair))
    events = list(generate(tiny_models, PROMPT, GenerationConfig(method=method, tree=tree, **config), chat=False))
    assert events[-1].token_ids == ar.token_ids
    assert sum(len(r.emitted) for r in events[:-1]) == 40


def test_a_perfect_drafter_of_another_tokenizer_is_accepted_in_full(tiny_models, monkeypatch):
    """What the drafter proposes in its own tokens reaches the target as the same text: a drafter that knows the
    answer has every drafted node on the accepted path."""
    config = dict(max_new_tokens=30, temperature=0.0)
    ar = list(generate(tiny_models, PROMPT, GenerationConfig(method="ar", **config), chat=False))[-1]
    pair = PairTokenizer()
    answer = PROMPT + tiny_models.target.tokenizer.decode(ar.token_ids)
    _with_drafter(monkeypatch, lambda models: CrossTokenizerDrafter(ScriptDrafter(answer, pair),
                                                                     models.target.tokenizer, pair))
    events = list(generate(tiny_models, PROMPT, GenerationConfig(method="mamba-chain", tree="3", **config),
                           chat=False))
    summary = events[-1]
    assert summary.token_ids == ar.token_ids
    assert summary.accepted_tokens == summary.drafted_tokens > 0  # all of it accepted
    assert summary.rounds < 30 / 2  # pairs: a chain of 3 drafter tokens is up to 6 target tokens


def test_sampling_is_refused_for_now(tiny_models, monkeypatch):
    pair = PairTokenizer()
    _with_drafter(monkeypatch, lambda models: CrossTokenizerDrafter(
        MambaDrafter(tiny_mamba(len(pair.pieces), seed=4), len(pair.pieces)), models.target.tokenizer, pair))
    with pytest.raises(ValueError, match="greedy decoding only"):
        list(generate(tiny_models, PROMPT, GenerationConfig(method="mamba-chain", tree="2", temperature=0.8),
                      chat=False))


# --- the shared vocabulary: exact under sampling -------------------------------------------------------------------
class PairVocab(PairTokenizer):
    def get_vocab(self) -> dict:
        return {piece: i for i, piece in enumerate(self.pieces)}


def _shared(models, seed: int = 3) -> SharedVocabDrafter:
    """Seed 3: a drafter that puts about half its mass on the pair tokens the target lacks, so the restriction
    matters."""
    pair = PairVocab()
    inner = MambaDrafter(tiny_mamba(len(pair.pieces), seed=seed), len(pair.pieces))
    return SharedVocabDrafter(inner, models.target.tokenizer, pair, models.target.vocab_size, len(pair.pieces),
                              min_shared=6)


def test_the_shared_vocabulary_pairs_tokens_by_their_string(tiny_models):
    drafter_ids, target_ids = shared_vocabulary(tiny_models.target.tokenizer, PairVocab())
    assert drafter_ids.tolist() == target_ids.tolist() == [0, 1, 2, 3, 4, 5]  # "a".."f"; no pair is a target token
    with pytest.raises(ValueError, match="shares 6 tokens with the target's; at least 256 are needed"):
        SharedVocabDrafter(None, tiny_models.target.tokenizer, PairVocab(), 6, 12)


@pytest.mark.parametrize("method, tree", [("mamba-chain", "3"), ("mamba-tree", "2,2,1")])
def test_greedy_with_the_shared_vocabulary_is_identical_to_target_alone(tiny_models, monkeypatch, method, tree):
    config = dict(max_new_tokens=40, temperature=0.0)
    ar = list(generate(tiny_models, PROMPT, GenerationConfig(method="ar", **config), chat=False))[-1]
    _with_drafter(monkeypatch, _shared)
    events = list(generate(tiny_models, PROMPT, GenerationConfig(method=method, tree=tree, **config), chat=False))
    assert events[-1].token_ids == ar.token_ids
    assert events[-1].accepted_tokens > 0


def _sample(models, monkeypatch, make) -> tuple[dict, int, set]:
    _with_drafter(monkeypatch, make)
    counts, accepted, drafted = {}, 0, set()
    for seed in range(RUNS):
        *rounds, summary = generate(models, PROMPT, GenerationConfig(method="mamba-tree", tree="3,2", temperature=1.0,
                                                                     max_new_tokens=N_NEW, seed=seed), chat=False)
        counts[tuple(summary.token_ids)] = counts.get(tuple(summary.token_ids), 0) + 1
        accepted += sum(r.accepted_len for r in rounds)
        drafted |= {n.token_id for r in rounds for n in r.nodes[1:]}
    return counts, accepted, drafted


def test_sampling_with_the_shared_vocabulary_is_exact(tiny_models, monkeypatch):
    counts, accepted, drafted = _sample(tiny_models, monkeypatch, _shared)
    assert accepted > RUNS * 0.1 and drafted <= set(range(6))
    assert _chi_square(counts, reference(tiny_models, 1.0), RUNS) > 1e-3


class UnnormalisedSampler(SharedVocabSampler):
    """The plausible bug: q restricted to the shared tokens but not renormalised (what the drafter's full
    distribution gave them), while the children are drawn from the restriction."""

    def children(self, logits, width):
        kids, restricted = super().children(logits, width)
        full = torch.softmax(logits.float(), -1)
        return kids, torch.where(self.allowed[: logits.shape[-1]], full, torch.zeros_like(full))


def test_the_check_rejects_q_left_unnormalised(tiny_models, monkeypatch):
    monkeypatch.setattr(cross, "SharedVocabSampler", UnnormalisedSampler)
    counts, accepted, _ = _sample(tiny_models, monkeypatch, _shared)
    assert accepted > RUNS * 0.1
    assert _chi_square(counts, reference(tiny_models, 1.0), RUNS) < 1e-6
