"""The `xmamba` kind end to end, as a user's hub pairing would load: a target folder and a Mamba drafter folder,
each with a byte-level BPE of its own (trained here, offline), loaded by the registry's loader."""

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from specdec.config import GenerationConfig
from specdec.drafters.cross import CrossTokenizerDrafter, SharedVocabDrafter
from specdec.engine import generate
from specdec.models import ModelLoadError, Models
from specdec.records import Summary
from tests.tiny import tiny_llama, tiny_mamba

TEXT = ("the cat sat on the mat and the dog sat on the log; a quick brown fox jumps over the lazy dog. "
        "speculative decoding drafts tokens that the target checks in one pass. ") * 20
PROMPT = "the dog sat on the"


def bpe(vocab_size: int) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([TEXT], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(target folder, drafter folder, a drafter folder without a tokenizer, a Llama drafter folder)."""
    root = tmp_path_factory.mktemp("xmamba")
    target_tok, drafter_tok = bpe(300), bpe(280)
    assert target_tok.get_vocab() != drafter_tok.get_vocab()
    target = tiny_llama(len(target_tok), seed=1)
    target.config.eos_token_id = target.generation_config.eos_token_id = None  # run to max_new_tokens
    target.save_pretrained(root / "target")
    target_tok.save_pretrained(root / "target")
    drafter = tiny_mamba(len(drafter_tok), seed=2)
    drafter.save_pretrained(root / "drafter")
    drafter_tok.save_pretrained(root / "drafter")
    drafter.save_pretrained(root / "bare")
    tiny_llama(len(drafter_tok), seed=3).save_pretrained(root / "llama")
    drafter_tok.save_pretrained(root / "llama")
    return root / "target", root / "drafter", root / "bare", root / "llama"


def _models(target, drafter) -> Models:
    return Models(target=str(target), drafters={"xmamba": str(drafter)}, device="cpu", dtype="float32")


def _run(models: Models, **config):
    records = list(generate(models, PROMPT, GenerationConfig(max_new_tokens=24, **config), chat=False))
    return records[:-1], records[-1]


@pytest.mark.parametrize("method, tree", [("xmamba-chain", "4"), ("xmamba-tree", "2,2,1"), ("xmamba-ucb", None)])
def test_a_drafter_of_another_tokenizer_loads_and_decodes_exactly(folders, method, tree):
    models = _models(*folders[:2])
    _, ar = _run(models, method="ar")
    rounds, sd = _run(models, method=method, tree=tree)
    assert isinstance(sd, Summary) and sd.token_ids == ar.token_ids
    assert sd.drafted_tokens > 0  # the mapping left branches to check
    assert all(r.mapping_ms is not None and r.mapping_ms >= 0 for r in rounds)
    assert all(r.mapping_ms is None for r in _run(models, method="ar")[0])


def test_sampling_with_another_tokenizer_drafts_the_shared_vocabulary(folders):
    models = _models(*folders[:2])
    loaded = models.drafter("xmamba")
    from specdec.drafters.cross import CrossMamba
    built = CrossMamba.build(loaded, models.target)
    assert isinstance(built.for_decoding(True), CrossTokenizerDrafter)
    assert isinstance(built.for_decoding(False), SharedVocabDrafter)
    rounds, sd = _run(models, method="xmamba-tree", tree="2,1", temperature=0.8, seed=5)
    assert sd.new_tokens == 24 and sd.drafted_tokens > 0
    shared = set(models.target.tokenizer.get_vocab()) & set(loaded.tokenizer.get_vocab())
    drafted = {models.target.tokenizer.convert_ids_to_tokens(n.token_id) for r in rounds for n in r.nodes[1:]}
    assert drafted <= shared  # every drafted node is a token both vocabularies hold


@pytest.mark.parametrize("which, message", [(2, "has no tokenizer of its own"), (3, "is a llama model, not mamba")])
def test_a_drafter_that_cannot_draft_across_tokenizers_is_refused_in_one_sentence(folders, which, message):
    with pytest.raises(ModelLoadError, match=message):
        _models(folders[0], folders[which]).drafter("xmamba")


def test_the_mapping_time_is_part_of_the_round(folders):
    rounds, _ = _run(_models(*folders[:2]), method="xmamba-chain", tree="4")
    assert all(0 <= r.mapping_ms <= r.round_ms for r in rounds)


def test_the_tree_view_shows_the_drafters_own_tokens_behind_each_node(folders):
    from demo.tree_svg import boxes

    rounds, _ = _run(_models(*folders[:2]), method="xmamba-tree", tree="2,2,1")
    drafted = [(r, n) for r in rounds for n in r.nodes[1:]]
    assert drafted and all(n.drafted_as for _, n in drafted)
    # the branch that added a node is, re-encoded, the target tokens from the root down to it and maybe more
    tokenizer = _models(*folders[:2]).target.tokenizer
    for r, n in drafted:
        path, node = [], n
        while node.parent >= 0:
            path.append(node.token_id)
            node = r.nodes[node.parent]
        assert "".join(n.drafted_as).startswith(tokenizer.decode(path[::-1]))
    tips = [b.tip for r in rounds for b in boxes(r)]
    assert any("from the drafter's own tokens" in tip for tip in tips)


def test_the_benchmark_reports_the_time_spent_mapping_between_tokenizers(folders):
    from specdec import bench

    prompts = [{"id": "p0", "kind": "chat", "prompt": PROMPT}, {"id": "p1", "kind": "chat", "prompt": "a quick brown"}]
    result = bench.benchmark(_models(*folders[:2]), prompts, ["ar", "xmamba-chain"], max_new_tokens=12,
                             log=lambda _: None)
    x, ar = result["methods"]["xmamba-chain"], result["methods"]["ar"]
    assert x["identical_to_ar"] and ar["mapping_ms_per_round"] is None
    assert x["mapping_ms_per_round"] > 0 and 0 < x["mapping_share_of_rounds"] < 1
    assert "mapping between the two tokenizers" in bench.markdown_table(result)
