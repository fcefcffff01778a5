"""What the MegaMoE GPU scripts share (megamoe_h200.py at ep = 1, megamoe_ep.py at EP = N): torch and the plugin's
pure modules only, no SGLang (none on the GPU box). Importing it runs nothing."""

from __future__ import annotations

import torch


class Skip(Exception):
    """A check that cannot run here (no CUDA device, no deep_gemm, a previous check's state missing)."""


def rel(a, b) -> float:
    """Relative error ||a - b|| / ||b|| on the CPU in fp32; 0 for empty tensors."""
    b = b.float().cpu()
    if b.numel() == 0:
        return 0.0
    return float((a.float().cpu() - b).norm() / b.norm().clamp(min=1e-12))


def glm_layer(e=16, h=512, i=256, seed=0):
    """A block-FP8 GLM-shaped MoE layer from a seed: w13 [E, 2I, H] ([gate; up]), its scales, w2 [E, H, I], its scales."""
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(e, 2 * i, h, generator=g) * 0.05).to(torch.float8_e4m3fn)
    w2 = (torch.randn(e, h, i, generator=g) * 0.05).to(torch.float8_e4m3fn)
    s13 = torch.rand(e, 2 * i // 128, h // 128, generator=g) * 0.5 + 0.5
    s2 = torch.rand(e, h // 128, i // 128, generator=g) * 0.5 + 0.5
    return w13, s13, w2, s2


def deep_gemm_or_skip(dev: torch.device):
    """deep_gemm with the SM90 MegaMoE API, or Skip saying why not."""
    if dev.type != "cuda":
        raise Skip("not on a CUDA device")
    try:
        import deep_gemm
    except Exception as exc:
        raise Skip(f"deep_gemm does not import: {type(exc).__name__}: {exc}")
    need = ("get_symm_buffer_for_sm90_mega_moe", "mega_moe_pre_dispatch_sm90", "fp8_mega_moe")
    missing = [n for n in need if not hasattr(deep_gemm, n)]
    if missing:
        raise Skip(f"deep_gemm {getattr(deep_gemm, '__version__', '?')} lacks {missing}")
    return deep_gemm


def mega_kernel(dg, buf, l1, l2, xd, kr, kw):
    """One MegaMoE call exactly as SGLang 0.5.23's run_sm90_mega_routed makes it (layers/moe/mega_moe_sm90.py:56-84)."""
    dg.mega_moe_pre_dispatch_sm90(xd, kr.topk_ids, kr.topk_weights, buf.x, buf.x_sf, buf.topk_idx,
                                  buf.topk_weights, num_tokens=kw["num_tokens"], group_size=128,
                                  routed_scaling_factor=kw["routed_scaling_factor"])
    y = torch.empty((max(kw["num_tokens"], 1), kw["hidden_size"]), dtype=torch.bfloat16, device=xd.device)
    dg.fp8_mega_moe(y, l1, l2, buf, recipe=(128, 128, 128), activation=kw["activation"],
                    activation_clamp=kw["activation_clamp"], fast_math=True)
    return y[:kw["num_tokens"]]


def sglang_load_w13(self, param, loaded, name, shard_id, expert_id):
    """FusedMoE._load_w13 for a gated layer: w1 into rows [0, I), w3 into [I, 2I) of that (local) expert, in place."""
    rows = param.data.shape[1] // 2
    param.data[expert_id].narrow(0, 0 if shard_id == "w1" else rows, rows).copy_(loaded)
