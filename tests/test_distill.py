"""The distillation pipeline on tiny random models: teacher shards, loss, resume, export round-trip."""

import json

import pytest
import torch
from transformers import DynamicCache

from specdec.distill import corpus, plugin, teacher
from specdec.distill.export import earlier_card, export, model_card, sampled_data
from specdec.distill.plugin import (PlugIn, build_drafter, draft_argmax, draft_logits, grow_layers, grow_state,
                                    mamba_hidden,
                                   save_drafter)
from specdec.distill.recipe import TrainConfig, distill_loss, greedy_acceptance, target_weights
from specdec.distill.train import load_run, read_segments, recipe_for, train
from specdec.drafters.mamba import MambaDrafter
from specdec.drafters.mixer import scan_sequence, selective_scan
from specdec.models import quantize_rows, read_folder_model
from tests.tiny import tiny_llama, write_corpus

VOCAB = 64
EOS = 2


class ByteTokenizer:
    """Bytes folded into a 64-id vocabulary, with a one-line chat template; EOS is id 2."""

    eos_token_id = EOS

    def __call__(self, text: str) -> dict:
        return {"input_ids": [3 + b % (VOCAB - 3) for b in text.encode()]}

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool, return_dict: bool) -> dict:
        return self("user: " + messages[0]["content"] + "\nassistant: ")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A corpus of 8 prompts per domain (2 held out) and some text, with teacher shards from a tiny Llama."""
    out = tmp_path_factory.mktemp("distill")
    folder = out / "corpus"
    write_corpus(folder, 8, 2, lambda domain, i: f"{domain} question {i} " * (1 + i % 3),
                 "some plain text to label. " * 40)
    model, tokenizer = tiny_llama(VOCAB, seed=1), ByteTokenizer()
    for split in ("eval", "train"):
        teacher.generate_responses(model, tokenizer, folder, out / "teacher", split, batch_size=4, shard_prompts=8,
                                   max_new_tokens=6, k=4)
    teacher.label_text(model, tokenizer, folder, out / "teacher", window=32, batch_size=4, shard_windows=8, k=4)
    return out, model, tokenizer


def train_on_target(teacher_dir, run, config: TrainConfig, target):
    """`train` given the target's E and H, as the CLI gives them (what the feature recipe reads)."""
    embedding, head = target_weights(target)
    return train(teacher_dir, run, config, embedding, len(embedding), head)


def test_prompts_are_reproducible_and_held_out():
    first, second = corpus.build_prompts(12, 3, seed=5), corpus.build_prompts(12, 3, seed=5)
    assert first == second
    train_texts = {p.text for p in first if p.split == "train"}
    evals = [p for p in first if p.split == "eval"]
    assert len(evals) == 3 * len(corpus.DOMAINS) and not train_texts & {p.text for p in evals}



def test_long_prompts_are_reproducible_held_out_and_long():
    first, second = corpus.long_prompts(20, 6, seed=3), corpus.long_prompts(20, 6, seed=3)
    assert first == second and {p.domain for p in first} == {corpus.LONG_DOMAIN}
    evals = [p for p in first if p.split == "eval"]
    assert len(evals) == 6 and len(first) == 26 and not {p.text for p in evals} & {p.text for p in first[6:]}
    docs = corpus.long_documents()
    words = lambda text: " ".join(text.split())  # noqa: E731
    split_docs = {split: [words(text) for key, text in docs if corpus.held_out(key) == (split == "eval")]
                  for split in ("train", "eval")}
    for prompt in first:
        template = next(t for t in corpus.LONG_TEMPLATES if all(part in prompt.text for part in t.split("{text}")))
        passage = prompt.text.replace(template.split("{text}")[0], "", 1).replace(template.split("{text}")[1], "")
        assert corpus.LONG_CHARS[0] // 2 <= len(passage) <= corpus.LONG_CHARS[1]
        # an eval passage comes from a held-out document, a training passage from another
        assert any(words(passage) in text for text in split_docs[prompt.split])


def test_long_documents_leave_out_the_measured_licences():
    from specdec.passages import MEASURED_LICENCES, MEASURED_OVERLAP, LICENCES_FOLDER, licence_text, overlap, \
        shingles

    if not all((LICENCES_FOLDER / name).is_file() for name in MEASURED_LICENCES):
        pytest.skip("this system has no copies of the measured licences to hold out")
    measured = set().union(*(shingles(licence_text(name)) for name in MEASURED_LICENCES))
    docs = corpus.long_documents()
    assert docs and all(len(text) >= corpus.LONG_DOC_CHARS for _, text in docs)
    assert max(overlap(text, measured) for _, text in docs) <= MEASURED_OVERLAP
    assert not {f"licence:{name}" for name in MEASURED_LICENCES} & {key for key, _ in docs}
    if (LICENCES_FOLDER / "LGPL-2.1").is_file():  # the filter has work to do: GPL-2's close relative is left out
        assert overlap(licence_text("LGPL-2.1"), measured) > 0.2 and "licence:LGPL-2.1" not in {k for k, _ in docs}


def test_licence_prompts_are_the_start_of_each_measured_licence(tmp_path):
    from specdec.passages import LICENCE_CHARS, MEASURED_LICENCES, licence_prompts

    for name in MEASURED_LICENCES:
        (tmp_path / name).write_text("\n\n".join(f"{name} clause {i}: " + "word " * 100 for i in range(60)))
    prompts = licence_prompts(tmp_path)
    assert [p["id"] for p in prompts] == [f"licence-{name}" for name in MEASURED_LICENCES]
    for prompt, name in zip(prompts, MEASURED_LICENCES):
        assert f"{name} clause 0:" in prompt["prompt"] and f"{name} clause 59:" not in prompt["prompt"]
        assert LICENCE_CHARS <= len(prompt["prompt"]) < LICENCE_CHARS + 700
    (tmp_path / "GPL-1").unlink()
    with pytest.raises(ValueError, match="no licence text at"):
        licence_prompts(tmp_path)

