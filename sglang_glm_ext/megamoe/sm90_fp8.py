"""The SM90 block-FP8 MegaMoE weight layout and what the kernel computes, in plain torch; no SGLang import.

SGLang 0.5.23's `build_sm90_mega_moe_experts_weights` (layers/moe/mega_moe_sm90.py:97-149) interleaves every
block-FP8 FusedMoE's `w13_weight` in place, gate and up rows alternating in runs of 8, and leaves the 128x128
block scales in the checkpoint's [gate; up] row order. After that, SGLang's stock runner would read interleaved
rows as [gate; up] and compute a wrong activation, so such a layer must only ever run the MegaMoE kernel
(`layer_is_interleaved` is how the hooks recognise one).

`interleave_gate_up` is pinned equal to SGLang's `_interleave_l1_weight_only` by tests/megamoe/test_sm90_fp8.py.
`reference_moe` is the dequantised torch model of `deep_gemm.fp8_mega_moe` on one rank (recipe 128x128x128,
swiglu): the CPU tests' oracle and the GPU check's CPU side.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

GRAN = 8  # DeepGEMM's SM90 L1 gate/up interleave granularity (rows)
BLOCK = 128  # block-FP8 weight scale block, and the activation quantisation group


def interleave_gate_up(w13: torch.Tensor, gran: int = GRAN) -> torch.Tensor:
    """[E, 2I, ...] in [gate; up] row order -> runs of `gran` gate rows and `gran` up rows alternating."""
    num_groups, n, *rest = w13.shape
    if n % (2 * gran):
        raise ValueError(f"w13 has {n} rows; the interleave needs a multiple of {2 * gran}")
    half = n // 2
    gate = w13[:, :half].reshape(num_groups, half // gran, gran, *rest)
    up = w13[:, half:].reshape(num_groups, half // gran, gran, *rest)
    return torch.stack([gate, up], dim=2).reshape(num_groups, n, *rest)


def deinterleave_gate_up(w13: torch.Tensor, gran: int = GRAN) -> torch.Tensor:
    """Inverse of interleave_gate_up: back to [gate; up]."""
    num_groups, n, *rest = w13.shape
    if n % (2 * gran):
        raise ValueError(f"w13 has {n} rows; the interleave needs a multiple of {2 * gran}")
    pairs = w13.reshape(num_groups, n // (2 * gran), 2, gran, *rest)
    return torch.cat([pairs[:, :, 0].reshape(num_groups, n // 2, *rest),
                      pairs[:, :, 1].reshape(num_groups, n // 2, *rest)], dim=1)


def interleave_rows(n: int, gran: int = GRAN) -> torch.Tensor:
    """The row permutation of interleave_gate_up: interleaved[i] = plain[perm[i]] (int64, CPU)."""
    if n % (2 * gran):
        raise ValueError(f"w13 has {n} rows; the interleave needs a multiple of {2 * gran}")
    return interleave_gate_up(torch.arange(n).view(1, n))[0]


_PERMS: dict = {}


def _perm(n: int, device: torch.device, inverse: bool) -> torch.Tensor:
    key = (n, str(device), inverse)
    perm = _PERMS.get(key)
    if perm is None:
        fwd = interleave_rows(n)
        perm = torch.argsort(fwd) if inverse else fwd
        perm = _PERMS[key] = perm.to(device)
    return perm


def deinterleave_experts_(w13: torch.Tensor, experts: Optional[Any] = None) -> None:
    """In place: the given experts' (all when None) rows of an interleaved [E, 2I, H] w13 back to [gate; up], so
    a loader or SGLang's stock runner reads them where it expects them. Bytes move as uint8 (FP8 has no
    arithmetic), one row gather per expert: one expert's scratch."""
    _relayout_(w13, experts, inverse=True)


def interleave_experts_(w13: torch.Tensor, experts: Optional[Any] = None) -> None:
    """In place: the given experts' (all when None) [gate; up] rows of w13 to the kernel's interleave. The
    storage stays the same, so the MegaMoE weight tuples SGLang built (views of it) keep reading it."""
    _relayout_(w13, experts, inverse=False)


