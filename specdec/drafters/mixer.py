"""The Mamba mixer (a Hugging Face `MambaMixer`'s weights), written once as small functions.

Glossary (Mamba paper / mamba-minimal):
    b, B    batch rows                        l     sequence length
    d       model width (hidden_size)         d_in  inner width (expand * d)
    K       conv kernel width                 N     SSM state size        R  rank of Δ's projection
    x       the conv's output, the scan's input; z the gate
    Δ (dt)  input-dependent step size         A, B, C, D  SSM parameters (B, C input-dependent)
    s       SSM state [d_in, N] per row: s_t = exp(Δ_t A) s_{t-1} + Δ_t B_t x_t,  y_t = C_t · s_t + D x_t

One mixer pass is: `project_in` (x, z) -> causal depthwise conv (`conv_step` or `conv_sequence`) ->
`ssm_parameters` (Δ, A, B, C) -> a scan (`scan_step`, `scan_sequence`, or the trainable `selective_scan`) ->
`project_out` (skip D x, gate silu(z), out_proj). The pieces read the mixer's parameters as `MixerWeights`, made
once per drafter for its steps, so a step is plain tensor operations. Three paths are built from these pieces:
- `mixer_step_ref`: one recurrent step from a state (the drafters' step); `mixer_step_kernel` is its twin with
  the conv and scan steps replaced by the fused CUDA kernels of causal_conv1d and mamba_ssm;
- `mixer_sequence`: a whole sequence from a zero state (prefill) or from a given one (a drafter catching up
  on several tokens at once), with the states after its last token;
- `mixer_forward`: the same sequence pass through `selective_scan`, which has its own backward (training).
Tests check that the step, the sequence and the training pass agree, and the kernels with the reference on a GPU.
The linear layers (in_proj, x_proj, out_proj) run in the weights' dtype, everything between them in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

try:  # GPU kernels; absent (or failing to import) without CUDA
    from causal_conv1d import causal_conv1d_update as _conv_update_kernel
    from mamba_ssm.ops.triton.selective_state_update import selective_state_update as _ssm_update_kernel
except Exception:  # noqa: BLE001 - any import failure means "no kernels"
    _conv_update_kernel = _ssm_update_kernel = None

Linear = Callable[[torch.Tensor], torch.Tensor]  # [..., in] -> [..., out]
Scan = Callable[..., tuple[torch.Tensor, torch.Tensor]]  # (x, Δ, A, B, C) -> (y [b, l, d_in], last s [b, d_in, N])


def kernels_available(device: torch.device) -> bool:
    return device.type == "cuda" and _ssm_update_kernel is not None and _conv_update_kernel is not None


# --- the weights ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MixerWeights:
    """One mixer's parameters as the pieces read them, made once (`mixer_weights`): the linear layers as calls in
    their weights' dtype, the rest float32, and A = -exp(A_log). They read the mixer's own tensors (views; copies
    where a dtype changes) except A: a drafter makes them when it is built and steps with them, a sequence pass
    (the training pass too, gradients flowing through them to the parameters) makes them each time."""

    in_proj: Linear  # d -> 2 d_in
    x_proj: Linear  # d_in -> R + 2N
    out_proj: Linear  # d_in -> d
    dtype: torch.dtype  # the linears' weights'
    conv: torch.Tensor  # [d_in, K], float32
    conv_bias: torch.Tensor | None  # [d_in], float32
    dt_proj: torch.Tensor  # [d_in, R], float32
    dt_bias: torch.Tensor  # [d_in], float32
    A: torch.Tensor  # [d_in, N], float32
    D: torch.Tensor  # [d_in], float32
    act: Callable[[torch.Tensor], torch.Tensor]
    rank: int  # R
    state_size: int  # N


def _linear(module: nn.Module) -> Linear:
    """A linear layer as a call: a plain `nn.Linear` as `F.linear` on its weight (no module call), anything else
    (a packed linear of `specdec.packed`, which the loader makes of a drafter's larger layers) as itself."""
    if type(module) is nn.Linear:
        return partial(F.linear, weight=module.weight, bias=module.bias)
    return module


def mixer_weights(mixer) -> MixerWeights:
    """A Hugging Face `MambaMixer`'s parameters as `MixerWeights`."""
    conv_bias = mixer.conv1d.bias
    return MixerWeights(
        _linear(mixer.in_proj), _linear(mixer.x_proj), _linear(mixer.out_proj), mixer.in_proj.weight.dtype,
        mixer.conv1d.weight[:, 0, :].float(), conv_bias.float() if conv_bias is not None else None,
        mixer.dt_proj.weight.float(), mixer.dt_proj.bias.float(), -torch.exp(mixer.A_log.float()), mixer.D.float(),
        F.silu if getattr(mixer, "activation", None) == "silu" else mixer.act, mixer.time_step_rank,
        mixer.ssm_state_size)


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """A Mamba block's RMSNorm (`MambaRMSNorm`): normalised in float32, then scaled in the weight's dtype."""
    return weight * F.rms_norm(hidden.float(), hidden.shape[-1:], eps=eps).to(weight.dtype)


# --- the pieces -------------------------------------------------------------------------------------------------
def project_in(w: MixerWeights, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., d] -> (the conv's input, the gate z), [..., d_in] each, float32."""
    x, z = w.in_proj(hidden).float().chunk(2, dim=-1)
    return x, z


def conv_step(w: MixerWeights, window: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Shift x [B, d_in] into the conv window [B, d_in, K] (in place) -> act(conv) [B, d_in]."""
    window.copy_(torch.roll(window, shifts=-1, dims=-1))
    window[:, :, -1] = x
    out = (window * w.conv).sum(-1)  # [B, d_in]
    return w.act(out + w.conv_bias if w.conv_bias is not None else out)


def conv_sequence(w: MixerWeights, x: torch.Tensor,
                  window: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The causal conv over x [b, l, d_in] from a zero window, or from `window` [b, d_in, K] (the conv's inputs
    before x, as `conv_step` keeps them) -> (act(conv) [b, l, d_in], window after the last token [b, d_in, K]: its
    last K inputs, zero-padded on the left)."""
    length, K = x.shape[1], w.conv.shape[1]
    if window is None:
        x = x.transpose(1, 2)  # [b, d_in, l]
        out = F.conv1d(x, w.conv[:, None], w.conv_bias, padding=K - 1, groups=x.shape[1])[..., :length]
        return w.act(out).transpose(1, 2), F.pad(x, (max(K - length, 0), 0))[..., -K:]
    # From a window, time-major: the K taps as multiply-adds over [b, l, d_in] rows, as `conv_step` sums them,
    # with no transposed copy of x.
    full = torch.cat([window[..., 1:].transpose(1, 2), x], dim=1)  # [b, K - 1 + l, d_in]
    taps = w.conv.t()  # [K, d_in]
    out = full[:, :length] * taps[0]
    for k in range(1, K):
        out.addcmul_(full[:, k: k + length], taps[k])
    if w.conv_bias is not None:
        out += w.conv_bias
    return w.act(out), full[:, -K:].transpose(1, 2)


def ssm_parameters(w: MixerWeights, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The selection: x [..., d_in] -> (Δ [..., d_in], A [d_in, N], B [..., N], C [..., N]), float32.

    Δ = softplus(dt_proj(x_proj_Δ(x))) through the rank-R projection, B and C from x_proj; the scan discretises
    them (Ā = exp(Δ A), B̄ x = Δ B x). x_proj runs in its weight's dtype.
    """
    N = w.state_size
    dt, B, C = torch.split(w.x_proj(x.to(w.dtype)).float(), [w.rank, N, N], dim=-1)
    return F.softplus(F.linear(dt, w.dt_proj, w.dt_bias)), w.A, B, C  # Δ [..., d_in]


def scan_step(s: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
              C: torch.Tensor) -> torch.Tensor:
    """s_t = exp(Δ A) s_{t-1} + Δ B x with s [B, d_in, N] updated in place; x, Δ [B, d_in], B, C [B, N] -> C · s_t
    [B, d_in]."""
    s.mul_(torch.exp(dt[..., None] * A)).addcmul_((dt * x)[..., None], B[:, None, :])
    return (s @ C[..., None]).squeeze(-1)


SCAN_CHUNK = 256  # time steps whose Ā and B̄x `scan_sequence` makes at once: 2 x chunk x d_in x N floats a row


def scan_sequence(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                  s: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`scan_step` over l positions from a zero state, or from `s` [b, d_in, N] (left as it is): x, Δ [b, l, d_in],
    B, C [b, l, N] -> (C_t · s_t [b, l, d_in], the last state [b, d_in, N]).

    Per chunk of time steps, Ā = exp(Δ A) and B̄x = Δ x B are made for all its steps at once, and B̄x is then
    turned into the states in place, s_t = Ā_t s_{t-1} + B̄x_t, one fused multiply-add a step; C · s is read off
    all the chunk's states in one batched product. The chunks reuse two buffers and write into one output, so a
    long prompt allocates (and faults in) no fresh memory per chunk."""
    rows, length, d_in = x.shape
    chunk = max(1, min(SCAN_CHUNK, length))
    decay_buffer = x.new_empty(rows, chunk, d_in, A.shape[1])  # Ā of the chunk's steps
    state_buffer = torch.empty_like(decay_buffer)  # B̄x, then the states
    all_steps, all_decays = state_buffer.unbind(1), decay_buffer.unbind(1)  # views of each step, made once
    state = x.new_zeros(rows, d_in, A.shape[1]) if s is None else s.clone()  # the state before each chunk
    y = x.new_empty(rows, length, d_in)
    for t0 in range(0, length, chunk):
        t = slice(t0, t0 + chunk)
        n = min(chunk, length - t0)
        torch.mul(dt[:, t, :, None], A, out=decay_buffer[:, :n]).exp_()  # Ā [b, n, d_in, N]
        h = torch.mul((dt[:, t] * x[:, t])[..., None], B[:, t, None, :], out=state_buffer[:, :n])  # B̄x
        steps, decays = all_steps[:n], all_decays[:n]
        steps[0].addcmul_(decays[0], state)
        for previous, current, a in zip(steps, steps[1:], decays[1:]):
            current.addcmul_(a, previous)
        torch.matmul(h, C[:, t, :, None], out=y[:, t, :, None])  # [b, n, d_in, 1]
        state.copy_(steps[-1])  # out of the buffer the next chunk overwrites
    return y, state


def project_out(w: MixerWeights, y: torch.Tensor, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The scan's C · s [..., d_in] plus the skip D x, gated by silu(z), through out_proj (in its weight's dtype)
    -> [..., d]."""
    return w.out_proj((torch.addcmul(y, w.D, x) * F.silu(z)).to(w.dtype))


# --- one step from a state --------------------------------------------------------------------------------------
def _step(w: MixerWeights, hidden: torch.Tensor, window: torch.Tensor, s: torch.Tensor, conv: Callable,
          scan: Callable) -> torch.Tensor:
    x, z = project_in(w, hidden)  # [B, d_in] each
    x = conv(w, window, x)  # window shifted in place
    return project_out(w, scan(s, x, *ssm_parameters(w, x)), x, z)  # s updated in place


def mixer_step_ref(w: MixerWeights, hidden: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor) -> torch.Tensor:
    """One recurrent step; hidden [B, d] -> [B, d]; conv [B, d_in, K] and ssm [B, d_in, N] updated in place."""
    return _step(w, hidden, conv, ssm, conv_step, scan_step)


def _conv_step_kernel(w: MixerWeights, window: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return _conv_update_kernel(x, window, w.conv, w.conv_bias, "silu")


def mixer_step_kernel(w: MixerWeights, hidden: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor) -> torch.Tensor:
    """`mixer_step_ref` with the conv and scan steps of causal_conv1d's and mamba_ssm's fused CUDA kernels."""
    return _step(w, hidden, conv, ssm, _conv_step_kernel, _ssm_update_kernel)


# --- a whole sequence from a zero state, or from a given one ----------------------------------------------------
def mixer_sequence(mixer, hidden: torch.Tensor, scan: Scan = scan_sequence,
                   state: tuple[torch.Tensor, torch.Tensor] | None = None,
                   ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """hidden [b, l, d] -> (out [b, l, d], (conv [b, d_in, K], ssm [b, d_in, N]) states after the last token), from
    zero states or (with `scan_sequence`) from `state`, the (conv, ssm) states before the first token."""
    w = mixer_weights(mixer)
    x, z = project_in(w, hidden)  # [b, l, d_in] each
    x, window = conv_sequence(w, x, None if state is None else state[0])
    dt, A, B, C = ssm_parameters(w, x)
    y, s = scan(x, dt, A, B, C) if state is None else scan(x, dt, A, B, C, state[1])
    return project_out(w, y, x, z), (window, s)


def mixer_forward(mixer, hidden: torch.Tensor) -> torch.Tensor:
    """`mixer_sequence` through the trainable `selective_scan`: [b, l, d] -> [b, l, d] (training path)."""
    return mixer_sequence(mixer, hidden, selective_scan)[0]


def blocks_forward(blocks, hidden: torch.Tensor) -> torch.Tensor:
    """[b, l, d] through Mamba blocks (each: norm, mixer, residual) on the trainable path -> [b, l, d]."""
    for block in blocks:
        hidden = hidden + mixer_forward(block.mixer, block.norm(hidden))
    return hidden


class SelectiveScan(torch.autograd.Function):
    """Mamba's selective scan with its own backward, one time step at a time on [b, d_in, n] blocks.

    h_t = exp(Δ_t A) h_{t-1} + (Δ_t x_t) B_t,  y_t = h_t C_t,  from h_{-1} = 0. Inputs time-major: Δ, x
    [l, b, d_in], A [d_in, n], B, C [l, b, n] -> (y [l, b, d_in], h_{l-1} [b, d_in, n], not differentiable).
    Each step's Ā_t is made and used while its block is in cache, never stored for all l at once (a
    [l, b, d_in, n] tensor); only the states h are kept for the backward, which runs in reverse time with
    g_t = dL/dh_t = C_t dy_t + Ā_{t+1} g_{t+1} and reads every other gradient off g_t: dB_t = Σ_d g_t u_t,
    du_t = g_t B_t (u = Δ x), dC_t = Σ_d h_t dy_t, and through Ā_t = exp(Δ_t A) with r_t = g_t h_{t-1} Ā_t:
    dΔ_t += Σ_n r_t A, dA += Σ_b r_t Δ_t.
    """

    @staticmethod
    def forward(ctx, dt: torch.Tensor, x: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                C: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        length = len(dt)
        u = dt * x  # [l, b, d]
        h = torch.empty(*u.shape, A.shape[1], dtype=u.dtype, device=u.device)  # [l, b, d, n]
        y = torch.empty_like(u)
        for t in range(length):
            a = torch.mul(dt[t, :, :, None], A).exp_()  # Ā_t [b, d, n]
            if t:
                torch.mul(a, h[t - 1], out=h[t])
                h[t].addcmul_(u[t, :, :, None], B[t, :, None, :])
            else:
                torch.mul(u[0, :, :, None], B[0, :, None, :], out=h[0])
            torch.bmm(h[t], C[t, :, :, None], out=y[t, :, :, None])
        ctx.save_for_backward(dt, x, A, B, C, u, h)
        last = h[-1].clone()
        ctx.mark_non_differentiable(last)
        return y, last

    @staticmethod
    def backward(ctx, dy: torch.Tensor, _: torch.Tensor) -> tuple[torch.Tensor, ...]:
        dt, x, A, B, C, u, h = ctx.saved_tensors
        dy = dy.contiguous()
        du, d_dt = torch.empty_like(u), torch.zeros_like(u)
        dB, dC = torch.empty_like(B), torch.empty_like(C)
        r_dt = torch.zeros_like(h[0])  # Σ_t r_t Δ_t [b, d, n], summed over b into dA at the end
        g = a_next = None
        for t in range(len(dt) - 1, -1, -1):
            g_t = torch.mul(dy[t, :, :, None], C[t, :, None, :])  # [b, d, n]
            if g is not None:
                g_t.addcmul_(a_next, g)
            torch.bmm(dy[t, :, None, :], h[t], out=dC[t, :, None, :])
            torch.bmm(g_t, B[t, :, :, None], out=du[t, :, :, None])
            torch.bmm(u[t, :, None, :], g_t, out=dB[t, :, None, :])
            a = torch.mul(dt[t, :, :, None], A).exp_()
            if t:
                r = (g_t * a).mul_(h[t - 1])  # dL/d(Δ_t A)
                r_dt.addcmul_(r, dt[t, :, :, None])
                torch.sum(r.mul_(A), -1, out=d_dt[t])
            g, a_next = g_t, a
        d_dt.addcmul_(du, x)
        return d_dt, du * dt, r_dt.sum(0), dB, dC


def selective_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`scan_sequence` through `SelectiveScan` (on time-major copies), differentiable in every input.

    x, Δ: [b, l, d_in]; A: [d_in, n]; B, C: [b, l, n] -> (y [b, l, d_in], the last state [b, d_in, n]).
    """
    y, last = SelectiveScan.apply(*(t.transpose(0, 1).contiguous() for t in (dt, x)), A,
                                  *(t.transpose(0, 1).contiguous() for t in (B, C)))  # y [l, b, d_in]
    return y.transpose(0, 1), last
