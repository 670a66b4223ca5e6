"""specdec: exact speculative decoding with Mamba drafters, draft trees and a UCB bandit.

References:
    Choi et al., "Mamba Drafters for Speculative Decoding", Findings of EMNLP 2025 (arXiv 2506.01206).
    Leviathan et al., "Fast Inference from Transformers via Speculative Decoding", ICML 2023.
    Miao et al., "SpecInfer: Accelerating LLM Serving with Tree-based Speculative Inference", ASPLOS 2024.
    Gu and Dao, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces", 2023.
"""
