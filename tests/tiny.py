"""Tiny models and a character tokenizer for fast tests."""

import json

import torch
from transformers import LlamaConfig, LlamaForCausalLM, MambaConfig, MambaForCausalLM


class TinyTokenizer:
    """One character per token id: enough of the tokenizer interface for the engine."""

    chat_template = None
    eos_token_id = None

    def __init__(self, vocab_size: int) -> None:
        self.alphabet = "abcdefghijklmnopqrstuvwxyz"[:vocab_size]

    def __call__(self, text: str) -> dict:
        return {"input_ids": [self.alphabet.index(c) % len(self.alphabet) if c in self.alphabet else 0 for c in text]}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(self.alphabet[i] for i in ids)

    def get_vocab(self) -> dict:
        return {c: i for i, c in enumerate(self.alphabet)}


def tiny_llama(vocab_size: int, seed: int, attn: str = "sdpa", positions: int = 256) -> LlamaForCausalLM:
    """Large init range so the next-token distributions are far from uniform (and from other seeds')."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions,
                         initializer_range=0.3, tie_word_embeddings=False, attn_implementation=attn,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    return model


def tiny_mamba(vocab_size: int, seed: int) -> MambaForCausalLM:
    torch.manual_seed(seed)
    config = MambaConfig(vocab_size=vocab_size, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2,
                         conv_kernel=4, initializer_range=0.3, use_mambapy=True, tie_word_embeddings=True)
    return MambaForCausalLM(config).eval()


def tiny_feat(target_hidden: int, seed: int):
    """A random `mamba-feat` drafter for a target of hidden size `target_hidden`."""
    from specdec.drafters.mamba_feat import FeatConfig, MambaFeatModel

    torch.manual_seed(seed)
    model = MambaFeatModel(FeatConfig(target_hidden=target_hidden, hidden=16, layers=2, state_size=8)).eval()
    torch.nn.init.normal_(model.w_out.weight, std=0.3)  # a trained drafter's guesses are not all zero
    return model


def write_corpus(folder, per_domain: int, held_out: int, prompt, text: str) -> None:
    """A `corpus` stage's folder: `per_domain` prompts in each template domain, the last `held_out` of them in
    the eval split, `prompt(domain, i)` their text; and one passage of raw text to label."""
    from specdec.distill.corpus import DOMAINS

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "prompts.jsonl", "w") as f:
        for domain in DOMAINS:
            for i in range(per_domain):
                split = "eval" if i >= per_domain - held_out else "train"
                f.write(json.dumps({"id": f"{domain}-{i}", "domain": domain, "split": split,
                                    "text": prompt(domain, i)}) + "\n")
    with open(folder / "text.jsonl", "w") as f:
        f.write(json.dumps({"domain": "prose", "text": text}) + "\n")
