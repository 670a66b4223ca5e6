"""The pipeline of a drafter with a tokenizer of its own, on a tiny target with a real BPE: the tokenizer stage,
the answers re-encoded, training, resume, evaluation through the engine, export, and the exported folder loaded as
the `xmamba` kind."""

import json

import pytest
import torch

from specdec.config import WHOLE_SHAPES, GenerationConfig
from specdec.distill import teacher
from specdec.distill.cross import CrossPlugIn, convert_answers
from specdec.distill.evaluate import evaluate
from specdec.distill.export import export
from specdec.distill.teacher import load_shards
from specdec.distill.tokenizer import overlap, train_tokenizer
from specdec.distill.train import load_run, train
from specdec.engine import generate
from specdec.models import LoadedModel, Models, quantize_rows
from tests.test_xmamba import bpe
from tests.tiny import tiny_llama, write_corpus


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A corpus, a tiny target with a BPE of 300 tokens and its answers, and a drafter BPE of 280 from the corpus."""
    out = tmp_path_factory.mktemp("xdistill")
    folder = out / "corpus"
    write_corpus(folder, 6, 2, lambda domain, i: f"the dog sat on the {domain} {i}", "the cat sat on the mat. " * 30)
    target_tok = bpe(300)
    target_tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    model = tiny_llama(len(target_tok), seed=1)
    model.generation_config.eos_token_id = target_tok.eos_token_id
    for split in ("eval", "train"):
        teacher.generate_responses(model, target_tok, folder, out / "teacher", split, batch_size=4, shard_prompts=8,
                                   max_new_tokens=10, k=4)
    teacher.summarize(out / "teacher")
    tokenizer = train_tokenizer(folder, out / "tokenizer", 280, target_tok)
    return out, LoadedModel("tiny-target", model, target_tok, "tiny"), tokenizer


def test_the_tokenizer_keeps_the_targets_special_tokens_first_and_overlaps_it_partly(data):
    _, target, folder = data
    recipe = CrossPlugIn(str(folder), target_tokenizer=target.tokenizer)
    assert recipe.tokenizer.convert_ids_to_tokens([0, 1]) == ["<|endoftext|>", "<|im_start|>"]
    assert recipe.tokenizer.eos_token == target.tokenizer.eos_token
    shared = overlap(target.tokenizer, recipe.tokenizer)
    assert 0 < shared["of_drafter"] < 1 and len(recipe.tokenizer) == 280


def _answer(shard, lo: int, hi: int) -> list[int]:
    """The answer tokens of the sequence at [lo, hi) of a shard: those whose position is labelled."""
    return shard["tokens"][lo + 1:hi][shard["label"][lo:hi - 1]].tolist()


def test_answers_reach_the_drafter_as_the_same_text_in_its_tokens(data):
    out, target, folder = data
    recipe = CrossPlugIn(str(folder), target_tokenizer=target.tokenizer)
    shard = load_shards(out / "teacher" / "responses" / "train")[0]
    converted = convert_answers(shard, target.tokenizer, recipe.tokenizer)
    assert converted["domains"] == shard["domains"]
    for i in range(len(shard["domains"])):
        a, b = shard["starts"][i:i + 2].tolist()
        c, d = converted["starts"][i:i + 2].tolist()
        assert recipe.tokenizer.decode(converted["tokens"][c:d].tolist()) == target.tokenizer.decode(
            shard["tokens"][a:b].tolist())
        assert recipe.tokenizer.decode(_answer(converted, c, d)) == target.tokenizer.decode(_answer(shard, a, b))


def test_a_drafter_of_its_own_tokenizer_trains_resumes_evaluates_and_exports(data, tmp_path):
    out, target, folder = data
    from specdec.distill.recipe import TrainConfig, target_weights

    config = TrainConfig(arch="mamba", hidden=16, mamba_layers=1, minutes=10.0, max_tokens=4 * 16 * 2, seq_len=16,
                         batch_size=4, warmup=1, draft_vocab=0, eval_every=1, tokenizer=str(folder))
    run = out / "runs" / "x"
    embedding = target_weights(target.model)[0]
    train(out / "teacher", run, config, embedding, 280, target_tokenizer=target.tokenizer)
    config.max_tokens *= 2
    train(out / "teacher", run, config, None, 280, target_tokenizer=target.tokenizer)
    model, draft_ids, counters = load_run(run)
    assert counters["step"] == 4 and len(draft_ids) == 280 and counters["config"]["tokenizer"] == str(folder)
    curve = [json.loads(line) for line in (run / "curve.jsonl").read_text().splitlines()]
    assert len(curve) == 4 and 0 <= curve[-1]["acceptance"]["all"] <= 1

    report = evaluate(target, out / "teacher", run, 1, 8)
    assert report["engine"]["method"] == "xmamba-chain" and report["engine"]["identical"]
    exported = export(run, tmp_path / "xmamba-tiny", target.tokenizer, out / "teacher")
    card = (exported / "README.md").read_text()
    assert "tokenizer of its own" in card and "--tokenizer" in card and "Vocabulary overlap" in card
    assert not (exported / "draft_vocab.json").exists() and (exported / "tokenizer.json").is_file()

    models = Models.from_loaded(target, {})
    models.specs["xmamba"] = str(exported)
    prompt = "the dog sat on the mat"
    ar = list(generate(models, prompt, GenerationConfig(method="ar", max_new_tokens=12), chat=False))[-1]
    sd = list(generate(models, prompt, GenerationConfig(method="xmamba-ucb", max_new_tokens=12), chat=False))[-1]
    assert sd.token_ids == ar.token_ids
    loaded = models.drafter("xmamba").model.state_dict()  # the trained weights, in bf16, the embedding as int8 rows
    saved = {name: weight.to(torch.bfloat16) for name, weight in model.state_dict().items()}
    rows, scale = quantize_rows(saved["backbone.embeddings.weight"])
    saved["backbone.embeddings.weight"] = saved["lm_head.weight"] = rows.float() * scale  # tied; dequantized
    for name, weight in saved.items():
        assert torch.equal(loaded[name], weight.to(loaded[name].dtype)), name


def test_the_same_recipe_with_the_targets_tokenizer_is_an_ordinary_mamba_drafter(data, tmp_path):
    """The control beside a drafter of another tokenizer: the target's own tokenizer and a reduced head."""
    out, target, _ = data
    from specdec.distill.recipe import TrainConfig, target_weights

    same = tmp_path / "same-tokenizer"
    target.tokenizer.save_pretrained(same)
    config = TrainConfig(arch="mamba", hidden=16, mamba_layers=1, minutes=10.0, max_tokens=4 * 16 * 2, seq_len=16,
                         batch_size=4, warmup=1, draft_vocab=50, eval_every=2, tokenizer=str(same))
    run = out / "runs" / "same"
    train(out / "teacher", run, config, target_weights(target.model)[0], len(target.tokenizer),
          target_tokenizer=target.tokenizer)
    _, draft_ids, _ = load_run(run)
    assert len(draft_ids) == 50 and set(range(len(target.tokenizer.all_special_tokens))) <= set(draft_ids.tolist())
    evaluate(target, out / "teacher", run, 1, 8)
    exported = export(run, tmp_path / "same-export", target.tokenizer, out / "teacher")
    assert json.loads((exported / "draft_vocab.json").read_text())["token_ids"] == draft_ids.tolist()
    models = Models.from_loaded(target, {})
    models.specs["mamba"] = str(exported)
    ar = list(generate(models, "the cat sat", GenerationConfig(method="ar", max_new_tokens=12), chat=False))[-1]
    whole = GenerationConfig(method="mamba-chain", max_new_tokens=12, **WHOLE_SHAPES)  # an untrained drafter
    sd = list(generate(models, "the cat sat", whole, chat=False))[-1]
    assert sd.token_ids == ar.token_ids and sd.drafted_tokens > 0
