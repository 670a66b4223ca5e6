"""Drafters behind one interface: Mamba (batch-cache trees; plug-in or reading the target's features), a small Transformer, prompt lookup, none."""

from specdec.drafters.base import Drafter, DraftTree, NoDrafter, Sampler
from specdec.drafters.lookup import LookupBranch, LookupDrafter
from specdec.drafters.mamba import MambaDrafter
from specdec.drafters.mamba_feat import MambaFeatDrafter
from specdec.drafters.transformer import TransformerDrafter

__all__ = ["DraftTree", "Drafter", "LookupBranch", "LookupDrafter", "MambaDrafter", "MambaFeatDrafter", "NoDrafter", "Sampler",
           "TransformerDrafter"]
