"""Stage (b): teacher data, kept as token-id shards with the target's top-k log-probabilities.

Two sources, both written as the same `Shard` layout so training reads them alike:
- `generate_responses`: the target's own answers to the corpus prompts (batched generation, chat template);
  only answer positions carry labels, so the drafter learns `p` exactly where it will draft. Greedy answers go to
  `responses/<split>/`, those to a later corpus part K (prompts appended by `corpus --parts`) to
  `responses/train-partK/`; sampled passes over the first part's training prompts (`temperature` > 0, one folder
  per pass, `responses/train-t<T>-<pass>/`) give more, different answers to the same prompts: the labels stay the
  target's untempered top-k at every position, only the path through the answer changes;
- `label_text`: raw text labelled with one target forward pass per window (generating takes one per token);
  with `features`, the same pass also keeps the target's last hidden state at every position, beside the shard
  (`features_path`), for the drafter that reads it (`--arch mamba-feat`).

Shard layout (flat over the shard's sequences; position t holds `p(· | tokens[:t+1])`, the next-token law):
  tokens [N] int32, label [N] bool (answer positions, where drafting happens), known [N] bool (positions with a
  top-k: answers, and prompts labelled by the prefill), topk_ids [N, k] int32, topk_logp [N, k] float16,
  starts [S+1] int64, domains [S] (one per sequence), split "train" | "eval".
Features, where kept: `features_XXXXX.pt` beside `shard_XXXXX.pt`, [N, D] bfloat16.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicLayer

from specdec.distill.corpus import DOMAINS, LONG_DOMAIN, Prompt, read_documents, read_prompts
from specdec.distill.sources import chat_ids, pad_left
from specdec.engine import encode_prompt
from specdec.probes import cpu_has_native_bf16
from specdec.sampling import logits_to_probs, sample

Shard = dict


def teacher_dtype(name: str) -> torch.dtype:
    """The teacher's precision for `--teacher-dtype NAME`: `auto` is bfloat16 where the CPU multiplies it natively,
    else float32 (emulated bfloat16 is slower)."""
    if name == "auto":
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    return getattr(torch, name)


def top_k_logp(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k ids and log p of logits [..., V] -> ([..., k] int32, [..., k] float16)."""
    values, ids = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)
    return ids.to(torch.int32), values.to(torch.float16)


def save_shard(path: Path, shard: Shard | torch.Tensor) -> None:
    """Atomic write (of a shard or its features), so a stopped run never leaves half a file behind."""
    tmp = path.with_suffix(".tmp")
    torch.save(shard, tmp)
    os.replace(tmp, path)


def load_shards(folder: Path) -> list[Shard]:
    return [torch.load(p, weights_only=False) for p in sorted(folder.glob("shard_*.pt"))]


def features_path(shard: Path) -> Path:
    """Where the target's features of the shard at `shard` are kept."""
    return shard.with_name(shard.name.replace("shard_", "features_"))


