"""Edges of a generation: EOS inside an accepted draft, multi-byte characters split across tokens, the context
limit with a Transformer drafter and with the lookup branch's depth, and prompt lookup's `find_continuation`."""

import pytest

from specdec.config import GenerationConfig
from specdec.drafters.lookup import find_continuation
from specdec.engine import Detokenizer, generate
from specdec.models import LoadedModel, Models
from tests.test_engine import run
from tests.tiny import tiny_llama


def first_draft_inside_a_round(rounds) -> tuple[int, int]:
    """(token, position in the output) of the first token that is emitted for the first time as an accepted
    draft with more tokens after it in its round."""
    seen, position = set(), 0
    for r in rounds:
        for i, token in enumerate(r.emitted):
            if token.token_id not in seen and token.source == "draft" and i < len(r.emitted) - 1:
                return token.token_id, position
            seen.add(token.token_id)
            position += 1
    raise AssertionError("no round accepted a draft with tokens after it")


def test_eos_inside_an_accepted_draft_ends_the_output_right_after_it(self_draft_models, monkeypatch):
    rounds, full = run(self_draft_models, method="tf-chain", tree="4", max_new_tokens=30)
    eos, position = first_draft_inside_a_round(rounds)
    monkeypatch.setattr(self_draft_models.target.model.generation_config, "eos_token_id", eos)
    rounds, sd = run(self_draft_models, method="tf-chain", tree="4", max_new_tokens=30)
    assert sd.stop_reason == "eos" and sd.token_ids == full.token_ids[:position + 1]
    last = rounds[-1].emitted[-1]
    assert (last.token_id, last.source) == (eos, "draft")  # the round's later drafts and bonus token are cut
    assert sum(len(r.emitted) for r in rounds) == sd.new_tokens == position + 1
    _, ar = run(self_draft_models, method="ar", max_new_tokens=30)
    assert ar.stop_reason == "eos" and ar.token_ids == sd.token_ids


TEXT = "Café naïve 😀 世界 👍🏽, ok"


def test_detokenizer_joins_characters_split_across_tokens(smollm2):
    tokenizer = smollm2.target.tokenizer  # SmolLM2's byte-level BPE
    ids = tokenizer(TEXT)["input_ids"]
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)  # byte-level BPE splits some characters
    detok = Detokenizer(tokenizer)
    pieces = [detok.add(i) for i in ids]
    assert "".join(pieces) == TEXT
    assert not any("\ufffd" in piece for piece in pieces)
    assert "" in pieces  # a token ending inside a character adds nothing until the character is complete


def test_a_transformer_drafters_context_limits_the_request(tiny_models):
    short = LoadedModel("tf-40", tiny_llama(6, seed=3, positions=40), tiny_models.target.tokenizer, "tiny")
    models = Models.from_loaded(tiny_models.target, {"mamba": tiny_models.drafter("mamba"), "transformer": short})
    prompt = "abcab" * 4  # 20 tokens

    def new_tokens(method: str, max_new_tokens: int) -> int:
        config = GenerationConfig(method=method, tree="2", max_new_tokens=max_new_tokens)
        return list(generate(models, prompt, config, chat=False))[-1].new_tokens

    with pytest.raises(ValueError, match="exceeds the context of 40 tokens"):
        new_tokens("tf-chain", 20)  # 20 + 20 new + 2 drafted > 40
    assert new_tokens("tf-chain", 14) == 14
    assert new_tokens("mamba-chain", 20) == 20  # a Mamba drafter has no context limit; the target's is 256


def test_the_lookup_branch_depth_counts_against_the_context(tiny_models):
    prompt = "abcab" * 48  # 240 tokens; the tiny target's context is 256

    def config(lookup_branch: int) -> GenerationConfig:
        return GenerationConfig(method="mamba-chain", tree="1", max_new_tokens=10, lookup_branch=lookup_branch)

    assert list(generate(tiny_models, prompt, config(0), chat=False))[-1].new_tokens == 10  # 240 + 10 + 1 drafted
    with pytest.raises(ValueError, match="exceeds the context of 256 tokens"):
        next(generate(tiny_models, prompt, config(8), chat=False))  # 240 + 10 + 8 copied > 256


@pytest.mark.parametrize("context, max_ngram, length, min_ngram, expected", [
    ([1, 2, 3, 1, 2], 3, 4, 1, [3, 1, 2]),  # the 2-gram "1 2" occurred at the start
    ([1, 2, 9, 1, 2, 7, 1, 2], 2, 3, 1, [7, 1, 2]),  # the latest earlier match wins
    ([3, 1, 2, 8, 4, 1, 2, 9, 3, 1, 2], 3, 2, 1, [8, 4]),  # the longest n-gram wins over a later shorter match
    ([3, 1, 2, 8, 4, 1, 2, 9, 3, 1, 2], 2, 2, 1, [9, 3]),  # ... which wins when n is capped at 2
    ([5, 6, 7, 6], 3, 2, 1, [7, 6]),  # only a 1-gram matches
    ([5, 6, 7, 6], 3, 2, 2, []),  # ... which is below min_ngram
    ([4, 4, 4], 2, 5, 1, [4]),  # overlapping match: the copy stops at the end of the context
    ([1, 2, 3], 3, 4, 1, []),  # nothing repeats
    ([7], 3, 4, 1, []),  # too short to have an earlier occurrence
])
def test_find_continuation(context, max_ngram, length, min_ngram, expected):
    assert find_continuation(context, max_ngram, length, min_ngram) == expected