def test_teacher_labels_are_the_greedy_answer(data):
    out, _, _ = data
    for shard in teacher.load_shards(out / "teacher" / "responses" / "train"):
        pos = shard["label"][:-1].nonzero()[:, 0]
        assert torch.equal(shard["topk_ids"][pos, 0].long(), shard["tokens"][pos + 1].long())
        assert (shard["topk_logp"][pos, 0] >= shard["topk_logp"][pos, 1]).all()


def test_the_prompt_labels_are_scored_a_block_at_a_time(data, monkeypatch):
    """A prompt longer than `LOGIT_BLOCK` gets the top-k that scoring all its positions at once gives."""
    _, model, tokenizer = data
    prompts = [corpus.Prompt("a", "chat", "train", "a longer question " * 3), corpus.Prompt("b", "code", "train", "b")]
    whole = teacher.generate_batch(model, tokenizer, prompts, max_new_tokens=4, k=4)
    monkeypatch.setattr(teacher, "LOGIT_BLOCK", 5)
    blocks = teacher.generate_batch(model, tokenizer, prompts, max_new_tokens=4, k=4)
    assert len(whole[0]["tokens"]) > 3 * 5
    for a, b in zip(whole, blocks):
        assert torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["topk_ids"], b["topk_ids"])
        assert torch.allclose(a["topk_logp"].float(), b["topk_logp"].float(), atol=1e-3)

def test_teacher_resumes_without_redoing_shards(data):
    out, model, tokenizer = data
    written = teacher.generate_responses(model, tokenizer, out / "corpus", out / "teacher", "train", batch_size=4,
                                         shard_prompts=8, max_new_tokens=6, k=4)
    assert written == 0
    assert teacher.label_text(model, tokenizer, out / "corpus", out / "teacher", 32, 4, 8, 4) == 0


def test_the_teacher_accepts_all_of_its_own_greedy_tokens(data):
    out, model, _ = data
    held_out = teacher.load_shards(out / "teacher" / "responses" / "eval")
    report = greedy_acceptance(PlugIn("transformer"), model, held_out, torch.arange(VOCAB))
    assert report["all"] == 1.0 and set(report) == set(corpus.DOMAINS) | {"all"}


def test_loss_is_soft_cross_entropy_on_the_draft_vocabulary():
    logits = torch.randn(2, 3, 5)  # draft head over V_d = ids [1, 4, 5, 7, 9]
    lut = torch.full((10,), -1)
    lut[torch.tensor([1, 4, 5, 7, 9])] = torch.arange(5)
    topk_ids = torch.tensor([[[4, 2], [9, 1], [5, 7]]] * 2)  # id 2 lies outside V_d
    topk_logp = torch.log(torch.tensor([[[0.6, 0.4], [0.5, 0.5], [0.9, 0.1]]] * 2))
    label = torch.tensor([[True, True, False]] * 2)
    p = torch.zeros(2, 3, 5)
    p[:, 0, 1] = 1.0  # id 4 renormalised alone
    p[:, 1, 4], p[:, 1, 0] = 0.5, 0.5
    expected = -(p * torch.log_softmax(logits, -1)).sum(-1)[:, :2].mean()
    assert torch.allclose(distill_loss(logits, label, topk_ids, topk_logp, lut), expected)


@pytest.mark.parametrize("arch", ["mamba", "transformer"])
def test_train_resumes_and_exports_a_loadable_drafter(data, tmp_path, arch):
    out, _, _ = data
    config = TrainConfig(arch=arch, hidden=16, mamba_layers=1, tf_layers=1, minutes=10.0, max_tokens=4 * 16 * 2,
                         seq_len=16, batch_size=4, warmup=1, draft_vocab=20, eval_every=1)
    run = tmp_path / arch
    train(out / "teacher", run, config, torch.randn(VOCAB, 24), VOCAB)
    curve = [json.loads(line) for line in (run / "curve.jsonl").read_text().splitlines()]
    assert [point["step"] for point in curve] == [1, 2] and "all" in curve[-1]["acceptance"]
    config.max_tokens *= 2  # a larger budget: the run continues from step 2, it does not restart
    train(out / "teacher", run, config, None, VOCAB)
    train(out / "teacher", run, config, None, VOCAB)  # budget spent: a plain resume trains nothing, logs nothing
    model, draft_ids, counters = load_run(run)
    assert counters["step"] == 4 and len(draft_ids) == 20
    segments = read_segments(run)
    assert [(s["from_step"], s["max_tokens"]) for s in segments] == [(0, 128), (2, 256)]

    report = {"teacher_forced": {"all": 0.25, "code": 0.25}, "coverage": 0.9,
              "latency_ms": {"drafter_fp32": 1.0, "drafter_bf16": 1.0, "target_fp32": 10.0, "ratio_fp32": 0.1}}
    card = model_card(arch, run, report, counters, teacher.summarize(out / "teacher"), 1000, 10)
    trains = [line for line in card.splitlines() if line.startswith("python -m specdec.distill train")]
    assert [line.split("--max-tokens ")[1].split()[0] for line in trains] == ["128", "256"]
    assert "continued" in card

    folder = save_drafter(model, draft_ids, None, tmp_path / f"{arch}-export")
    loaded = read_folder_model(folder, torch.bfloat16)
    expected = model.to(torch.bfloat16)  # what was saved: bf16, its embedding as int8 rows
    rows, scale = quantize_rows(expected.get_input_embeddings().weight)
    expected.get_input_embeddings().weight.data.copy_(rows.float() * scale)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, expected(ids).logits)
    assert json.loads((folder / "draft_vocab.json").read_text())["token_ids"] == draft_ids.tolist()


def test_a_warm_started_runs_card_ends_with_the_card_it_began_from(tmp_path):
    """`export` appends the card of the `--init` folder below the new run's, each heading one level down (to 6 at
    most), so a drafter trained in rounds keeps every round's sections; lines inside code blocks stay as they are."""
    folder = tmp_path / "round1"
    folder.mkdir()
    (folder / "README.md").write_text("# drafter\n\nWhat it is.\n\n## Data\n- shards\n\n## Reproduce\n```\n"
                                      "# a comment in a command block\npython -m specdec.distill train\n```\n"
                                      "###### deepest\n")
    assert earlier_card(str(folder)) == (f"\n## Before this run: the card of `{folder}`\n\nWhat it is.\n\n"
                                         "### Data\n- shards\n\n### Reproduce\n```\n# a comment in a command block"
                                         "\npython -m specdec.distill train\n```\n###### deepest\n")
    assert earlier_card(None) == earlier_card(str(tmp_path / "no-card")) == ""  # a fresh run, a folder without one


