"""specdec: exact speculative decoding with Mamba drafters, draft trees and a UCB bandit.

References:
    Choi et al., "Mamba Drafters for Speculative Decoding", Findings of EMNLP 2025 (arXiv 2506.01206).
    Leviathan et al., "Fast Inference from Transformers via Speculative Decoding", ICML 2023.
    Miao et al., "SpecInfer: Accelerating LLM Serving with Tree-based Speculative Inference", ASPLOS 2024.
    Gu and Dao, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces", 2023.
"""

import os

# Intel MKL (torch's float32 BLAS on x86) may give a matrix product other bits when its operands sit at other memory
# alignments, and the CPU attention kernel multiplies into per-thread scratch buffers, so on some CPUs a row's
# attention changed with the thread that computed it, that is with the other rows of the call. MKL's Conditional
# Numerical Reproducibility mode makes its results independent of alignment; MKL reads it at its first call, so it
# is set when the package is imported (a process that ran float32 matmuls before that keeps MKL's default, and the
# attention probe, `specdec.probes.probe_attention_mode`, says so).
os.environ.setdefault("MKL_CBWR", "AUTO")