def _relayout_(w13: torch.Tensor, experts: Optional[Any], *, inverse: bool) -> None:
    raw = w13.view(torch.uint8) if w13.element_size() == 1 else w13
    perm = _perm(raw.shape[1], raw.device, inverse)
    for e in (range(raw.shape[0]) if experts is None else sorted({int(e) for e in experts})):
        raw[e].copy_(raw[e].index_select(0, perm))


def layer_is_interleaved(experts: Any) -> bool:
    """Whether SGLang's SM90 MegaMoE builder has rewritten this FusedMoE's w13 in place."""
    return bool(getattr(experts, "_mega_moe_sm90_fp8_weights", False))


def dequant_block_fp8(weight: torch.Tensor, scale: torch.Tensor,
                      block: tuple[int, int] = (BLOCK, BLOCK)) -> torch.Tensor:
    """[..., N, K] FP8 with [..., ceil(N/bn), K/bk] fp32 scales -> fp32."""
    bn, bk = block
    n, k = weight.shape[-2:]
    s = scale.float().repeat_interleave(bn, dim=-2)[..., :n, :].repeat_interleave(bk, dim=-1)[..., :k]
    return weight.float() * s


def quantize_fp8_groups(x: torch.Tensor, group: int = BLOCK) -> torch.Tensor:
    """Round-trip x through e4m3 with one fp32 scale per `group` channels per row (what the kernel's activation
    quantisation loses), returned in fp32."""
    rows, cols = x.shape
    g = x.float().reshape(rows, cols // group, group)
    scale = (g.abs().amax(dim=-1, keepdim=True) / torch.finfo(torch.float8_e4m3fn).max).clamp(min=1e-12)
    return ((g / scale).to(torch.float8_e4m3fn).float() * scale).reshape(rows, cols)


def reference_moe(
    hidden_states: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    *,
    routed_scaling_factor: float = 1.0,
    w13_interleaved: bool = True,
    activation_clamp: Optional[float] = None,
    quantize_activations: bool = False,
    expert_offset: int = 0,
) -> torch.Tensor:
    """sum_k rsf * w[t,k] * down_e(silu(gate_e(x_t)) * up_e(x_t)) over the experts this rank holds, fp32.

    `w13` [E, 2I, H] FP8 (interleaved as SGLang's SM90 builder leaves it, or [gate; up]), `w13_scale`
    [E, 2I/128, H/128] in [gate; up] order either way, `w2` [E, H, I], `w2_scale` [E, H/128, I/128]. Ids
    outside [expert_offset, expert_offset + E) (other ranks' experts, -1 for dropped rows) contribute nothing.
    `quantize_activations` models the kernel's FP8 activations (per token, per 128 channels) for L1 and L2.
    """
    l1 = deinterleave_gate_up(w13) if w13_interleaved else w13
    w1 = dequant_block_fp8(l1, w13_scale)
    w2f = dequant_block_fp8(w2, w2_scale)
    num_local, two_i, _ = w1.shape
    inter = two_i // 2
    x = hidden_states.float()
    x = quantize_fp8_groups(x) if quantize_activations else x
    out = torch.zeros(x.shape[0], w2f.shape[1], dtype=torch.float32, device=x.device)
    ids = topk_ids.long() - expert_offset
    weights = topk_weights.float() * routed_scaling_factor
    for e in range(num_local):
        rows, cols = torch.nonzero(ids == e, as_tuple=True)
        if rows.numel() == 0:
            continue
        h = x[rows] @ w1[e].t()
        gate, up = h[:, :inter], h[:, inter:]
        if activation_clamp is not None:
            gate = gate.clamp(max=activation_clamp)
            up = up.clamp(min=-activation_clamp, max=activation_clamp)
        act = torch.nn.functional.silu(gate) * up
        act = quantize_fp8_groups(act) if quantize_activations else act
        out.index_add_(0, rows, (act @ w2f[e].t()) * weights[rows, cols].unsqueeze(-1))
    return out
