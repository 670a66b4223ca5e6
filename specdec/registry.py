"""Every drafter kind, declared once; the methods, the CLI's and the app's options and labels follow from here.

A kind names the `Drafter` class that implements it (imported only when first used, so this module and
`specdec.config` need no torch). A class of a kind with a model provides `load(spec, device, dtype, target)`,
returning a `LoadedModel`, and every class provides `build(loaded, target)`, returning a fresh drafter for one
generation (`loaded` is None for a kind without a model). Adding a drafter is one module with such a class and
one `DrafterKind` below.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

POLICIES = ("chain", "tree", "ucb")  # a single chain, a fixed tree shape, a shape chosen by the bandit
POLICY_TEXT = {"chain": "a single chain", "tree": "a fixed tree shape",
               "ucb": "tree shape chosen each round by a UCB bandit"}


@dataclass(frozen=True)
class DrafterKind:
    name: str  # as the engine and the records say it
    prefix: str  # its methods are named "<prefix>-<policy>"
    implementation: str  # "module:Class" of its `Drafter`
    summary: str  # what it is, in a few words: the start of its methods' descriptions
    label: str  # its name in the app
    blurb: str  # the line the app shows under it: what it costs and buys
    policies: tuple[str, ...] = POLICIES
    model: str | None = None  # the default model (a preset name); None for a kind that needs no model
    flag: str | None = None  # the command-line option that names its model, in `generate`, `bench` and the app
    env: str | None = None  # the app's environment variable for that option
    aliases: tuple[str, ...] = ()  # other spellings of `flag` the app accepts

    @property
    def has_model(self) -> bool:
        return self.model is not None

    @property
    def methods(self) -> dict[str, str]:
        """method name -> policy; a kind without policies has one method, its prefix, that drafts nothing."""
        if not self.policies:
            return {self.prefix: "none"}
        return {f"{self.prefix}-{policy}": policy for policy in self.policies}

    @property
    def option(self) -> str | None:
        """The attribute `argparse` stores its flag under."""
        return self.flag.removeprefix("--").replace("-", "_") if self.flag else None

    def implementation_class(self):
        module, _, name = self.implementation.partition(":")
        return getattr(importlib.import_module(module), name)


KINDS: dict[str, DrafterKind] = {kind.name: kind for kind in (
    DrafterKind("mamba", "mamba", "specdec.drafters.mamba:MambaDrafter", "Mamba drafter",
                "Mamba (plug-in)", "Trained once on the target's answers; works beside any target with the same "
                "tokenizer, with no retraining. Its state has a fixed size however long the text.",
                model="mamba-smollm2", flag="--mamba-drafter", env="SPECDEC_DRAFTER", aliases=("--drafter",)),
    DrafterKind("mamba-feat", "mamba-feat", "specdec.drafters.mamba_feat:MambaFeatDrafter",
                "Mamba drafter reading the target's hidden state", "Mamba reading the target",
                "Also reads the target's last hidden state, which each check computes anyway: more to go on per "
                "token, but trained for this one target and useless with any other.",
                model="mamba-feat-smollm2", flag="--feat-drafter", env="SPECDEC_FEAT_DRAFTER"),
    DrafterKind("xmamba", "xmamba", "specdec.drafters.cross:CrossMamba", "Mamba drafter with its own tokenizer",
                "Mamba, another tokenizer", "A Mamba drafter that does not share the target's tokenizer: its "
                "guesses are turned into text and re-encoded for the target, which costs a little each round.",
                model="xmamba-smollm2", flag="--xdrafter", env="SPECDEC_XDRAFTER"),
    DrafterKind("transformer", "tf", "specdec.drafters.transformer:TransformerDrafter",
                "small Transformer drafter", "Transformer",
                "A small Transformer drafter: its KV cache, and its step, grow with the text.",
                policies=("chain", "tree"), model="tf-smollm2", flag="--tf-drafter", env="SPECDEC_TF_DRAFTER"),
    DrafterKind("lookup", "lookup", "specdec.drafters.lookup:LookupDrafter",
                "prompt lookup: copy what followed the last n-gram match", "None: prompt lookup",
                "No model: copies what followed the last matching words of the text. Free; helps on summaries "
                "and edits.", policies=("chain",)),
    DrafterKind("none", "ar", "specdec.drafters.base:NoDrafter",
                "target only: plain autoregressive decoding with the KV cache", "None: target only",
                "No drafting: the baseline every other choice is measured against.", policies=()),
)}

MODEL_KINDS = tuple(name for name, kind in KINDS.items() if kind.has_model)


def kind(name: str) -> DrafterKind:
    if name not in KINDS:
        raise ValueError(f"unknown drafter kind {name!r}; choose one of {', '.join(KINDS)}")
    return KINDS[name]
