"""The recipe of a Mamba drafter with a tokenizer of its own (`--arch mamba --tokenizer FOLDER`; the engine's
`xmamba` kind).

The teacher's top-k is over the target's ids, which this drafter does not score, so it learns from text: the
target's greedy answers to the corpus prompts (the prompt and the answer decoded from the target's tokens and
encoded in the drafter's, the answer separately so that its first token starts at the answer) and the corpus's
raw text, with plain next-token cross-entropy (under greedy decoding the answer's next token is the target's
argmax, which is what a greedy drafter must hit). Held-out acceptance is counted the same way, in the drafter's
own tokens; the engine's acceptance in target tokens comes from `evaluate` and the benchmark.

A fresh run's embedding rows of the tokens both vocabularies hold start from the SVD projection of the target's
(`plugin.project_embedding`); the others start random at the same scale.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from specdec.distill.corpus import read_documents
from specdec.distill.plugin import PlugIn, build_drafter, draft_logits, project_embedding, save_drafter
from specdec.distill.recipe import Stream, TrainConfig, most_frequent
from specdec.distill.teacher import Shard, load_shards
from specdec.drafters.cross import shared_vocabulary
from specdec.models import LoadedModel


def _encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _pack(sequences: list[tuple[list[int], int]], domains: list[str]) -> Shard:
    """Sequences of drafter ids, each with the index its answer starts at (0: all text), as a flat shard:
    `label` marks the positions whose next token is an answer token, `known` every position with a next token."""
    tokens, label, known, starts = [], [], [], [0]
    for ids, answer_start in sequences:
        n = len(ids)
        tokens += ids
        label += [answer_start - 1 <= i < n - 1 for i in range(n)]
        known += [i < n - 1 for i in range(n)]
        starts.append(starts[-1] + n)
    return {"tokens": torch.tensor(tokens, dtype=torch.int32), "label": torch.tensor(label),
            "known": torch.tensor(known), "starts": torch.tensor(starts), "domains": domains, "split": "train"}


def convert_answers(shard: Shard, target: PreTrainedTokenizerBase, drafter: PreTrainedTokenizerBase) -> Shard:
    """A teacher shard of the target's answers in the drafter's tokens."""
    sequences = []
    for a, b in zip(shard["starts"][:-1].tolist(), shard["starts"][1:].tolist()):
        ids, label = shard["tokens"][a:b].tolist(), shard["label"][a:b]
        prompt_end = int(label.nonzero()[0, 0]) + 1 if label.any() else len(ids)
        prompt = target.decode(ids[:prompt_end])
        full = target.decode(ids)
        answer = full[len(prompt):] if full.startswith(prompt) else target.decode(ids[prompt_end:])
        head = _encode(drafter, prompt)
        sequences.append((head + _encode(drafter, answer), len(head) or 1))
    return {**_pack(sequences, list(shard["domains"])), "split": shard["split"]}


class TokenStream(Stream):
    """Windows of drafter ids and the mask of positions whose next token is trained on."""

    def __init__(self, shards: list[Shard]) -> None:
        self.tokens = torch.cat([s["tokens"] for s in shards]).long()  # [N]
        self.label = torch.cat([s["known"] for s in shards])  # [N]

    def cut(self, index: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.tokens[index], self.label[index]


class CrossPlugIn(PlugIn):
    eval_batch = 16
    text_from_teacher = False  # the corpus's raw text, read in its own tokens
    acceptance_headers = ("held-out acceptance, drafter tokens", "per domain")

    def __init__(self, tokenizer: str, target_embedding: torch.Tensor | None = None,
                 target_tokenizer: PreTrainedTokenizerBase | None = None) -> None:
        super().__init__("mamba", target_embedding)
        self.kind, self.full_head_figure = "xmamba", False
        self.tokenizer_folder = tokenizer
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self.target_tokenizer = target_tokenizer
        self.pad_id = self.tokenizer.eos_token_id or 0

    # --- data ---------------------------------------------------------------------------------------------------
    def load_shards(self, folder: Path) -> list[Shard]:
        if self.target_tokenizer is None:
            raise ValueError("the cross-tokenizer recipe reads teacher shards with the target's tokenizer")
        return [convert_answers(shard, self.target_tokenizer, self.tokenizer) for shard in load_shards(folder)]

    def text_shards(self, teacher: Path) -> list[Shard]:
        """The corpus's raw text in the drafter's tokens, every document ending with the end-of-text token."""
        corpus = teacher.parent / "corpus"
        if not (corpus / "text.jsonl").is_file():
            return []
        eos = self.tokenizer.eos_token_id
        documents = read_documents(corpus)
        sequences = [(_encode(self.tokenizer, doc["text"]) + ([eos] if eos is not None else []), 0)
                     for doc in documents]
        return [_pack(sequences, [doc["domain"] for doc in documents])]

    def stream(self, shards: list[Shard]) -> Stream:
        return TokenStream(shards)

    # --- training ---------------------------------------------------------------------------------------------
    def fresh(self, config: TrainConfig, shards: list[Shard], vocab_size: int) -> tuple[PreTrainedModel, torch.Tensor]:
        if config.init:
            raise SystemExit("--init is for drafters of the target's tokenizer")
        model = build_drafter(config, vocab_size)
        weight = model.get_input_embeddings().weight.data  # [V_d, d]
        weight.normal_(0.0, 0.02)
        if self.target_embedding is not None and self.target_tokenizer is not None:
            drafter_ids, target_ids = shared_vocabulary(self.target_tokenizer, self.tokenizer)
            keep = drafter_ids < vocab_size
            weight[drafter_ids[keep]] = project_embedding(self.target_embedding, config.hidden)[target_ids[keep]]
        # V_d: the special tokens and the tokens that most often come next in the training data
        next_tokens = [shard["tokens"][1:][shard["known"][:-1]] for shard in shards]
        return model, most_frequent(next_tokens, config.draft_vocab, vocab_size, len(self.tokenizer.all_special_tokens))

    def loss(self, model: PreTrainedModel, batch: tuple[torch.Tensor, ...], draft_ids: torch.Tensor,
             lut: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        ids, known = batch
        logits = draft_logits(model, ids[:, :-1], draft_ids)  # [B, L-1, |V_d|]
        slot = lut[ids[:, 1:]]  # the next token's place in V_d, -1 outside it
        mask = known[:, :-1] & (slot >= 0)
        return F.cross_entropy(logits[mask].float(), slot[mask])

    # --- evaluation and export ----------------------------------------------------------------------------------
    def save(self, model: PreTrainedModel, draft_ids: torch.Tensor, folder: Path,
             tokenizer: PreTrainedTokenizerBase | None = None) -> Path:
        """The drafter folder with its own tokenizer, whatever the caller's."""
        return save_drafter(model, draft_ids, self.tokenizer, folder)

    def drafter_tokenizer(self, target: LoadedModel) -> PreTrainedTokenizerBase:
        return self.tokenizer

    def check_target(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, run: Path) -> None:
        """Any target will do: the engine maps between the two tokenizers."""

    # --- the model card -----------------------------------------------------------------------------------------
    def describe(self, config: dict, vocab: int, params: int, size: int) -> str:
        from specdec.distill.tokenizer import overlap

        text = (f"A Mamba drafter ({params / 1e6:.1f}M parameters: d_model {config['hidden']}, "
                f"{self.layers(config)} layers, tied embedding) with a tokenizer of its own: a byte-level BPE of "
                f"{len(self.tokenizer):,} tokens trained on the distillation corpus. It drafts for "
                "**SmolLM2-135M-Instruct** in the `specdec` engine's `xmamba` methods, which turn its guesses into "
                f"text and re-encode them in the target's tokens. Weights in bfloat16, the embedding as int8 rows "
                f"({size / 2**20:.1f} MiB folder).")
        if self.target_tokenizer is not None:
            shared = overlap(self.target_tokenizer, self.tokenizer)
            text += (f"\n\nVocabulary overlap with the target: {shared['shared']:,} tokens with the same string, "
                     f"{shared['of_drafter']:.1%} of the drafter's vocabulary and {shared['of_target']:.1%} of the "
                     "target's (under sampling the drafter proposes only these).")
        return text

    def describe_loss(self) -> str:
        return ("Loss: next-token cross-entropy in the drafter's own tokens, on the target's greedy answers (re-encoded "
                "from the target's tokens) and the raw text,")

    def describe_text(self) -> str:
        return ("the answers were decoded from the target's tokens and encoded in the drafter's; raw text is the "
                "corpus's standard-library source and documentation (`corpus/text.jsonl`) in the drafter's tokens, "
                "with no teacher labels (next-token targets).")

    def teacher_forced_rows(self, acceptance: dict[str, float]) -> list[str]:
        domains = ", ".join(f"{d} {v:.3f}" for d, v in acceptance.items() if d != "all")
        return [(f"| greedy per-token acceptance in the drafter's tokens, teacher-forced on held-out answers | "
                 f"{acceptance['all']:.3f} ({domains}) |")]
