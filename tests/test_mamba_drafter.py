"""Batch-cache tree drafting: copying Mamba states per child equals running each branch from scratch; the mixer's
step, sequence and training paths (and, on a GPU, its fused kernels) agree."""

import pytest
import torch

from specdec.drafters import MambaDrafter, Sampler
from specdec.drafters.base import TreeBuilder
from specdec.drafters.mamba import MambaState
from specdec.drafters import mixer as mixer_module
from specdec.drafters.mixer import (kernels_available, mixer_forward, mixer_sequence, mixer_step_kernel,
                                    mixer_step_ref, mixer_weights, scan_sequence, scan_step)
from specdec.tree import TreeShape, parse_shape
from tests.tiny import tiny_llama, tiny_mamba

V = 13


def _scratch_logits(model, seq: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([seq])).logits[0, -1]  # full-sequence path from a zero state


def _branch(parents, node):
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def test_mixer_step_sequence_and_training_paths_agree():
    """l recurrent steps from a zero state = the sequence pass (outputs and both states) = the trainable pass, whose
    gradients reach every mixer weight."""
    mixer = tiny_mamba(V, seed=2).backbone.layers[0].mixer
    hidden = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(0))  # [b, l, d]
    conv = torch.zeros(2, mixer.intermediate_size, mixer.conv_kernel_size)
    ssm = torch.zeros(2, mixer.intermediate_size, mixer.ssm_state_size)
    with torch.no_grad():
        weights = mixer_weights(mixer)
        stepped = torch.stack([mixer_step_ref(weights, hidden[:, t], conv, ssm) for t in range(7)], dim=1)
        out, (conv_last, ssm_last) = mixer_sequence(mixer, hidden)
    torch.testing.assert_close(out, stepped, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(conv_last, conv)
    torch.testing.assert_close(ssm_last, ssm, atol=1e-5, rtol=1e-5)
    trained = mixer_forward(mixer, hidden)
    torch.testing.assert_close(trained, out, atol=1e-5, rtol=1e-5)
    trained.square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in mixer.parameters())


def test_the_step_calls_a_packed_linear_and_reads_a_plain_ones_weight():
    """`MixerWeights` calls a linear layer the loader packed (`specdec.packed`) as itself, and multiplies by a plain
    one's weight directly; the step gives the same outputs and states either way."""
    from specdec.packed import PackedLinear, pack_linears
    from specdec.probes import packing_available
    if not packing_available(torch.float32):
        pytest.skip("no packed float32 linear on this CPU")
    plain, packed = tiny_mamba(V, seed=2), tiny_mamba(V, seed=2)
    assert pack_linears(packed) > 0
    mixer = packed.backbone.layers[0].mixer
    weights, plain_weights = mixer_weights(mixer), mixer_weights(plain.backbone.layers[0].mixer)
    assert isinstance(mixer.in_proj, PackedLinear) and weights.in_proj is mixer.in_proj
    assert plain_weights.in_proj.func is torch.nn.functional.linear
    assert plain_weights.in_proj.keywords["weight"] is plain.backbone.layers[0].mixer.in_proj.weight
    hidden = torch.randn(3, 32, generator=torch.Generator().manual_seed(0))
    states = [(torch.zeros(3, mixer.intermediate_size, mixer.conv_kernel_size),
               torch.zeros(3, mixer.intermediate_size, mixer.ssm_state_size)) for _ in range(2)]
    with torch.no_grad():
        for _ in range(3):
            outs = [mixer_step_ref(w, hidden, *state) for w, state in zip((weights, plain_weights), states)]
            torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(states[0][1], states[1][1], atol=1e-5, rtol=1e-5)


def test_the_sequence_scan_equals_steps_across_its_chunks(monkeypatch):
    """`scan_sequence` makes Ā and B̄x a chunk of time steps at a time: its outputs and last state equal `scan_step`'s
    over lengths that end inside, at, and past a chunk's end, from a zero state and from a given one (not changed)."""
    monkeypatch.setattr(mixer_module, "SCAN_CHUNK", 4)
    g = torch.Generator().manual_seed(1)
    b, d, n = 2, 6, 3
    A = -torch.rand(d, n, generator=g)
    for length in (3, 4, 9):
        x, dt = torch.randn(b, length, d, generator=g), torch.rand(b, length, d, generator=g)
        B, C = torch.randn(b, length, n, generator=g), torch.randn(b, length, n, generator=g)
        for start in (None, torch.randn(b, d, n, generator=g)):
            s = torch.zeros(b, d, n) if start is None else start.clone()
            stepped = torch.stack([scan_step(s, x[:, t], dt[:, t], A, B[:, t], C[:, t]) for t in range(length)], 1)
            kept = None if start is None else start.clone()
            y, last = scan_sequence(x, dt, A, B, C, start)
            torch.testing.assert_close(y, stepped)
            torch.testing.assert_close(last, s)
            assert start is None or torch.equal(start, kept)