@pytest.mark.parametrize("arch", ["mamba", "transformer"])
def test_the_greedy_guess_scored_in_blocks_is_the_whole_logits_argmax(arch, monkeypatch):
    """`draft_argmax` (the held-out figure's guess) scores a block of positions at a time: the same tokens as the
    argmax of the whole `draft_logits`, mapped through the draft vocabulary, across block edges."""
    torch.manual_seed(0)
    model = build_drafter(TrainConfig(arch=arch, hidden=16, mamba_layers=2, tf_layers=2), VOCAB).eval()
    ids, draft_ids = torch.randint(0, VOCAB, (3, 23)), torch.arange(1, VOCAB, 2)
    monkeypatch.setattr(plugin, "GUESS_BLOCK", 5)
    with torch.no_grad():
        whole = draft_ids[draft_logits(model, ids, draft_ids).argmax(-1)]
        blocks = draft_argmax(model, ids, draft_ids)
    assert blocks.shape == (3, 23) and torch.equal(blocks, whole)
    assert set(blocks.flatten().tolist()) <= set(draft_ids.tolist())


@pytest.mark.parametrize("arch", ["mamba", "transformer"])
def test_grown_layers_start_as_the_identity_and_then_learn(arch):
    """`train --init FOLDER --grow-layers N`: the appended layers leave the drafter's logits as they were, and a
    training step moves them (their output projection gets a gradient)."""
    torch.manual_seed(0)
    model = build_drafter(TrainConfig(arch=arch, hidden=16, mamba_layers=2, tf_layers=2), VOCAB).eval()
    ids = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        before = model(ids).logits
    grow_layers(model, 2)
    layers = model.backbone.layers if arch == "mamba" else model.model.layers
    assert len(layers) == model.config.num_hidden_layers == 4
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, before, atol=1e-6)
    model.train()
    model(ids).logits.logsumexp(-1).mean().backward()
    grown = layers[3].mixer.out_proj if arch == "mamba" else layers[3].mlp.down_proj
    assert grown.weight.grad is not None and grown.weight.grad.abs().sum() > 0


def test_a_grown_state_starts_as_the_same_drafter_and_then_learns(tmp_path):
    """`train --init FOLDER --grow-state N`: every layer's state widens, the logits stay as they were (the new
    channels are never read), a training step gives the new read-out a gradient, and the engine's recurrent step
    runs the widened drafter as its sequence pass does."""
    torch.manual_seed(0)
    model = build_drafter(TrainConfig(arch="mamba", hidden=16, mamba_layers=2), VOCAB).eval()
    ids = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        before = model(ids).logits
    grow_state(model, 40)
    assert model.config.state_size == 40
    for block in model.backbone.layers:
        assert block.mixer.A_log.shape == (32, 40) and block.mixer.x_proj.weight.shape == (1 + 80, 32)
        assert torch.allclose(block.mixer.A_log[:, 16:].exp(), torch.arange(17, 41).float().expand(32, -1))
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, before, atol=1e-6)
        assert torch.allclose(mamba_hidden(model, ids), model.backbone(input_ids=ids).last_hidden_state, atol=1e-5)
    model.train()
    model(ids).logits.logsumexp(-1).mean().backward()
    read_out = model.backbone.layers[1].mixer.x_proj.weight.grad[1 + 40 + 16:]  # the new channels' C rows
    assert read_out.abs().sum() > 0
    with pytest.raises(ValueError, match="already has 40"):
        grow_state(model, 32)
    model.eval()
    drafter = MambaDrafter.from_folder(model, VOCAB, None)
    state = drafter.stack.zeros(1, drafter.device)
    with torch.no_grad():
        stepped = torch.stack([drafter.step(ids[:1, t], state) for t in range(ids.shape[1])], dim=1)
        assert torch.allclose(stepped[0], model(ids[:1]).logits[0], atol=1e-4)


@pytest.mark.parametrize("arch", ["mamba", "transformer"])
def test_a_plug_in_warm_start_begins_from_the_exported_drafter(data, tmp_path, arch):
    """`train --arch mamba --init FOLDER` (e.g. to continue the shipped drafter on longer windows): the fresh run
    takes the folder's weights, size and draft vocabulary, logs a step-0 point before training, and moves on."""
    out, _, _ = data
    budget = dict(max_tokens=4 * 16 * 2, seq_len=16, batch_size=4, warmup=1, eval_every=1)
    train(out / "teacher", tmp_path / "first", TrainConfig(arch=arch, hidden=16, mamba_layers=2, tf_layers=2,
                                                             draft_vocab=20, **budget), torch.randn(VOCAB, 24), VOCAB)
    model, draft_ids, _ = load_run(tmp_path / "first")
    folder = save_drafter(model, draft_ids, None, tmp_path / "exported")
    run = tmp_path / "warm"
    train(out / "teacher", run, TrainConfig(arch=arch, init=str(folder), **budget), None, VOCAB)  # defaults: 256 wide
    start, *trained = [json.loads(line) for line in (run / "curve.jsonl").read_text().splitlines()]
    assert (start["step"], start["loss"]) == (0, None) and [p["step"] for p in trained] == [1, 2]
    warm, warm_ids, counters = load_run(run)
    exported = read_folder_model(folder, torch.float32)
    assert (warm.config.hidden_size, warm.config.num_hidden_layers) == (16, 2) and torch.equal(warm_ids, draft_ids)
    assert counters["config"]["hidden"] == 16 and counters["config"]["draft_vocab"] == 20
    assert not torch.equal(warm.get_input_embeddings().weight, exported.get_input_embeddings().weight.float())
    other = "transformer" if arch == "mamba" else "mamba"
    with pytest.raises(SystemExit, match=f"not a {other} drafter"):
        train(out / "teacher", tmp_path / "other", TrainConfig(arch=other, init=str(folder), **budget), None, VOCAB)


