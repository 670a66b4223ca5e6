"""Prompts beyond the templates (`specdec.distill.sources`): self-instruct questions and two-turn chats, their
cleaning, deduplication, held-out topics, resume, the corpus part they form, and the teacher answering a chat."""

from __future__ import annotations

import json

import torch

from specdec.distill import corpus, sources, teacher
from tests.tiny import tiny_llama

VOCAB = 64
EOS = 2


class ChatTokenizer:
    """Bytes folded into a 64-id vocabulary, a chat template of one line per turn; EOS is id 2."""

    eos_token_id = EOS
    chat_template = "one line per turn"

    def __call__(self, text: str) -> dict:
        return {"input_ids": [3 + b % (VOCAB - 3) for b in text.encode()]}

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool, tokenize: bool) -> list[int]:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return self(text + ("assistant: " if add_generation_prompt else ""))["input_ids"]

    def batch_decode(self, rows: torch.Tensor, skip_special_tokens: bool) -> list[str]:
        return ["".join(chr(ord("a") + int(i) % 26) for i in row if not (skip_special_tokens and i == EOS))
                for row in rows]


def test_questions_are_cleaned_and_compared_without_case_or_punctuation():
    assert sources.clean_question('A student might ask: "How do bees make honey?"') == "How do bees make honey?"
    assert sources.clean_question("\n  Question: - List three uses of a brick.  ") == "List three uses of a brick."
    assert sources.clean_question("2. Why is the sea salty?") == "Why is the sea salty?"
    assert sources.clean_question("Why?") is None and sources.clean_question("x " * 300) is None
    assert sources.clean_question("I'd be happy to assist with your question.") is None  # neither kind
    assert sources.clean_question("Write one more request, about saving money:") is None  # the ask, echoed
    assert sources.questions("Sure!\n- Why do owls hoot?\n- List two owls.\n") == ["Why do owls hoot?",
                                                                                  "List two owls."]
    assert sources.fingerprint("How do BEES make honey?") == sources.fingerprint("how do bees, make honey")


def fake_answers(calls: list):
    """A stand-in for the target: a self-instruct request gets a question naming its topic (so topics drawn twice
    give duplicates), a chat's first turn a fixed reply."""

    def answer(model, tokenizer, chats, max_new_tokens, temperature, seed, top_p=1.0):
        calls.append((len(chats), temperature))
        if "Write three more" in chats[0][0]:
            topics = [max((t for t in sources.SEED_TOPICS if f"about {t}" in c[0]), key=len) for c in chats]
            return [f"Question: what is the story of {t}?" for t in topics]
        return [f"My answer to '{c[0][:20]}'." for c in chats]

    return answer


def small_corpus(folder):
    folder.mkdir(parents=True)
    with open(folder / "prompts.jsonl", "w") as f:
        for domain in corpus.DOMAINS:
            for i in range(6):
                split = "eval" if i >= 4 else "train"
                f.write(json.dumps({"id": f"{domain}-{i}", "domain": domain, "split": split,
                                    "text": f"A {domain} question number {i}?"}) + "\n")
    return folder


def test_sources_form_one_new_corpus_part_deduplicated_from_held_out_topics(tmp_path, monkeypatch):
    folder = small_corpus(tmp_path / "corpus")
    calls = []
    monkeypatch.setattr(sources, "answer", fake_answers(calls))
    part = sources.add_sources(None, None, folder, self_train=12, self_eval=4, chat_train=5, chat_eval=2,
                               batch_size=4)
    prompts = corpus.read_prompts(folder)
    added = [p for p in prompts if p.part == part]
    assert part == 1 and {p.domain for p in added} == {sources.SELF_DOMAIN, sources.CHAT_TURNS_DOMAIN}
    own = [p for p in added if p.domain == sources.SELF_DOMAIN]
    assert all(not p.text.startswith("Question") for p in own)  # cleaned
    assert len({sources.fingerprint(p.text) for p in own}) == len(own)  # no two alike
    held = [t for t in sources.SEED_TOPICS if corpus.held_out(t)]
    for p in own:  # eval questions from held-out topics only, training ones never
        assert any(t in p.text for t in held) == (p.split == "eval")
    chats = [p for p in added if p.domain == sources.CHAT_TURNS_DOMAIN]
    assert [p.split for p in chats].count("eval") == 2 and len(chats) == 7
    for chat in chats:
        opener = next(p for p in prompts if p.text == chat.history[0])
        assert opener.split == chat.split and opener.domain in sources.TURN_SOURCES
        assert chat.history[1].startswith("My answer") and chat.text in sources.FOLLOW_UPS
    assert {t for _, t in calls} == {0.0, sources.ASK_TEMPERATURE}  # questions sampled, first answers greedy

    before = len(calls)  # a corpus that has its sources already is left alone
    assert sources.add_sources(None, None, folder, 12, 4, 5, 2, batch_size=4) == part and len(calls) == before
    assert corpus.read_prompts(folder) == prompts


def test_a_stopped_sources_run_resumes_from_its_kept_batches(tmp_path, monkeypatch):
    folder = small_corpus(tmp_path / "corpus")
    (folder / "sources").mkdir()
    calls = []
    monkeypatch.setattr(sources, "answer", fake_answers(calls))
    first = sources.self_instruct(None, None, folder / "sources", 6, 2, set(), seed=3, batch_size=4)
    ran = len(calls)
    again = sources.self_instruct(None, None, folder / "sources", 6, 2, set(), seed=3, batch_size=4)
    assert again == first and len(calls) == ran  # every batch read back, none run again


def test_the_target_answers_a_batch_of_chats_reproducibly():
    model, tokenizer = tiny_llama(VOCAB, seed=1), ChatTokenizer()
    chats = [["Hi there, who are you?"], ["Tell me a story.", "Once upon a time.", "Go on."]]
    greedy = sources.answer(model, tokenizer, chats, 6, 0.0, 0)
    assert len(greedy) == 2 and greedy == sources.answer(model, tokenizer, chats, 6, 0.0, 0)
    sampled = sources.answer(model, tokenizer, chats, 6, 1.0, 5)
    assert sampled == sources.answer(model, tokenizer, chats, 6, 1.0, 5)


def test_the_teacher_answers_the_last_turn_of_a_chat_with_the_whole_chat_as_context(tmp_path):
    model, tokenizer = tiny_llama(VOCAB, seed=1), ChatTokenizer()
    chat = corpus.Prompt("turns-train-0", sources.CHAT_TURNS_DOMAIN, "train", "Make it shorter.",
                         history=["Explain rain.", "Rain falls from clouds."])
    alone = corpus.Prompt("chat-0", "chat", "train", "Make it shorter.")
    with_history, without = teacher.generate_batch(model, tokenizer, [chat, alone], 4, 4)
    context = sources.chat_ids(tokenizer, ["Explain rain.", "Rain falls from clouds.", "Make it shorter."])
    assert with_history["tokens"][:len(context)].tolist() == context
    assert int(with_history["label"].nonzero()[0]) == len(context) - 1  # only the last answer is labelled
    assert len(without["tokens"]) < len(with_history["tokens"])
    corpus._write_prompts(tmp_path, [chat, alone])
    assert corpus.read_prompts(tmp_path) == [chat, alone]  # the history survives the corpus file