def test_step_matches_full_sequence_forward():
    model = tiny_mamba(V, seed=3)
    drafter = MambaDrafter(model, V)
    context = [1, 5, 2, 8, 3, 3, 9]
    state, logits = drafter.prefill(context[:3])
    torch.testing.assert_close(logits, _scratch_logits(model, context[:3]), atol=1e-4, rtol=1e-4)
    for i in range(3, len(context)):
        logits = drafter.step(torch.tensor([context[i]]), state)[0]
        torch.testing.assert_close(logits, _scratch_logits(model, context[: i + 1]), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("widths", [(3, 2, 1), (2, 2, 2), (1, 1, 1, 1)])
def test_tree_states_equal_running_each_branch(widths):
    model = tiny_mamba(V, seed=4)
    drafter = MambaDrafter(model, V)
    context = [2, 7, 1, 1, 4]
    shape = TreeShape(widths)
    drafter.start(context, shape.num_drafted)
    tree = drafter.draft(shape, Sampler(1.0, 1.0, torch.Generator().manual_seed(0)))
    assert tree.parents == shape.parents
    for node in range(len(tree.tokens)):
        seq = context + [tree.tokens[i] for i in _branch(tree.parents, node)[1:]]
        expected = torch.softmax(_scratch_logits(model, seq), -1)
        if node >= len(tree.tokens) - shape.level_sizes[-1]:
            continue  # leaves are not stepped (commit steps an accepted one): no q, no state row
        torch.testing.assert_close(tree.q[node], expected, atol=1e-5, rtol=1e-4)  # what its children came from
        # every inner node's state row, stepped once more, continues its own branch
        state = drafter.buffers.select(torch.tensor([node]))
        nxt = drafter.step(torch.tensor([0]), state)[0]
        torch.testing.assert_close(nxt, _scratch_logits(model, seq + [0]), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("path", [[0, 2, 5], [0, 2], [0]])
def test_commit_continues_from_the_deepest_stepped_node(path):
    """An accepted leaf was never stepped: commit takes its parent's row and steps the leaf, then the root."""
    model = tiny_mamba(V, seed=5)
    drafter = MambaDrafter(model, V)
    context = [3, 3, 6]
    shape = TreeShape((2, 2))
    drafter.start(context, shape.num_drafted)
    buffers = drafter.buffers
    tree = drafter.draft(shape, Sampler(0.0, 1.0, None))
    drafter.commit(path, next_token=11)
    assert drafter.buffers is buffers  # allocated once per generation
    drafter.catch_up()  # what the next draft does first
    seq = context + [tree.tokens[node] for node in path[1:]] + [11]
    torch.testing.assert_close(drafter.root_logits, _scratch_logits(model, seq), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("greedy", [True, False])
def test_a_trimmed_tree_keeps_likely_branches_and_their_states(greedy):
    """`min_branch_q`: only nodes whose branch probability reaches it get children (greedy: only such nodes are
    kept at all); every node with children has the state of its own branch, and a commit continues from it."""
    model = tiny_mamba(V, seed=4)
    context, shape, trim = [2, 7, 1, 1, 4], TreeShape((3, 2, 2)), 0.1
    sampler = Sampler(0.0 if greedy else 1.0, 1.0, torch.Generator().manual_seed(1), min_branch_q=trim)
    drafter = MambaDrafter(model, V)
    drafter.start(context, shape.num_drafted)
    tree = drafter.draft(shape, sampler)
    branch_q = [1.0]
    for node in range(1, len(tree.tokens)):
        branch_q.append(branch_q[tree.parents[node]] * tree.q_tok[node])
    parents = set(tree.parents[1:])
    assert 1 < len(tree.tokens) < 1 + shape.num_drafted  # trimmed, not emptied
    assert all(branch_q[node] >= trim for node in parents)  # children only under likely branches
    if greedy:
        assert all(q >= trim for q in branch_q)
    else:
        assert any(q < trim for q in branch_q)  # an unlikely draw stays, as a leaf
    for node in parents - {0}:
        seq = context + [tree.tokens[i] for i in _branch(tree.parents, node)[1:]]
        nxt = drafter.step(torch.tensor([0]), drafter.buffers.select(torch.tensor([node])))[0]
        torch.testing.assert_close(nxt, _scratch_logits(model, seq + [0]), atol=1e-4, rtol=1e-4)
    leaf = next(node for node in range(1, len(tree.tokens)) if node not in parents)  # an accepted leaf
    path = _branch(tree.parents, leaf)
    drafter.commit(path, next_token=11)
    drafter.catch_up()
    seq = context + [tree.tokens[node] for node in path[1:]] + [11]
    torch.testing.assert_close(drafter.root_logits, _scratch_logits(model, seq), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("greedy", [True, False])
def test_leaves_and_expansions_have_their_own_thresholds(greedy):
    """`min_branch_q` drops weak leaves (greedy only), `min_expand_q` decides which nodes get children."""
    sampler = Sampler(0.0 if greedy else 1.0, 1.0, None, min_branch_q=0.1, min_expand_q=0.4)
    builder = TreeBuilder(5, sampler)
    q = torch.tensor([[0.5, 0.3, 0.05, 0.15]])
    frontier = builder.add_level([0], torch.tensor([[0, 1, 2]]), q)
    assert builder.tokens == ([5, 0, 1] if greedy else [5, 0, 1, 2])  # q 0.05 below the leaf threshold
    assert frontier == [1]  # only the node from 0.4 on gets children; q 0.3 stays a leaf
    frontier = builder.add_level(frontier, torch.tensor([[3, 1]]), q)  # branch q 0.5 * 0.15 and 0.5 * 0.3
    assert frontier == []  # 0.075 and 0.15: neither expands
    assert builder.tokens[3 if greedy else 4:] == ([1] if greedy else [3, 1])  # 0.075 is kept under sampling only


def test_rounds_that_draft_nothing_leave_the_tokens_for_one_sequence_pass():
    """A root-only round feeds the drafter nothing: the accepted tokens wait, and the next round that drafts feeds
    them in one pass from the kept state, its q then that of the whole context from scratch; the sequence pass
    from a state equals stepping token by token."""
    model = tiny_mamba(V, seed=7)
    drafter = MambaDrafter(model, V)
    context, sampler = [4, 1, 9], Sampler(1.0, 1.0, torch.Generator().manual_seed(0))
    drafter.start(context, 4)
    calls = []
    real_step = drafter.step
    drafter.step = lambda *args, **kwargs: calls.append(1) or real_step(*args, **kwargs)
    emitted = [5, 2, 12, 6]
    for token in emitted:
        tree = drafter.draft(parse_shape("0"), sampler)
        assert tree.tokens == [drafter.root] and tree.parents == [-1]
        drafter.commit([0], next_token=token)
    assert not calls  # nothing stepped in four rounds
    tree = drafter.draft(TreeShape((1, 1)), sampler)
    expected = torch.softmax(_scratch_logits(model, context + emitted), -1)
    torch.testing.assert_close(tree.q[0], expected, atol=1e-5, rtol=1e-4)
    state, _ = drafter.prefill(context)
    stepped = [drafter.step(torch.tensor([t]), state)[0] for t in emitted][-1]
    fed, _ = drafter.prefill(context)
    torch.testing.assert_close(drafter.feed(emitted, fed), stepped, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(fed.ssm, state.ssm, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(fed.conv, state.conv)


@pytest.mark.parametrize("kind", ["mamba", "transformer"])
def test_a_drafter_starts_from_the_prompts_last_tokens(monkeypatch, kind):
    """A prompt longer than `prefill_window` is read from its last tokens only: the root's q is the model's over
    those tokens alone (from a zero state; for the Transformer drafter, from position 0)."""
    from specdec.drafters.transformer import TransformerDrafter

    drafter_class, model = ((MambaDrafter, tiny_mamba(V, seed=3)) if kind == "mamba"
                            else (TransformerDrafter, tiny_llama(V, seed=3)))
    monkeypatch.setattr(drafter_class, "prefill_window", 4)
    drafter = drafter_class(model, V)
    context = [4, 1, 9, 7, 2, 11, 5]
    drafter.start(context, 4)
    tree = drafter.draft(TreeShape((1,)), Sampler(1.0, 1.0, torch.Generator().manual_seed(0)))
    torch.testing.assert_close(tree.q[0], torch.softmax(_scratch_logits(model, context[-4:]), -1), atol=1e-5, rtol=1e-4)
    assert not torch.allclose(tree.q[0], torch.softmax(_scratch_logits(model, context), -1), atol=1e-3)


def test_reduced_draft_head_puts_no_mass_outside_it():
    model = tiny_mamba(V, seed=6)
    head = torch.tensor([0, 2, 3, 7, 12])
    drafter = MambaDrafter(model, V, head_ids=head)
    drafter.start([1, 2, 3], 6)
    tree = drafter.draft(TreeShape((2, 2)), Sampler(1.0, 1.0, torch.Generator().manual_seed(0)))
    assert set(tree.tokens[1:]) <= set(head.tolist())
    outside = torch.ones(V, dtype=torch.bool)
    outside[head] = False
    assert tree.q[0][outside].sum() == 0 and torch.isclose(tree.q[0].sum(), torch.tensor(1.0))


@pytest.mark.skipif(not kernels_available(torch.device("cuda")) if torch.cuda.is_available() else True,
                    reason="needs CUDA with mamba_ssm and causal_conv1d")
def test_cuda_kernels_agree_with_reference():
    model = tiny_mamba(V, seed=7).cuda()
    mixer = model.backbone.layers[0].mixer
    x = torch.randn(4, model.config.hidden_size, device="cuda")
    state_a = MambaState(torch.randn(1, 4, mixer.intermediate_size, 4, device="cuda"),
                         torch.randn(1, 4, mixer.intermediate_size, 8, device="cuda"))
    state_b = MambaState(state_a.conv.clone(), state_a.ssm.clone())
    y_ref = mixer_step_ref(mixer_weights(mixer), x, state_a.conv[0], state_a.ssm[0])
    y_ker = mixer_step_kernel(mixer_weights(mixer), x, state_b.conv[0], state_b.ssm[0])
    torch.testing.assert_close(y_ker, y_ref, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(state_b.ssm, state_a.ssm, atol=1e-3, rtol=1e-3)