def test_a_warm_start_with_a_grown_state_trains_and_resumes_at_its_size(data, tmp_path):
    """The run records the widened state, so its checkpoint restores (a resumed segment, `load_run`) at that size."""
    out, _, _ = data
    budget = dict(max_tokens=4 * 16 * 2, seq_len=16, batch_size=4, warmup=1, eval_every=1)
    model = build_drafter(TrainConfig(arch="mamba", hidden=16, mamba_layers=2), VOCAB)
    folder = save_drafter(model, torch.arange(VOCAB), None, tmp_path / "exported")
    run = tmp_path / "wide"
    train(out / "teacher", run, TrainConfig(arch="mamba", init=str(folder), grow_state=24, **budget), None, VOCAB)
    train(out / "teacher", run, TrainConfig(arch="mamba", init=str(folder), grow_state=24,
                                            **{**budget, "max_tokens": 4 * 16 * 3}), None, VOCAB)
    wide, _, counters = load_run(run)
    assert wide.config.state_size == 24 and counters["config"]["state_size"] == 24 and counters["step"] == 3


def test_trainable_mamba_forward_matches_the_reference():
    config = TrainConfig(arch="mamba", hidden=16, mamba_layers=2)
    model = build_drafter(config, VOCAB).eval()
    ids = torch.randint(0, VOCAB, (2, 11))
    with torch.no_grad():
        assert torch.allclose(mamba_hidden(model, ids), model.backbone(input_ids=ids).last_hidden_state, atol=1e-5)


def test_selective_scan_and_its_backward():
    """Values and last state against the recurrence written out step by step and against the reference scan;
    gradients (all five inputs) against finite differences, so a wrong term in the hand-written backward fails."""
    g = torch.Generator().manual_seed(0)
    b, d, n, length = 2, 3, 4, 6
    x = torch.randn(b, length, d, dtype=torch.double, generator=g, requires_grad=True)
    dt = torch.rand(b, length, d, dtype=torch.double, generator=g).add(0.1).requires_grad_()
    A = (-torch.rand(d, n, dtype=torch.double, generator=g) * 2).requires_grad_()
    B = torch.randn(b, length, n, dtype=torch.double, generator=g, requires_grad=True)
    C = torch.randn(b, length, n, dtype=torch.double, generator=g, requires_grad=True)
    h, expected = torch.zeros(b, d, n, dtype=torch.double), []
    for t in range(length):
        h = torch.exp(dt[:, t, :, None] * A) * h + (dt[:, t] * x[:, t])[..., None] * B[:, None, t]
        expected.append((h * C[:, None, t]).sum(-1))
    y, last = selective_scan(x, dt, A, B, C)
    torch.testing.assert_close(y, torch.stack(expected, 1))
    torch.testing.assert_close(last, h)
    with torch.no_grad():
        reference = scan_sequence(x, dt, A, B, C)
    torch.testing.assert_close(y, reference[0])
    torch.testing.assert_close(last, reference[1])
    assert not last.requires_grad
    assert torch.autograd.gradcheck(lambda *inputs: selective_scan(*inputs)[0], (x, dt, A, B, C))


def test_batched_greedy_decoding_matches_generate(data):
    _, model, _ = data
    prompt = torch.tensor([[2, 2, 9, 8, 7], [5, 6, 7, 8, 9]])  # row 0 left-padded with EOS
    mask = (torch.arange(5) >= torch.tensor([[2], [0]])).long()
    _, _, answer_ids, _, tokens = teacher.decode(model, prompt, mask, 6, 3, eos=63)
    expected = model.generate(input_ids=prompt, attention_mask=mask, max_new_tokens=6, do_sample=False,
                              pad_token_id=63)[:, 5:]
    assert torch.equal(answer_ids[:, :, 0].long(), expected) and torch.equal(tokens, expected)


def test_rows_that_finish_leave_the_batch_and_the_others_decode_as_alone(data):
    _, model, _ = data
    prompt = torch.tensor([[2, 2, 2, 9, 8, 7], [5, 6, 7, 8, 9, 4], [2, 3, 4, 5, 6, 7]])
    mask = (torch.arange(6) >= torch.tensor([[3], [0], [1]])).long()  # rows 0 and 2 left-padded
    probe = teacher.decode(model, prompt, mask, 8, 3, eos=VOCAB)[4]  # an id no row can emit: nobody stops
    eos = int(probe[1, 1])  # row 1 stops after its second token and leaves the batch; the others go on
    assert eos not in probe[0, :2].tolist() and eos not in probe[2, :2].tolist()
    _, _, answer_ids, answer_logp, tokens = teacher.decode(model, prompt, mask, 8, 3, eos=eos)
    for row in range(3):
        start = int(mask[row].argmax())
        alone = teacher.decode(model, prompt[row:row + 1, start:], mask[row:row + 1, start:], 8, 3, eos=eos)
        answer = alone[4][0].tolist()
        n = answer.index(eos) + 1 if eos in answer else len(answer)
        assert tokens[row, :n].tolist() == answer[:n]
        assert torch.equal(answer_ids[row, :n], alone[2][0, :n])
        torch.testing.assert_close(answer_logp[row, :n].float(), alone[3][0, :n].float(), atol=1e-3, rtol=0)
    assert tokens[1, :2].tolist()[-1] == eos and (tokens[1, 2:] == eos).all()  # padding after its EOS


def test_budget_batches_keep_rows_and_padded_positions_within_their_caps():
    lengths = [10, 10, 12, 20, 30, 30, 90, 200]
    cuts = list(teacher.budget_batches(lengths, rows=3, tokens=64))
    assert [lengths[c] for c in cuts] == [[10, 10, 12], [20, 30], [30], [90], [200]]
    for cut in cuts:  # a batch pays rows x its longest; alone, a prompt past the budget still gets one
        assert len(lengths[cut]) <= 3 and (len(lengths[cut]) * max(lengths[cut]) <= 64 or len(lengths[cut]) == 1)