@torch.inference_mode()
def target_hidden(model: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    """The target's last hidden state (what its output layer scores) of [B, L] ids -> [B, L, D]."""
    return model.base_model(input_ids=ids).last_hidden_state


def _pack(sequences: list[dict], split: str, k: int) -> Shard:
    """Concatenate per-sequence dicts (tokens, label, topk_ids, topk_logp, domain) into one flat shard."""
    lengths = [len(s["tokens"]) for s in sequences]
    return {
        "tokens": torch.cat([s["tokens"] for s in sequences]).to(torch.int32),
        "label": torch.cat([s["label"] for s in sequences]),
        "known": torch.cat([s["known"] for s in sequences]),
        "topk_ids": torch.cat([s["topk_ids"] for s in sequences]).reshape(-1, k),
        "topk_logp": torch.cat([s["topk_logp"] for s in sequences]).reshape(-1, k),
        "starts": torch.tensor([0] + lengths).cumsum(0),
        "domains": [s["domain"] for s in sequences],
        "split": split,
    }


LOGIT_BLOCK = 512  # prompt positions scored at once: [B, P, V] logits at once outgrow memory for long prompts


def prompt_top_k(head: torch.nn.Module, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k ids and log p at every position of one prompt's hidden states [P, D], `LOGIT_BLOCK` positions at a
    time -> ([P, k] int32, [P, k] float16)."""
    starts = range(0, max(len(hidden), 1), LOGIT_BLOCK)  # one empty block for a prompt of one token
    blocks = [top_k_logp(head(hidden[i: i + LOGIT_BLOCK]), k) for i in starts]
    return torch.cat([ids for ids, _ in blocks]), torch.cat([logp for _, logp in blocks])


@torch.inference_mode()
def decode(model: PreTrainedModel, input_ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int, k: int,
           eos: int, temperature: float = 0.0, generator: torch.Generator | None = None,
           top_p: float = 1.0) -> tuple[torch.Tensor, ...]:
    """Batched decoding of left-padded prompts [B, P] with a KV cache: greedy, or sampled at `temperature` (and
    `top_p`).

    A row that has emitted EOS leaves the batch (its cache rows are dropped), so the steps after it cost only the
    rows still answering. Returns each prompt's top-k at its own positions but the last (from the prefill pass:
    free labels; padding is not scored), as two lists of B tensors [p - 1, k]; the answer's top-k [B, T, k] twice
    (ids, log p of the untempered target); and the answer tokens [B, T] (under greedy, ids[:, :, 0]). A row's
    entries after its EOS are padding.
    """
    cache = reserved_cache(model, mask.shape[1] + max_new_tokens)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)  # [B, P]
    hidden = model.base_model(input_ids=input_ids, attention_mask=mask, position_ids=positions, cache=cache,
                              use_cache=True).last_hidden_state  # [B, P, D]
    head = model.get_output_embeddings()
    width = mask.shape[1]
    prompt_ids, prompt_logp = zip(*(prompt_top_k(head, row[width - int(n):width - 1], k)
                                    for row, n in zip(hidden, mask.sum(-1))))
    batch = len(input_ids)
    answer_ids = torch.zeros(batch, max_new_tokens, k, dtype=torch.int32)
    answer_logp = torch.zeros(batch, max_new_tokens, k, dtype=torch.float16)
    tokens = torch.full((batch, max_new_tokens), eos, dtype=torch.long)
    rows = torch.arange(batch)  # the input row of each row still decoding
    last, positions = head(hidden[:, -1]), positions[:, -1:]  # [B, V], [B, 1]
    steps = 0
    for step in range(max_new_tokens):
        ids, logp = top_k_logp(last, k)  # [b, k]
        answer_ids[rows, step], answer_logp[rows, step] = ids, logp
        if temperature > 0:
            law = logits_to_probs(last, temperature, top_p)
            token = sample(law, 1, generator)[:, 0]
        else:
            token = ids[:, 0].long()
        tokens[rows, step] = token
        steps = step + 1
        going = token != eos
        if not going.any() or steps == max_new_tokens:
            break
        if not going.all():
            keep = going.nonzero()[:, 0]
            rows, token, positions, mask = rows[keep], token[keep], positions[keep], mask[keep]
            cache.batch_select_indices(keep)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        positions = positions + 1
        last = model(input_ids=token[:, None], attention_mask=mask, position_ids=positions, cache=cache,
                     use_cache=True).logits[:, -1]
    return list(prompt_ids), list(prompt_logp), answer_ids[:, :steps], answer_logp[:, :steps], tokens[:, :steps]


class ReservedLayer(DynamicLayer):
    """A KV cache layer that appends in place into a buffer reserved for the whole generation, where
    `DynamicLayer` concatenates, copying the whole cache at every decoding step. `keys`/`values` are views of
    the filled part, so everything that reads a `DynamicLayer` reads this one alike."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.filled = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.device, self.is_initialized = key_states.device, True
            shape = (*key_states.shape[:2], max(self.capacity, key_states.shape[-2]))
            self._keys = key_states.new_empty(*shape, key_states.shape[-1])
            self._values = value_states.new_empty(*shape, value_states.shape[-1])
        end = self.filled + key_states.shape[-2]
        if end > self._keys.shape[-2]:
            raise ValueError(f"{end} positions in a cache reserved for {self._keys.shape[-2]}")
        self._keys[:, :, self.filled:end] = key_states
        self._values[:, :, self.filled:end] = value_states
        self.filled = end
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._keys, self._values = self._keys[indices], self._values[indices]
            self.keys, self.values = self._keys[:, :, :self.filled], self._values[:, :, :self.filled]

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("the teacher's cache only grows")


def reserved_cache(model: PreTrainedModel, capacity: int) -> DynamicCache:
    """The model's own `DynamicCache` with each plain layer swapped for a `ReservedLayer` of `capacity`
    positions (other layer kinds, e.g. sliding windows, are kept as they are)."""
    cache = DynamicCache(config=model.config)
    cache.layers = [ReservedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def prompt_tokens(tokenizer: PreTrainedTokenizerBase, prompt: Prompt) -> list[int]:
    """A prompt's ids as the engine will feed them: the chat template around it (and its earlier turns)."""
    if prompt.history:
        return chat_ids(tokenizer, [*prompt.history, prompt.text])
    return encode_prompt(tokenizer, prompt.text)


BATCH_TOKENS = 16384  # padded positions (prompt + answer) a batch of answers may hold


def budget_batches(lengths: list[int], rows: int, tokens: int) -> Iterator[slice]:
    """Cut prompts sorted by length (`lengths`, ascending) into batches of at most `rows` prompts whose padded
    size, rows x the longest prompt, stays within `tokens`: short prompts share big batches, long ones small
    ones, so neither padding nor a long row's attention is paid by the rest. A prompt longer than `tokens`
    gets a batch of its own."""
    start = 0
    while start < len(lengths):
        end = start + 1
        while end < len(lengths) and end - start < rows and (end + 1 - start) * lengths[end] <= tokens:
            end += 1
        yield slice(start, end)
        start = end


def generate_batch(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[Prompt],
                   max_new_tokens: int, k: int, temperature: float = 0.0,
                   generator: torch.Generator | None = None, prompt_ids: list[list[int]] | None = None) -> list[dict]:
    """The target's answers (greedy, or sampled at `temperature`) to a batch of prompts, with top-k log p at each
    position.

    `label` marks answer positions (where the drafter will draft); `known` adds the prompt positions, whose
    top-k comes free from the prefill pass (the target's law on user text). `prompt_ids`: the prompts'
    `prompt_tokens`, where the caller has them already.
    """
    eos = tokenizer.eos_token_id
    prompt_ids = prompt_ids or [prompt_tokens(tokenizer, p) for p in prompts]
    input_ids, mask = pad_left(tokenizer, prompt_ids)
    p_ids, p_logp, a_ids, a_logp, answers = decode(model, input_ids, mask, max_new_tokens, k, eos, temperature,
                                                   generator)
    sequences = []
    for row, (prompt, ids) in enumerate(zip(prompts, prompt_ids)):
        answer = answers[row].tolist()
        n = answer.index(eos) + 1 if eos in answer else len(answer)
        p = len(ids)
        tokens = torch.tensor(ids + answer[:n])
        label = torch.zeros(len(tokens), dtype=torch.bool)
        label[p - 1:p - 1 + n] = True  # the last prompt position predicts answer token 0
        known = label.clone()
        known[:p - 1] = True  # prompt positions, labelled by the prefill
        topk_ids = torch.cat([p_ids[row], a_ids[row, :n]])  # [p - 1 + n, k]
        topk_logp = torch.cat([p_logp[row], a_logp[row, :n]])
        pad = torch.zeros(len(tokens) - len(topk_ids), k)
        sequences.append({"tokens": tokens, "label": label, "known": known, "domain": prompt.domain,
                          "topk_ids": torch.cat([topk_ids, pad.int()]), "topk_logp": torch.cat([topk_logp, pad.half()])})
    return sequences


def _interleave(prompts: list[Prompt]) -> list[Prompt]:
    """Round-robin over domains (the template domains first, then the others in the order they appear), so any
    prefix of the shards covers every domain."""
    order = [*DOMAINS, LONG_DOMAIN, *dict.fromkeys(p.domain for p in prompts)]
    by_domain = [[p for p in prompts if p.domain == d] for d in dict.fromkeys(order)]
    longest = max(map(len, by_domain), default=0)
    return [group[i] for i in range(longest) for group in by_domain if i < len(group)]


def shards_of(items: list, size: int) -> Iterator[tuple[int, list]]:
    for index, start in enumerate(range(0, len(items), size)):
        yield index, items[start:start + size]


def sampled_folder(temperature: float, index: int) -> str:
    """The responses subfolder of sampled pass `index` over the training prompts."""
    return f"train-t{temperature:g}-{index}"


PART_SUFFIX = "-part"


def part_folder(split: str, part: int) -> str:
    """The responses subfolder of the greedy answers to corpus part `part` of `split`."""
    return f"{split}{PART_SUFFIX}{part}" if part else split


def folder_part(folder_name: str) -> int | None:
    """The corpus part of a `part_folder` name (its inverse): "train-part2" -> 2; None for any other folder."""
    head, sep, part = folder_name.partition(PART_SUFFIX)
    return int(part) if sep and head == "train" and part.isdigit() else None


def sampled_temperature(folder_name: str) -> float:
    """The temperature of a `sampled_folder` name (its inverse): "train-t0.8-1" -> 0.8."""
    return float(folder_name.split("-")[1][1:])


def generate_responses(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, corpus: Path, out: Path,
                       split: str, batch_size: int, shard_prompts: int, max_new_tokens: int, k: int,
                       minutes: float | None = None, max_shards: int | None = None, temperature: float = 0.0,
                       sampled_pass: int = 0, part: int = 0, batch_tokens: int = BATCH_TOKENS) -> int:
    """Write `out/responses/<split>/shard_*.pt`; existing shards are kept (resume). Returns new tokens written.

    `max_shards` caps the data reproducibly (shards come in a fixed order); `minutes` stops early by time.
    With `temperature` > 0 the answers are sampled, into `responses/train-t<T>-<sampled_pass>/`; each shard's
    sampler is seeded by (pass, shard), so a resumed pass writes what an unbroken one would have.
    `part` > 0 answers the training prompts of that corpus part instead, into `responses/train-part<K>/`.
    Each shard's prompts are answered in `budget_batches` of at most `batch_size` prompts and `batch_tokens`
    padded positions (prompt and answer).
    """
    name = sampled_folder(temperature, sampled_pass) if temperature > 0 else part_folder(split, part)
    folder = out / "responses" / name
    folder.mkdir(parents=True, exist_ok=True)
    prompts = _interleave(read_prompts(corpus, split, part))
    shards = list(shards_of(prompts, shard_prompts))[:max_shards]
    start, written = time.monotonic(), 0
    for path, group, bar in _pending(folder, shards, minutes, f"teacher responses ({name})"):
        index = int(path.stem.split("_")[1])
        generator = torch.Generator().manual_seed(1_000_003 * (sampled_pass + 1) + index) if temperature > 0 else None
        ids = sorted(([prompt_tokens(tokenizer, p), p] for p in group), key=lambda pair: len(pair[0]))
        group, ids = [p for _, p in ids], [i for i, _ in ids]  # similar lengths share a batch: less padding
        cuts = budget_batches([len(i) + max_new_tokens for i in ids], batch_size, batch_tokens)
        sequences = [seq for cut in cuts for seq in generate_batch(model, tokenizer, group[cut], max_new_tokens, k,
                                                                   temperature, generator, ids[cut])]
        shard = _pack(sequences, split, k)
        save_shard(path, shard)
        written += int(shard["known"].sum())
        bar.set_postfix(tok_s=f"{written / (time.monotonic() - start):.0f}", labels=written)
    return written


def generate_sampled(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, corpus: Path, out: Path,
                     passes: int, temperature: float, minutes: float | None = None, max_shards: int | None = None,
                     **common) -> int:
    """`passes` sampled passes over the training prompts, one after another (resumable); returns tokens written.

    `max_shards` caps the shards of all passes together: since a pass is finished before the next one starts, a
    cap names a fixed set of shards, as `generate_responses`' does. `minutes` is the time for all passes.
    """
    start, left, written = time.monotonic(), max_shards, 0
    for index in range(passes):
        left_min = None if minutes is None else minutes - (time.monotonic() - start) / 60
        if (left_min is not None and left_min <= 0) or left == 0:
            break
        written += generate_responses(model, tokenizer, corpus, out, "train", minutes=left_min, max_shards=left,
                                      temperature=temperature, sampled_pass=index, **common)
        if left is not None:
            left -= len(list((out / "responses" / sampled_folder(temperature, index)).glob("shard_*.pt")))
    return written


def _pending(folder: Path, shards: list, minutes: float | None, desc: str) -> Iterator[tuple[Path, list, tqdm]]:
    """The (path, group, progress bar) of each shard not yet on disk, until `minutes` have passed: resumable."""
    start = time.monotonic()
    bar = tqdm(shards, desc=desc, unit="shard")
    for index, group in bar:
        path = folder / f"shard_{index:05d}.pt"
        if path.exists():
            continue
        if minutes is not None and time.monotonic() - start > minutes * 60:
            break
        yield path, group, bar


@torch.inference_mode()
def label_windows(model: PreTrainedModel, windows: torch.Tensor, k: int,
                  features: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One target forward over [B, L] token windows: top-k of log p at every position ([B, L, k] twice) and, with
    `features`, the last hidden state [B, L, D] the output layer scored (else None)."""
    if not features:
        return *top_k_logp(model(input_ids=windows).logits, k), None
    hidden = target_hidden(model, windows)
    return *top_k_logp(model.get_output_embeddings()(hidden), k), hidden


def text_windows(tokenizer: PreTrainedTokenizerBase, corpus: Path, length: int) -> list[tuple[str, torch.Tensor]]:
    """Documents tokenised, joined by EOS, cut into (domain, [length]) windows."""
    windows = []
    for doc in read_documents(corpus):
        ids = tokenizer(doc["text"])["input_ids"] + [tokenizer.eos_token_id]
        for start in range(0, len(ids) - length + 1, length):
            windows.append((doc["domain"], torch.tensor(ids[start:start + length])))
    return windows


def label_text(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, corpus: Path, out: Path,
               window: int, batch_size: int, shard_windows: int, k: int, minutes: float | None = None,
               max_shards: int | None = None, features: bool = False) -> int:
    """Write `out/text/shard_*.pt` (resumable): raw text with the target's top-k at every position; with
    `features`, the target's features of the same pass beside each shard too."""
    folder = out / "text"
    folder.mkdir(parents=True, exist_ok=True)
    windows = text_windows(tokenizer, corpus, window)
    start, written = time.monotonic(), 0
    shards = list(shards_of(windows, shard_windows))[:max_shards]
    desc = "teacher text labels + features" if features else "teacher text labels"
    for path, group, bar in _pending(folder, shards, minutes, desc):
        sequences, hidden = [], []
        for _, batch in shards_of(group, batch_size):
            ids, logp, h = label_windows(model, torch.stack([w for _, w in batch]), k, features)
            everywhere = torch.ones(window, dtype=torch.bool)
            sequences += [{"tokens": w, "label": everywhere, "known": everywhere, "topk_ids": ids[i],
                           "topk_logp": logp[i], "domain": domain} for i, (domain, w) in enumerate(batch)]
            if features:
                hidden += [row.to(torch.bfloat16) for row in h]
        if features:  # before the shard: a shard on disk has its features
            save_shard(features_path(path), torch.cat(hidden))
        save_shard(path, _pack(sequences, "train", k))
        written += window * len(group)
        bar.set_postfix(tok_s=f"{written / (time.monotonic() - start):.0f}", labels=written)
    return written


def summarize(out: Path) -> dict:
    """Token counts of what is on disk, per source and split."""
    counts = {}
    for folder in sorted(p for p in out.rglob("*") if p.is_dir() and any(p.glob("shard_*.pt"))):
        shards = load_shards(folder)
        counts[str(folder.relative_to(out))] = {"shards": len(shards),
                                                "answer_tokens": int(sum(s["label"].sum() for s in shards)),
                                                "labelled_tokens": int(sum(s["known"].sum() for s in shards))}
    (out / "teacher_summary.json").write_text(json.dumps(counts, indent=1))
    return counts
