"""Sampling through the whole engine is exact in distribution, below temperature 1, under top-p, with prompt lookup
and with a reduced draft head; and the same check rejects the engine with a plausible bug patched in."""

import itertools
import json

import pytest
import torch

from specdec import sampling
from specdec.config import GenerationConfig
from specdec.drafters.base import TreeBuilder
from specdec.engine import generate
from specdec.models import LoadedModel, Models
from specdec.tree import TreeShape
from tests.test_engine import PROMPT, _chi_square

N_NEW, RUNS = 2, 400  # 36 cells over V = 6 (sparse ones pooled); the bug controls reject at p < 1e-20 with 250


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs [..., V] -> the smallest most-probable set with mass >= top_p, renormalised (written apart from
    transformers' TopPLogitsWarper): a token stays when the mass ranked strictly above it is below top_p."""
    sorted_p, order = probs.sort(-1, descending=True)  # [..., V]
    above = sorted_p.cumsum(-1) - sorted_p  # [..., V] mass of the tokens ranked before each one
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, above < top_p)  # [..., V]
    kept = probs * keep
    return kept / kept.sum(-1, keepdim=True)


def reference(models: Models, temperature: float, top_p: float = 1.0) -> dict[tuple, float]:
    """P(x1, x2 | prompt) of the target alone, enumerated with full forward passes."""
    model, V = models.target.model, models.target.vocab_size
    prompt = models.target.tokenizer(PROMPT)["input_ids"]
    seqs = list(itertools.product(range(V), repeat=N_NEW))
    ids = torch.tensor([prompt + list(s) for s in seqs])  # [S, L + N_NEW]
    with torch.no_grad():
        probs = nucleus(torch.softmax(model(input_ids=ids).logits.float() / temperature, -1), top_p)  # [S, L+N, V]
    L = len(prompt)
    steps = [probs[:, L - 1 + i].gather(-1, ids[:, L + i, None])[:, 0] for i in range(N_NEW)]  # N_NEW x [S]
    return dict(zip(seqs, torch.stack(steps).prod(0).tolist()))


def sample_engine(models: Models, **settings) -> tuple[dict[tuple, int], int, int, int]:
    """Counts of the emitted continuations over RUNS seeds, how many drafted (or copied) tokens were accepted, how
    many of those were copied by a lookup branch, and how many rounds drafted a tree smaller than their shape."""
    counts: dict[tuple, int] = {}
    accepted = copied = trimmed = 0
    for seed in range(RUNS):
        *rounds, summary = generate(models, PROMPT, GenerationConfig(max_new_tokens=N_NEW, seed=seed, **settings),
                                    chat=False)
        counts[tuple(summary.token_ids)] = counts.get(tuple(summary.token_ids), 0) + 1
        accepted += sum(r.accepted_len for r in rounds)
        copied += sum(n.copied and n.status == "accepted" for r in rounds for n in r.nodes)
        trimmed += sum(len(r.nodes) < 1 + TreeShape(tuple(r.shape)).num_drafted for r in rounds)
    return counts, accepted, copied, trimmed


CASES = [  # (method, tree, temperature, top_p, lookup branch)
    ("mamba-chain", "3", 1.0, 1.0, 0),
    ("mamba-tree", "3,2", 0.7, 1.0, 0),
    ("tf-tree", "2,2", 1.0, 0.9, 0),
    ("tf-tree", "2,2,1", 1.0, 1.0, 0),
    ("lookup-chain", "2", 1.0, 1.0, 0),  # "ab" occurred before: "c a" is copied, each a point-mass proposal
    ("mamba-feat-tree", "2,2", 1.0, 1.0, 0),  # the drafter reading the target's features
    ("mamba-tree", "2,1", 1.0, 1.0, 3),  # a drafted tree with a copied branch grafted on
    ("tf-chain", "2", 1.0, 1.0, 3),
]


@pytest.mark.parametrize("method, tree, temperature, top_p, lookup", CASES)
def test_sampling_is_exact(tiny_models, method, tree, temperature, top_p, lookup):
    dist = reference(tiny_models, temperature, top_p)
    counts, accepted, copied, _ = sample_engine(tiny_models, method=method, tree=tree, temperature=temperature,
                                                top_p=top_p, lookup_branch=lookup)
    assert accepted > RUNS * 0.1  # drafted (or copied) tokens took part, not only the target's corrections
    assert not lookup or copied > RUNS * 0.05  # the grafted branch's copies were accepted too
    assert all(dist[seq] > 0 for seq in counts)  # nothing outside the nucleus was ever emitted
    assert _chi_square(counts, dist, RUNS) > 1e-3


def test_a_bf16_drafter_samples_the_target_distribution(bf16_drafters):
    """The tiny drafters in bfloat16 beside a float32 target (`--drafter-dtype bfloat16`)."""
    counts, accepted, _, _ = sample_engine(bf16_drafters, method="mamba-tree", tree="3,2", temperature=1.0)
    assert accepted > RUNS * 0.1
    assert _chi_square(counts, reference(bf16_drafters, 1.0), RUNS) > 1e-3