def test_the_reserved_cache_decodes_as_the_growing_one(data):
    _, model, _ = data
    prompt = torch.tensor([[2, 2, 9, 8, 7], [5, 6, 7, 8, 9]])
    mask = (torch.arange(5) >= torch.tensor([[2], [0]])).long()
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        logits = []
        for cache in (DynamicCache(config=model.config), teacher.reserved_cache(model, 8)):
            out = model(input_ids=prompt, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
            grown = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            step = model(input_ids=out.logits[:, -1:].argmax(-1), attention_mask=grown,
                         position_ids=positions[:, -1:] + 1, cache=cache, use_cache=True)
            logits.append(step.logits)
        assert isinstance(cache.layers[0], teacher.ReservedLayer) and cache.get_seq_length() == 6
        torch.testing.assert_close(logits[0], logits[1])
        with pytest.raises(ValueError, match="reserved for 8"):
            model(input_ids=torch.zeros(2, 3, dtype=torch.long), cache=cache, use_cache=True)


def test_sampled_passes_label_other_answers_with_the_untempered_law(data, tmp_path):
    out, model, tokenizer = data
    common = dict(batch_size=4, shard_prompts=8, max_new_tokens=6, k=4)
    teacher_dir = tmp_path / "teacher"
    # 24 training prompts = 3 shards a pass; a total cap of 4 shards is all of pass 0 and the first of pass 1
    teacher.generate_sampled(model, tokenizer, out / "corpus", teacher_dir, 3, 1.5, max_shards=4, **common)
    passes = [teacher.load_shards(teacher_dir / "responses" / teacher.sampled_folder(1.5, i)) for i in range(3)]
    assert [len(shards) for shards in passes] == [3, 1, 0]
    greedy = teacher.load_shards(out / "teacher" / "responses" / "train")
    sampled = passes[0]
    assert any(not torch.equal(g["tokens"], s["tokens"]) for g, s in zip(greedy, sampled))
    for shard in sampled:  # each answer position holds the target's own top-k after the sampled prefix
        for a, b in zip(shard["starts"][:-1].tolist(), shard["starts"][1:].tolist()):
            with torch.no_grad():
                logits = model(shard["tokens"][a:b][None].long()).logits[0]
            ids, logp = teacher.top_k_logp(logits, 4)
            known = shard["known"][a:b]
            assert torch.equal(ids[known], shard["topk_ids"][a:b][known])
            torch.testing.assert_close(logp[known].float(), shard["topk_logp"][a:b][known].float(), atol=2e-2, rtol=0)
    # a shard written again (a resumed pass) is the same shard
    path = teacher_dir / "responses" / teacher.sampled_folder(1.5, 0) / "shard_00001.pt"
    path.unlink()
    teacher.generate_sampled(model, tokenizer, out / "corpus", teacher_dir, 1, 1.5, **common)
    assert torch.equal(torch.load(path, weights_only=False)["tokens"], sampled[1]["tokens"])
    # training reads the greedy and sampled answers, and its segment names both
    for folder in ("train", "eval"):
        (teacher_dir / "responses" / folder).mkdir(exist_ok=True)
    for i, shard in enumerate(greedy):
        teacher.save_shard(teacher_dir / "responses" / "train" / f"shard_{i:05d}.pt", shard)
    # a second temperature's pass of one shard, and a third's folder not yet written to (not read, not named)
    (teacher_dir / "responses" / teacher.sampled_folder(0.5, 0)).mkdir()
    (teacher_dir / "responses" / teacher.sampled_folder(2.0, 0)).mkdir()
    teacher.save_shard(teacher_dir / "responses" / teacher.sampled_folder(2.0, 0) / "shard_00000.pt", sampled[0])
    config = TrainConfig(arch="transformer", hidden=16, tf_layers=1, max_tokens=64, seq_len=16, batch_size=4,
                         warmup=1, draft_vocab=20, eval_every=1)
    train(teacher_dir, tmp_path / "run", config, None, VOCAB)
    (segment,) = read_segments(tmp_path / "run")
    assert (segment["response_shards"], segment["text_shards"]) == (3, 0)
    assert segment["sampled"] == [{"temperature": 1.5, "passes": 2, "shards": 4},
                                  {"temperature": 2.0, "passes": 1, "shards": 1}]
    old_segment = {"sampled_passes": 1, "sampled_shards": 5, "sampling_temperature": 0.9}  # logged before 2026-12-07
    assert sampled_data(old_segment) == [{"temperature": 0.9, "passes": 1, "shards": 5}]
    _, _, counters = load_run(tmp_path / "run")
    report = {"teacher_forced": {"all": 0.25}, "coverage": 0.9,
              "latency_ms": {"drafter_fp32": 1.0, "drafter_bf16": 1.0, "target_fp32": 10.0, "ratio_fp32": 0.1}}
    card = model_card("tf", tmp_path / "run", report, counters, teacher.summarize(teacher_dir), 1000, 10)
    assert "teacher --response-shards 3 --text-shards 0 --sampled-passes 2 --sampling-temperature 1.5 " \
           "--sampled-shards 4\n" in card
    assert "teacher --response-shards 3 --text-shards 0 --sampled-passes 1 --sampling-temperature 2 " \
           "--sampled-shards 1\n" in card and "temperature 0.5" not in card
    # shards the teacher wrote after the run read its data are listed as not read
    teacher.save_shard(teacher_dir / "responses" / "train" / "shard_00003.pt", greedy[0])
    (teacher_dir / "responses" / teacher.sampled_folder(2.0, 1)).mkdir()
    teacher.save_shard(teacher_dir / "responses" / teacher.sampled_folder(2.0, 1) / "shard_00000.pt", sampled[0])
    card = model_card("tf", tmp_path / "run", report, counters, teacher.summarize(teacher_dir), 1000, 10)
    (line,) = [x for x in card.splitlines() if x.startswith("- `responses/train`")]
    assert line.endswith("in 4 shards (" + line.split(" (")[1].split(")")[0] + "); this run read the first 3")
    (line,) = [x for x in card.splitlines() if x.startswith("- `responses/train-t2-0`")]
    assert "this run read" not in line
    (line,) = [x for x in card.splitlines() if x.startswith("- `responses/train-t2-1`")]  # a later pass
    assert line.endswith("; this run read none of them")
    # the card's train line rebuilds a drafter of this run's size
    from specdec.distill.__main__ import parser

    (line,) = [x for x in card.splitlines() if x.startswith("python -m specdec.distill train ")]
    args = parser().parse_args(line.split()[3:])
    assert (args.arch, args.hidden, args.layers, args.train_batch) == ("transformer", 16, 1, 4)


def test_coverage_of_the_draft_vocabulary(data):
    from specdec.distill.evaluate import coverage

    held_out = teacher.load_shards(data[0] / "teacher" / "responses" / "eval")
    assert coverage(held_out, torch.arange(VOCAB)) == 1.0


def test_feature_drafter_trains_resumes_and_matches_the_engine_drafter(data, tmp_path):
    """`--arch mamba-feat`: features beside every shard (the labelling pass keeps them too), training that
    resumes, and a trained drafter whose teacher-forced path equals the engine's step-by-step drafting."""
    from specdec.distill.feat import add_features, guesses
    from specdec.drafters.mamba_feat import MambaFeatDrafter

    out, model, tokenizer = data
    teacher_dir = tmp_path / "teacher"
    teacher.label_text(model, tokenizer, out / "corpus", teacher_dir, window=32, batch_size=4, shard_windows=8, k=4,
                       features=True)
    text_shard = next((teacher_dir / "text").glob("shard_*.pt"))
    with torch.no_grad():  # the kept features are the target's last hidden state of the same tokens
        tokens = torch.load(text_shard, weights_only=False)["tokens"][:32].long()
        expected = model.base_model(input_ids=tokens[None]).last_hidden_state[0]
    assert torch.allclose(torch.load(teacher.features_path(text_shard))[:32].float(), expected, atol=0.05)
    eval_dir = teacher_dir / "responses" / "eval"
    eval_dir.mkdir(parents=True)
    for shard in (out / "teacher" / "responses" / "eval").glob("shard_*.pt"):
        (eval_dir / shard.name).write_bytes(shard.read_bytes())
    assert add_features(model, eval_dir) > 0 and add_features(model, eval_dir) == 0  # resumable: nothing redone

    config = TrainConfig(arch="mamba-feat", hidden=16, mamba_layers=1, minutes=10.0, max_tokens=4 * 16 * 2,
                         seq_len=16, batch_size=4, warmup=1, draft_vocab=20, eval_every=1)
    run = tmp_path / "feat-run"
    train_on_target(teacher_dir, run, config, model)
    curve = [json.loads(line) for line in (run / "curve.jsonl").read_text().splitlines()]
    assert [point["step"] for point in curve] == [1, 2] and set(curve[-1]["acceptance"]) == {"real", "guessed"}
    config.max_tokens *= 2
    train_on_target(teacher_dir, run, config, model)
    drafter_model, draft_ids, counters = load_run(run)
    assert counters["step"] == 4 and len(draft_ids) == 20

    drafter = MambaFeatDrafter(drafter_model, model, draft_ids)
    ids = [5, 9, 12, 7, 30, 3]
    with torch.no_grad():
        features = model.base_model(input_ids=torch.tensor([ids])).last_hidden_state[0]
        previous = torch.cat([torch.zeros(1, features.shape[1]), features[:-1]])[None]
        trained_path = guesses(drafter_model, model.get_input_embeddings().weight, torch.tensor([ids]), previous)
    drafter.start(ids, 4, features=features[:-1])
    assert torch.allclose(drafter.guesses[0].float(), trained_path[0, -1], atol=1e-4)


def feat_teacher(data, tmp_path):
    """Teacher data with features under `tmp_path/teacher`: the labelled text and the held-out answers."""
    from specdec.distill.feat import add_features

    out, model, tokenizer = data
    teacher_dir = tmp_path / "teacher"
    teacher.label_text(model, tokenizer, out / "corpus", teacher_dir, window=32, batch_size=4, shard_windows=8, k=4,
                       features=True)
    eval_dir = teacher_dir / "responses" / "eval"
    eval_dir.mkdir(parents=True)
    for shard in (out / "teacher" / "responses" / "eval").glob("shard_*.pt"):
        (eval_dir / shard.name).write_bytes(shard.read_bytes())
    add_features(model, eval_dir)
    teacher.summarize(teacher_dir)  # as the `teacher` stage ends
    return teacher_dir


def test_feature_drafter_evaluates_and_exports_a_loadable_folder(data, tmp_path):
    """evaluate -> export for `--arch mamba-feat` on tiny models: a card with the measured figures and a folder the
    engine's loader takes."""
    from specdec.distill.evaluate import evaluate
    from specdec.drafters.mamba_feat import load_feat_drafter
    from specdec.models import LoadedModel

    out, model, tokenizer = data
    teacher_dir = feat_teacher(data, tmp_path)
    (tmp_path / "corpus").symlink_to(out / "corpus")
    config = TrainConfig(arch="mamba-feat", hidden=16, mamba_layers=1, max_tokens=4 * 16 * 2, seq_len=16,
                         batch_size=4, warmup=1, draft_vocab=20, eval_every=1)
    run = tmp_path / "runs" / "feat"
    train_on_target(teacher_dir, run, config, model)
    class Decoding(ByteTokenizer):  # what the engine's detokenizer needs besides
        def decode(self, ids, skip_special_tokens=False):
            return "".join(chr(32 + i) for i in ids)

    target = LoadedModel("tiny", model, Decoding(), "tiny")
    report = evaluate(target, teacher_dir, run, prompts_per_domain=1, max_new_tokens=6)
    assert report["engine"]["identical"] and report["engine"]["prompts"] == 4
    assert 0 <= report["teacher_forced"]["real"] <= 1 and report["latency_ms"]["drafter_bf16"] > 0
    folder = export(run, tmp_path / "export", target.tokenizer, teacher_dir)
    card = (folder / "README.md").read_text()
    assert f"| {report['teacher_forced']['real']:.3f} |" in card and "--arch mamba-feat" in card
    assert load_feat_drafter(str(folder), torch.device("cpu"), torch.float32, target).model.config.hidden == 16

    # scripts/acceptance_by_length.py reads the folder through the same recipe: its per-answer counts add up to the
    # recipe's figures for the exported weights, in two columns
    from scripts.acceptance_by_length import hits_per_answer
    from specdec.drafters.mamba_feat import MambaFeatModel
    from specdec.vocab import load_draft_vocab

    eval_dir = teacher_dir / "responses" / "eval"
    held_out, counts = hits_per_answer(str(folder), eval_dir, lambda: model)
    recipe = recipe_for("mamba-feat", *target_weights(model))
    expected = greedy_acceptance(recipe, MambaFeatModel.load(folder), recipe.load_shards(eval_dir),
                                 load_draft_vocab(str(folder)))
    assert set(counts) == {f"{folder}, real feature of p-1", f"{folder}, own guess"}
    for name, column in zip(("real", "guessed"), counts.values()):
        assert len(column) == len(held_out) > 0 and sum(n for _, n in column) > 0
        assert sum(a for a, _ in column) / sum(n for _, n in column) == pytest.approx(expected[name])


def test_compare_lines_up_runs_by_tokens_seen(tmp_path):
    """The A/B table: one row per token count, each run's acceptance columns and wall minutes, gaps left empty."""
    from specdec.distill.compare import compare_table

    curves = {"plug": [(100, 60.0, {"all": 0.1}), (200, 120.0, {"all": 0.2})],
              "feat": [(100, 90.0, {"real": 0.3, "guessed": 0.25})]}
    for name, points in curves.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "curve.jsonl").write_text("".join(
            json.dumps({"tokens": t, "wall_s": w, "acceptance": a}) + "\n" for t, w, a in points))
    lines = compare_table([tmp_path / "plug", tmp_path / "feat"]).splitlines()
    assert lines[0] == ("| window tokens seen | plug | feat (real feature) | feat (own guess) | plug wall min "
                        "| feat wall min |")
    assert lines[2:] == ["| 100 | 0.100 | 0.300 | 0.250 | 1.0 | 1.5 |", "| 200 | 0.200 |  |  | 2.0 |  |"]


