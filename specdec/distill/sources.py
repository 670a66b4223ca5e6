"""Prompts beyond the templates: questions and tasks the target writes itself, and chats of two user turns.

- **Self-instruct** (`SELF_DOMAIN`): shown a few questions people ask (`EXAMPLES`), the target writes one more
  three more about a seed topic (`SEED_TOPICS` x `ASKS`, sampled); each line that reads as a question or request is
  kept (`clean_question`), deduplicated ignoring case and punctuation, also against every prompt already in the corpus.
  Eval prompts come from held-out topics only.
- **Chats** (`CHAT_TURNS_DOMAIN`): a first user turn from the corpus (a template prompt or a self-instruct one), the
  target's own greedy answer to it, then a follow-up (`FOLLOW_UPS`); the teacher answers the last turn with the
  whole chat as context, as a user's second message is answered.

Both are appended to the corpus as one new part (`add_sources`), so the prompts already there, and the answer
shards made from them, never change; `teacher --part K` answers the new part. The target's generations are kept
batch by batch in `corpus/sources/*.jsonl`, so a stopped run continues where it stopped and writes what an
unbroken one would have.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specdec.distill.corpus import CHAT_ACTIVITIES, CHAT_TOPICS, Prompt, _write_prompts, held_out, read_prompts

SELF_DOMAIN = "self"
CHAT_TURNS_DOMAIN = "turns"
SEED_TOPICS = CHAT_TOPICS + CHAT_ACTIVITIES + [
    "a birthday party", "a small online shop", "a school science fair", "a broken bicycle", "a rainy weekend",
    "a job offer in another city", "a first apartment", "a spreadsheet of expenses", "a dog that barks at night",
    "a group project", "a trip to Japan", "a sourdough starter", "a slow laptop", "a wedding speech", "a podcast",
    "an argument with a friend", "a command-line tool", "a SQL query", "a web page that loads slowly", "unit tests",
    "a Python script", "regular expressions", "a git merge conflict", "a CSV file", "a REST API", "a chess opening",
    "a short story", "a cover letter", "a poem about the sea", "a history essay", "a math homework problem",
]
EXAMPLES = (  # what the target is shown before it writes one more, as a user would type them
    "How do I keep basil alive on a windowsill?", "What is the difference between a virus and a bacterium?",
    "Write a short poem about autumn rain.", "Can you explain what a mortgage is in simple words?",
    "List three ways to save water at home.", "Why do cats purr?", "Give me a plan for learning to swim as an adult.",
    "Write a Python function that reverses the words in a sentence.", "Summarise the plot of Romeo and Juliet.",
    "What should I pack for a weekend of hiking?", "Compare trains and planes for a 500 km trip.",
)
ASKS = [
    "Here are some questions people ask an assistant:\n{examples}\nWrite three more questions about {topic}, one a "
    "line.",
    "Here are some requests people type to an assistant:\n{examples}\nWrite three more requests about {topic}, one "
    "a line.",
]
FOLLOW_UPS = [
    "Can you give me a concrete example?", "Explain that more simply.", "Make it shorter.", "Why is that?",
    "What are the common mistakes here?", "Can you put that as a numbered list?", "Thanks! Can you add one more point?",
    "How would you explain this to a ten-year-old?", "Is there another way to do it?", "Can you summarise that in one "
    "sentence?", "What should I do first?", "Can you make it more formal?", "What are the pros and cons?",
    "Could you expand on the second point?", "Write that again, but friendlier.", "How long would that take?",
]
TURN_SOURCES = ("chat", "code", "math", SELF_DOMAIN)  # domains whose prompts open a chat (short, self-contained)
ASK_TOKENS = 96  # the most tokens a self-instruct generation takes (about three questions)
FIRST_ANSWER_TOKENS = 128  # the most tokens of the target's answer to a chat's first turn
ASK_TEMPERATURE = 0.8  # with nucleus sampling at ASK_TOP_P: varied questions, few broken ones
ASK_TOP_P = 0.95
OPENERS = ("how", "what", "why", "when", "where", "which", "who", "can", "could", "should", "is", "are", "do",
           "does", "write", "list", "explain", "give", "describe", "compare", "plan", "suggest", "summarise",
           "summarize", "create", "help", "tell", "make", "name", "translate", "find", "show", "recommend")
_QUOTED = re.compile(r"[\"“]([^\"”]{12,240})[\"”]")
_LEAD = re.compile(r"^(?:[-*•]|\d+[.)])\s*")  # a list item's mark


def clean_question(line: str) -> str | None:
    """One line of a generation as a prompt (a quoted question inside it when there is one, list marks and a lead-in
    such as "A student might ask:" removed); None unless it reads as a question or a request: it ends with a
    question mark or opens with a word such as How, Write or List, and has 3 to 60 words."""
    line = line.strip()
    if quoted := _QUOTED.search(line):
        line = quoted.group(1)
    line = _LEAD.sub("", line.split(": ", 1)[1] if ": " in line[:60] else line).strip().strip('"“”\'*').strip()
    words = line.split()
    if not 3 <= len(words) <= 60 or len(line) > 240 or line.endswith(":") or "one more" in line.lower():
        return None
    return line if line.endswith("?") or words[0].lower().strip(",") in OPENERS else None


def questions(text: str) -> list[str]:
    """The prompts in one generation, a line each."""
    return [q for q in map(clean_question, text.splitlines()) if q]


def fingerprint(text: str) -> str:
    """What deduplication compares: the words, lower case, without punctuation."""
    return " ".join(re.findall(r"\w+", text.lower()))


def pad_left(tokenizer: PreTrainedTokenizerBase, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows as one left-padded batch [B, P] (EOS as padding) and its attention mask."""
    eos = tokenizer.eos_token_id
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), eos, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, tokens in enumerate(rows):
        ids[row, width - len(tokens):] = torch.tensor(tokens)
        mask[row, width - len(tokens):] = 1
    return ids, mask