def test_top_p_cuts_the_reference():
    """The nucleus reference does drop tokens here, so the top-p cases test something."""
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.85, 0.1, 0.03, 0.02]])
    kept = torch.tensor([[0.5, 0.3, 0.15, 0.0], [0.85, 0.1, 0.0, 0.0]])
    assert torch.allclose(nucleus(probs, 0.9), kept / kept.sum(-1, keepdim=True))


def test_top_p_is_active_on_the_tiny_target(tiny_models):
    cut = reference(tiny_models, 1.0, 0.9)
    assert sum(p == 0 for p in cut.values()) > 0


def test_reduced_draft_head_samples_the_target_distribution(tiny_models, tmp_path):
    """`draft_vocab.json` (as the shipped drafters have) limits what the drafter proposes; q is 0 elsewhere."""
    head = [0, 2, 3]
    (tmp_path / "draft_vocab.json").write_text(json.dumps({"token_ids": head}))
    mamba = tiny_models.drafter("mamba")
    models = Models.from_loaded(tiny_models.target, {"mamba": LoadedModel("m", mamba.model, mamba.tokenizer, str(tmp_path))})
    dist = reference(models, 1.0)
    counts: dict[tuple, int] = {}
    drafted: set[int] = set()
    accepted = 0
    for seed in range(RUNS):
        *rounds, summary = generate(models, PROMPT, GenerationConfig(method="mamba-tree", tree="3,2", temperature=1.0,
                                                                     max_new_tokens=N_NEW, seed=seed), chat=False)
        counts[tuple(summary.token_ids)] = counts.get(tuple(summary.token_ids), 0) + 1
        drafted |= {n.token_id for r in rounds for n in r.nodes[1:]}
        accepted += sum(r.accepted_len for r in rounds)
    assert drafted <= set(head) and accepted > RUNS * 0.1
    assert set(t for seq in counts for t in seq) - set(head)  # the target still emits tokens the head lacks
    assert _chi_square(counts, dist, RUNS) > 1e-3


def _skip_residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return p  # bug: after a rejection the next child (or the correction) is drawn from p, not norm(max(0, p - q))


def _no_point_mass(like: torch.Tensor, x: int) -> torch.Tensor:
    return torch.zeros_like(like)  # bug: a copied token's proposal is taken as q = 0 instead of the point mass δ_x


def _as_if_independent(q: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    return q  # bug: a later sibling, drawn from q less the earlier ones, is tested against the whole of q


@pytest.mark.parametrize("name, bug, method, tree", [("residual", _skip_residual, "mamba-tree", "3,2"),
                                                     ("_point_mass", _no_point_mass, "lookup-chain", "2"),
                                                     ("_without", _as_if_independent, "mamba-tree", "3,2")])
def test_the_check_rejects_a_plausible_bug(tiny_models, monkeypatch, name, bug, method, tree):
    """Negative controls: the engine with one line of its acceptance wrong fails the same chi-square check."""
    assert callable(getattr(sampling, name))  # the function the bug replaces is still there
    monkeypatch.setattr(sampling, name, bug)
    counts, accepted, _, _ = sample_engine(tiny_models, method=method, tree=tree, temperature=1.0)
    assert accepted > RUNS * 0.2
    assert _chi_square(counts, reference(tiny_models, 1.0), RUNS) < 1e-6


TRIM = 0.3  # on the tiny models' six tokens this leaves some draws unexpanded and expands others


@pytest.mark.parametrize("method, tree", [("mamba-tree", "3,2"), ("tf-tree", "2,2,1")])
def test_a_tree_trimmed_by_confidence_samples_the_target_distribution(tiny_models, method, tree):
    """`min_branch_q` under sampling: only draws whose branch is likely enough get children; every draw stays."""
    counts, accepted, _, trimmed = sample_engine(tiny_models, method=method, tree=tree, temperature=1.0,
                                                 min_branch_q=TRIM)
    assert accepted > RUNS * 0.1 and trimmed > RUNS * 0.2  # trees were trimmed, and drafts were still accepted
    assert _chi_square(counts, reference(tiny_models, 1.0), RUNS) > 1e-3


def test_the_check_rejects_dropping_unlikely_draws_under_sampling(tiny_models, monkeypatch):
    """Negative control: dropping a sampled child for its own low q (what greedy decoding may do) is inexact."""
    plain_init = TreeBuilder.__init__

    def dropping_init(self, root, sampler):
        plain_init(self, root, sampler)
        self.drop_weak = True  # bug: the greedy rule applied to sampled children

    monkeypatch.setattr(TreeBuilder, "__init__", dropping_init)
    counts, accepted, _, trimmed = sample_engine(tiny_models, method="mamba-tree", tree="3,2", temperature=1.0,
                                                 min_branch_q=TRIM)
    assert accepted > RUNS * 0.1 and trimmed > RUNS * 0.2
    assert _chi_square(counts, reference(tiny_models, 1.0), RUNS) < 1e-6