def test_corpus_parts_add_new_training_prompts_and_keep_the_old(tmp_path):
    """`corpus --parts 2`: a second set of training prompts after the first, none equal to an earlier prompt of either
    split; the first set (and so every answer shard made from it) is left as it was, and a rerun adds nothing."""
    first = corpus.read_prompts(corpus.write_corpus(tmp_path, 12, 3, 2_000, seed=5))
    folder = corpus.write_corpus(tmp_path, 12, 3, 2_000, seed=5, parts=2)
    both = corpus.read_prompts(folder)
    assert both[:len(first)] == first and {p.part for p in first} == {0}
    added = both[len(first):]
    assert added and {(p.part, p.split) for p in added} == {(1, "train")}
    texts = [p.text for p in added]
    assert len(set(texts)) == len(texts) and not set(texts) & {p.text for p in first}
    assert all(sum(p.domain == d for p in added) <= 12 for d in corpus.DOMAINS)
    assert corpus.read_prompts(corpus.write_corpus(tmp_path, 12, 3, 2_000, seed=5, parts=2)) == both


def test_answers_to_a_corpus_part_go_to_their_own_folder_and_into_the_card(data, tmp_path):
    """`teacher --part 1` answers only part 1's prompts, into `responses/train-part1`; training reads that folder
    beside `responses/train`, and the card's commands rebuild both (parsed back through the CLI)."""
    from specdec.distill.__main__ import parser
    from specdec.engine import encode_prompt

    out, model, tokenizer = data
    folder = tmp_path / "corpus"
    folder.mkdir()
    lines = (out / "corpus" / "prompts.jsonl").read_text().splitlines()
    part1 = [{"id": f"chat-p1-{i}", "domain": "chat", "split": "train", "text": f"another question {i}", "part": 1}
             for i in range(5)]
    (folder / "prompts.jsonl").write_text("\n".join(lines + [json.dumps(p) for p in part1]) + "\n")
    teacher_dir = tmp_path / "teacher"
    common = dict(batch_size=4, shard_prompts=8, max_new_tokens=6, k=4)
    teacher.generate_responses(model, tokenizer, folder, teacher_dir, "train", part=1, **common)
    (shard,) = teacher.load_shards(teacher_dir / "responses" / "train-part1")
    starts = shard["starts"].tolist()
    asked = [encode_prompt(tokenizer, p["text"]) for p in part1]
    answered = [shard["tokens"][a:b].tolist() for a, b in zip(starts[:-1], starts[1:])]
    assert len(answered) == len(asked) and all(any(seq[:len(a)] == a for seq in answered) for a in asked)
    teacher.generate_responses(model, tokenizer, folder, teacher_dir, "train", **common)  # part 0 as before
    assert [torch.equal(a["tokens"], b["tokens"]) for a, b in zip(
        teacher.load_shards(teacher_dir / "responses" / "train"),
        teacher.load_shards(out / "teacher" / "responses" / "train"))] == [True] * 3

    config = TrainConfig(arch="transformer", hidden=16, tf_layers=1, max_tokens=64, seq_len=16, batch_size=4,
                         warmup=1, draft_vocab=20, eval_every=1)
    train(teacher_dir, tmp_path / "run", config, None, VOCAB)
    (segment,) = read_segments(tmp_path / "run")
    assert (segment["response_shards"], segment["part_shards"]) == (3, {"1": 1})
    _, _, counters = load_run(tmp_path / "run")
    report = {"teacher_forced": {"all": 0.25}, "coverage": 0.9,
              "latency_ms": {"drafter_fp32": 1.0, "drafter_bf16": 1.0, "target_fp32": 10.0, "ratio_fp32": 0.1}}
    card = model_card("tf", tmp_path / "run", report, counters, teacher.summarize(teacher_dir), 1000, 10)
    commands = [line.split()[3:] for line in card.splitlines() if line.startswith("python -m specdec.distill ")]
    parsed = [parser().parse_args(command) for command in commands]
    assert [(a.stage, a.parts, a.part, a.response_shards) for a in parsed if a.stage in ("corpus", "teacher")] == \
        [("corpus", 2, 0, None), ("teacher", 1, 0, 3), ("teacher", 1, 1, 1)]
    assert "3 + 1 of corpus part 1 answer shards" in card