def chat_ids(tokenizer: PreTrainedTokenizerBase, turns: list[str]) -> list[int]:
    """Alternating user and assistant turns (user first and last) in the target's chat template, ready for the
    assistant's next answer."""
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@torch.inference_mode()
def answer(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, chats: list[list[str]], max_new_tokens: int,
           temperature: float, seed: int, top_p: float = 1.0) -> list[str]:
    """The target's answers to a batch of chats (`teacher.decode`: one batch, its finished rows leaving it;
    sampled at `temperature` and `top_p` from a generator seeded with `seed`, or greedy at 0)."""
    from specdec.distill.teacher import decode  # the teacher reads this module's `chat_ids`

    ids, mask = pad_left(tokenizer, [chat_ids(tokenizer, turns) for turns in chats])
    *_, tokens = decode(model, ids, mask, max_new_tokens, 1, tokenizer.eos_token_id, temperature,
                        torch.Generator().manual_seed(seed), top_p)
    return tokenizer.batch_decode(tokens, skip_special_tokens=True)  # EOS and the padding after it dropped


def _batches_kept(path: Path, requests: list, batch_size: int, run: Callable[[int, list], list[str]]) -> list[str]:
    """`run(index, batch)` over `requests` in batches, each batch's outputs appended to `path` as one JSON line as
    soon as it is made; batches already in `path` are read back instead of run again (resume)."""
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            done[record["batch"]] = record["outputs"]
    outputs = []
    for index, start in enumerate(range(0, len(requests), batch_size)):
        if index not in done:
            done[index] = run(index, requests[start:start + batch_size])
            with open(path, "a") as f:
                f.write(json.dumps({"batch": index, "outputs": done[index]}) + "\n")
        outputs += done[index]
    return outputs


def self_instruct(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: Path, train: int, evals: int,
                  taken: set[str], seed: int, batch_size: int) -> list[Prompt]:
    """`train` and `evals` prompts the target wrote itself (fewer when its questions run out), none equal to a
    fingerprint in `taken` (which grows with them)."""
    rng = random.Random(seed + 5)
    topics = {split: [t for t in SEED_TOPICS if held_out(t) == (split == "eval")] for split in ("train", "eval")}
    prompts = []
    for split, wanted in (("eval", evals), ("train", train)):
        requests = [rng.choice(ASKS).format(topic=rng.choice(topics[split]), examples="\n".join(
            f"- {e}" for e in rng.sample(EXAMPLES, 4))) for _ in range(wanted)]
        run = lambda index, batch: answer(model, tokenizer, [[r] for r in batch], ASK_TOKENS,  # noqa: E731
                                          ASK_TEMPERATURE, seed * 1_000_003 + index + (split == "eval") * 500_009,
                                          top_p=ASK_TOP_P)
        texts = _batches_kept(folder / f"self-{split}.jsonl", requests, batch_size, run)
        kept = []
        for text in (q for t in texts for q in questions(t)):
            if len(kept) < wanted and fingerprint(text) not in taken:
                taken.add(fingerprint(text))
                kept.append(text)
        prompts += [Prompt(f"{SELF_DOMAIN}-{split}-{i:05d}", SELF_DOMAIN, split, t) for i, t in enumerate(kept)]
    return prompts


def chat_turns(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: Path, openers: list[Prompt],
               train: int, evals: int, seed: int, batch_size: int) -> list[Prompt]:
    """`train` and `evals` chats: an opener of the same split, the target's greedy answer, a follow-up."""
    rng = random.Random(seed + 6)
    prompts = []
    for split, wanted in (("eval", evals), ("train", train)):
        pool = [p for p in openers if p.split == split and p.domain in TURN_SOURCES]
        chosen = rng.sample(pool, min(wanted, len(pool)))
        run = lambda index, batch: answer(model, tokenizer, [[p.text] for p in batch],  # noqa: E731
                                          FIRST_ANSWER_TOKENS, 0.0, 0)
        answers = _batches_kept(folder / f"turns-{split}.jsonl", chosen, batch_size, run)
        prompts += [Prompt(f"{CHAT_TURNS_DOMAIN}-{split}-{i:05d}", CHAT_TURNS_DOMAIN, split, rng.choice(FOLLOW_UPS),
                           history=(opener.text, reply.strip()))
                    for i, (opener, reply) in enumerate(zip(chosen, answers, strict=True)) if reply.strip()]
    return prompts


def add_sources(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, corpus: Path, self_train: int,
                self_eval: int, chat_train: int, chat_eval: int, seed: int = 0, batch_size: int = 16) -> int:
    """Append the self-instruct prompts and the chats to the corpus at `corpus` as its next part (once: a corpus
    that has them already is left alone); returns the part's number."""
    prompts = read_prompts(corpus)
    have = {p.part for p in prompts if p.domain in (SELF_DOMAIN, CHAT_TURNS_DOMAIN)}
    if have:
        return max(have)
    part = max(p.part for p in prompts) + 1
    folder = corpus / "sources"
    folder.mkdir(exist_ok=True)
    taken = {fingerprint(text) for text in [*(p.text for p in prompts), *EXAMPLES]}  # copies of the examples too
    written = self_instruct(model, tokenizer, folder, self_train, self_eval, taken, seed, batch_size)
    written += chat_turns(model, tokenizer, folder, prompts + written, chat_train, chat_eval, seed, batch_size)
    _write_prompts(corpus, prompts + [replace(p, part=part) for p in written])
    return part
