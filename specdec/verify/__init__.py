"""The verifier: `TreeLM`, a causal LM whose KV cache holds a speculative tree, and its backends.

`base`: the interface and the plain backend (one masked attention call per layer: CUDA, MPS); `cpu`: the CPU
backends (packed linears, a Llama's layers run directly, and for the target the row-invariant split layout of
`split`). `TreeLM(model)` picks one once, when it is made.
"""

from specdec.verify.base import TreeLM, ancestor_matrix, backend_for, tree_attention_mask

__all__ = ["TreeLM", "ancestor_matrix", "backend_for", "tree_attention_mask"]