def test_a_warm_start_begins_from_the_exported_drafter(data, tmp_path):
    """`train --arch mamba-feat --init FOLDER`: a fresh run takes the folder's weights, draft vocabulary and size;
    its first curve point (step 0, before any step) is the folder's own held-out acceptance, and the card's
    command names the folder."""
    from specdec.distill.__main__ import parser
    from specdec.distill.feat import Features, load_with_features
    from specdec.drafters.mamba_feat import MambaFeatModel

    _, model, _ = data
    teacher_dir = feat_teacher(data, tmp_path)
    config = dict(arch="mamba-feat", max_tokens=4 * 16 * 2, seq_len=16, batch_size=4, warmup=1, eval_every=1)
    first = tmp_path / "first"
    train_on_target(teacher_dir, first, TrainConfig(hidden=16, mamba_layers=2, draft_vocab=20, **config), model)
    drafter, draft_ids, _ = load_run(first)
    folder = tmp_path / "exported"
    drafter.save(folder, draft_ids)  # bfloat16, as `export` writes it

    run = tmp_path / "warm"
    train_on_target(teacher_dir, run, TrainConfig(init=str(folder), **config), model)  # size and V_d: the folder's
    start, *trained = [json.loads(line) for line in (run / "curve.jsonl").read_text().splitlines()]
    exported = MambaFeatModel.load(folder)
    expected = greedy_acceptance(Features(*target_weights(model)), exported,
                                 load_with_features(teacher_dir / "responses" / "eval"), draft_ids)
    assert (start["step"], start["loss"], start["acceptance"]) == (0, None, expected)
    assert [point["step"] for point in trained] == [1, 2]
    warm, warm_ids, counters = load_run(run)
    assert warm.config == exported.config and torch.equal(warm_ids, draft_ids)
    assert not torch.equal(warm.w_in.weight, exported.w_in.weight)  # it trained from there

    report = {"teacher_forced": {"real": 0.5, "guessed": 0.4}, "coverage": 0.9,
              "latency_ms": {"drafter_fp32": 1.0, "drafter_bf16": 1.0, "target_fp32": 10.0}}
    card = model_card("warm", run, report, counters, teacher.summarize(teacher_dir), 1000, 10)
    (line,) = [x for x in card.splitlines() if x.startswith("python -m specdec.distill train ")]
    args = parser().parse_args(line.split()[3:])
    assert (args.init, args.hidden, args.layers, args.draft_vocab) == (folder, 16, 2, 20)
    assert "| 0 | 0 | 0.0 | - |" in card
    from transformers import LlamaConfig, LlamaForCausalLM

    wider = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(SystemExit, match="width 32, this target's are 48"):
        train_on_target(teacher_dir, tmp_path / "other", TrainConfig(init=str(folder), **config), wider)


@pytest.mark.parametrize("native, expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_the_teacher_runs_in_bf16_only_where_the_cpu_multiplies_it_natively(monkeypatch, native, expected):
    """`--teacher-dtype auto` (the default): emulated bf16 is several times slower than float32, so it is kept for
    CPUs with AMX or AVX512-BF16; the feature recipe's output layer follows the same rule."""
    from specdec.distill import __main__ as cli
    from specdec.distill import feat

    monkeypatch.setattr(teacher, "cpu_has_native_bf16", lambda: native)  # `teacher.teacher_dtype` reads it
    monkeypatch.setattr(feat, "cpu_has_native_bf16", lambda: native)
    monkeypatch.setattr(cli, "load_model", lambda spec, device, dtype: dtype)
    monkeypatch.setattr(cli, "_LOADED", {})
    args = cli.parser().parse_args(["teacher"])
    assert cli._target(args, args.teacher_dtype) is expected
    assert feat.bf16_is_fast(torch.device("cpu")) is native


def test_system_documentation_becomes_prompts_with_held_out_sources(tmp_path, monkeypatch):
    """The `system` domain: manual pages rendered to text and packages' READMEs, never their copyright files; eval
    prompts from held-out sources only."""
    import shutil

    prose = " ".join(f"The tool reads its input line by line and writes what it found, step {i}." for i in range(40))
    (tmp_path / "man" / "man1").mkdir(parents=True)
    (tmp_path / "man" / "man1" / "frob.1").write_text(f".TH FROB 1\n.SH NAME\nfrob \\- frobs files\n"
                                                      f".SH DESCRIPTION\n{prose}\n")
    for package in ("alpha", "beta"):
        (tmp_path / "doc" / package).mkdir(parents=True)
        (tmp_path / "doc" / package / "README").write_text(f"{package}\n\n{prose}\n")
        (tmp_path / "doc" / package / "copyright").write_text("Licensed under the terms of a licence. " * 40)
    docs = dict(corpus.system_documents(man_pages=10, root=tmp_path))
    assert {"doc:alpha/README", "doc:beta/README"} <= set(docs) and not any("copyright" in k for k in docs)
    if shutil.which("man"):  # the machines this project runs on have man-db
        assert "frobs files" in docs["man:frob.1"] and ".TH" not in docs["man:frob.1"]
    monkeypatch.setattr(corpus, "system_documents", lambda man_pages: list(docs.items()))
    monkeypatch.setattr(corpus, "held_out", lambda key, every=8: key == "doc:beta/README")
    prompts = corpus.system_prompts(4, 2)
    assert [p.split for p in prompts] == ["eval"] * 2 + ["train"] * 4
    assert all(p.domain == corpus.SYSTEM_DOMAIN and "step" in p.text for p in prompts)
    assert all(p.text.startswith(tuple(t.split("{text}")[0] for t in corpus.SYSTEM_TEMPLATES)) for p in prompts)
