"""CPU harness for the FP4 MegaMoE tests: real SGLang layers, fakes only where CUDA starts.

Real: SGLang 0.5.23's FusedMoE with its ModelOpt NVFP4 / MXFP4 quant methods (create_weights, the loaders,
process_weights_after_loading, the TRTLLM alignment code in flashinfer_trtllm.py and quantization/utils.py),
the plugin's hooks as register() installs them, deep_gemm 0.2.3.post2's torch transforms.
Fake (`FakeFlashInfer`): the three FlashInfer functions SGLang's `prepare_static_weights_for_trtllm_fp4_moe`
imports (w3/w1 and w2 row permutations, `nvfp4_block_scale_interleave`, a CUDA kernel): deterministic bijections
of the same shapes, with known inverses, so a test can undo "the TRTLLM shuffle" and compare with the checkpoint.
They are not FlashInfer's permutations; what depends on the real ones is in tests/megamoe/test_fp4_gpu.py.

Plain-torch quantizers (`quantize_nvfp4`, `quantize_mxfp4`) build checkpoints: SGLang's own NVFP4 quantizer
needs flashinfer.
"""

from __future__ import annotations

import contextlib
import sys
import types
from dataclasses import dataclass, field
from typing import Iterator, Optional

import torch

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


# ---------------------------------------------------------------- quantizers

def _e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 code (sign in bit 3) for each element, saturating at 6."""
    mag = x.abs().clamp(max=6.0)
    idx = (mag.unsqueeze(-1) - E2M1).abs().argmin(dim=-1).to(torch.uint8)
    return idx | ((x < 0) & (idx != 0)).to(torch.uint8) << 3


def _pack(codes: torch.Tensor) -> torch.Tensor:
    # Even element in the low nibble (SGLang's dequantize_nvfp4 default, ModelOpt's layout).
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def quantize_nvfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ModelOpt NVFP4 of a [rows, K] weight: (packed uint8 [rows, K/2], e4m3 block scales [rows, K/16],
    fp32 global decode scale). Dequant = e2m1 * block_scale * global, as SGLang's dequantize_nvfp4 computes."""
    w = w.float()
    s2 = (w.abs().amax() / (6.0 * 448.0)).clamp(min=1e-12)
    blocks = w.reshape(w.shape[0], -1, 16)
    bs = (blocks.abs().amax(-1) / 6.0 / s2).clamp(min=2.0 ** -9).to(torch.float8_e4m3fn)
    codes = _e2m1_codes(blocks / (bs.float() * s2).unsqueeze(-1)).reshape(w.shape)
    return _pack(codes), bs, s2


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """OCP MXFP4 of a [rows, K] weight: (packed uint8 [rows, K/2], ue8m0 exponent bytes [rows, K/32])."""
    w = w.float()
    blocks = w.reshape(w.shape[0], -1, 32)
    amax = blocks.abs().amax(-1).clamp(min=2.0 ** -100)
    exp = torch.floor(torch.log2(amax)) - 2  # e2m1's largest exponent is 2
    codes = _e2m1_codes(blocks / torch.exp2(exp).unsqueeze(-1)).reshape(w.shape)
    return _pack(codes), (exp + 127).to(torch.uint8)


# ---------------------------------------------------------------- deep_gemm's MegaMoE layout, undone

def invert_megamoe_nvfp4(l1, l2):
    """Undo deep_gemm's nvfp4xnvfp4 MegaMoE layout: (interleaved int8 w13, UTCCP int32 sf) -> canonical."""
    def un_interleave(t):  # inverse of deep_gemm.mega._interleave_weights_packed_fp4
        g, n, *rest = t.shape
        q = t.reshape(g, n // 32, 4, 8, *rest)
        gate = torch.stack([q[:, :, 0], q[:, :, 2]], dim=3).reshape(g, n // 2, *rest)
        up = torch.stack([q[:, :, 1], q[:, :, 3]], dim=3).reshape(g, n // 2, *rest)
        return torch.cat([gate, up], dim=1)

    def un_utccp(sf):  # inverse of deep_gemm.mega._transpose_sf_for_utccp
        g, mn, k = sf.shape
        return sf.reshape(g, -1, 32, 4, k).transpose(2, 3).reshape(g, mn, k)

    def unpack(sf):  # inverse of transform_ue4m3_sf_into_required_layout: int32 words -> e4m3 bytes, K-major
        return sf.contiguous().view(torch.uint8).view(torch.float8_e4m3fn)

    return ((un_interleave(l1[0]).view(torch.uint8), unpack(un_interleave(un_utccp(l1[1])))),
            (l2[0].view(torch.uint8), unpack(un_utccp(l2[1]))))


# ---------------------------------------------------------------- fake FlashInfer

def _row_perm(n: int, gated: bool) -> torch.Tensor:
    idx = torch.arange(n)
    if gated:  # interleave the [up; gate] halves in 8-row chunks, like a gated-activation reorder
        half = n // 2
        idx = torch.stack([idx[:half].view(-1, 8), idx[half:].view(-1, 8)], 1).reshape(-1)
    return idx.view(-1, 8, 16).flip(1).reshape(-1)  # and a tile shuffle: reverse 16-row groups per 128 rows


class FakeFlashInfer:
    """Stands in for `flashinfer` / `flashinfer.fused_moe.core` inside SGLang's TRTLLM FP4 preparation."""

    @staticmethod
    def w3_w1_permute_indices(cache, w, epilogue_tile_m, num_elts_per_sf=None, is_gated_act_gemm=True):
        return _row_perm(w.shape[0], is_gated_act_gemm)

    @staticmethod
    def w2_permute_indices(cache, w, epilogue_tile_m, num_elts_per_sf=None):
        return _row_perm(w.shape[0], False)

    @staticmethod
    def block_scale_interleave(sf: torch.Tensor) -> torch.Tensor:
        r, c = sf.shape
        return sf.reshape(r // 128, 4, 32, c // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1).contiguous()

    # inverses (test side only)
    @staticmethod
    def unshuffle_rows(t: torch.Tensor, gated: bool) -> torch.Tensor:
        """Undo the row permutation on dim -2 of [E, rows, cols]."""
        perm = _row_perm(t.shape[-2], gated)
        out = torch.empty_like(t)
        out[..., perm, :] = t
        return out

    @staticmethod
    def unshuffle_scales(t: torch.Tensor, gated: bool) -> torch.Tensor:
        """Undo interleave then row permutation of an [E, rows, cols] scale tensor (any 1-byte dtype)."""
        e, r, c = t.shape
        raw = t.view(torch.uint8).reshape(e, r // 128, c // 4, 32, 4, 4).permute(0, 1, 4, 3, 2, 5).reshape(e, r, c)
        return FakeFlashInfer.unshuffle_rows(raw, gated).view(t.dtype)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        import sglang.srt.layers.quantization.modelopt_quant as mq

        fi = types.ModuleType("flashinfer")
        fi.nvfp4_block_scale_interleave = self.block_scale_interleave
        fm = types.ModuleType("flashinfer.fused_moe")
        core = types.ModuleType("flashinfer.fused_moe.core")
        core._maybe_get_cached_w3_w1_permute_indices = self.w3_w1_permute_indices
        core.get_w2_permute_indices_with_cache = self.w2_permute_indices
        fi.fused_moe, fm.core = fm, core
        saved_mods = {k: sys.modules.get(k) for k in ("flashinfer", "flashinfer.fused_moe", "flashinfer.fused_moe.core")}
        saved = (mq.reorder_rows_for_gated_act_gemm, mq.shuffle_matrix_sf_a)

        def not_called(*a, **k):
            raise AssertionError("modelopt_quant only checks these flashinfer imports for None")

        sys.modules.update({"flashinfer": fi, "flashinfer.fused_moe": fm, "flashinfer.fused_moe.core": core})
        mq.reorder_rows_for_gated_act_gemm = mq.shuffle_matrix_sf_a = not_called
        try:
            yield
        finally:
            mq.reorder_rows_for_gated_act_gemm, mq.shuffle_matrix_sf_a = saved
            for k, v in saved_mods.items():
                if v is None:
                    sys.modules.pop(k, None)
                else:
                    sys.modules[k] = v


# ---------------------------------------------------------------- SGLang runtime + layers

@contextlib.contextmanager
def sglang_runtime(*, quantization: str, a2a: str, runner: str, ep_size: int = 1, ep_rank: int = 0,
                   sm100: Optional[bool] = True, device: str = "cpu") -> Iterator[None]:
    """Published server args, parallel ranks, MoE flags and platform facts for building one layer; reset after.
    `sm100=None` leaves the platform facts to the real GPU."""
    from sglang.srt.layers.moe.utils import MoeA2ABackend, MoeRunnerBackend
    from sglang.srt.runtime_context import get_context, get_flags, get_parallel, override_platform, reset_context
    from sglang.srt.server_args import ServerArgs

    reset_context()
    try:
        get_context().set_server_args(ServerArgs(model_path="dummy", quantization=quantization,
                                                 moe_a2a_backend=a2a, tp_size=ep_size, device=device))
        get_parallel().override_permanently(moe_ep_size=ep_size, moe_ep_rank=ep_rank, moe_tp_size=1,
                                            moe_tp_rank=0)
        get_flags().moe.a2a_backend = MoeA2ABackend(a2a)
        get_flags().moe.runner_backend = MoeRunnerBackend(runner)
        with (override_platform(is_blackwell=sm100, is_sm100=sm100) if sm100 is not None
              else contextlib.nullcontext()):
            yield
    finally:
        reset_context()


@dataclass
class Checkpoint:
    """Random GLM-shaped MoE experts, quantized, keyed like a checkpoint: (global expert, shard, kind)."""

    num_experts: int
    hidden: int
    intermediate: int
    recipe: str  # "nvfp4" | "mxfp4"
    tensors: dict = field(default_factory=dict)
    floats: dict = field(default_factory=dict)

    @classmethod
    def random(cls, num_experts: int, hidden: int, intermediate: int, recipe: str = "nvfp4", seed: int = 0,
               untied_gate_up: bool = True) -> "Checkpoint":
        g = torch.Generator().manual_seed(seed)
        ck = cls(num_experts, hidden, intermediate, recipe)
        for e in range(num_experts):
            for shard, (rows, k) in {"w1": (intermediate, hidden), "w3": (intermediate, hidden),
                                     "w2": (hidden, intermediate)}.items():
                scale = 1.0 + (e + 1) * (0.5 if (shard == "w3" and untied_gate_up) else 0.25)
                w = torch.randn(rows, k, generator=g) * scale
                ck.floats[(e, shard)] = w
                if recipe == "nvfp4":
                    q, bs, s2 = quantize_nvfp4(w)
                    ck.tensors[(e, shard, "weight")] = q
                    ck.tensors[(e, shard, "weight_scale")] = bs
                    ck.tensors[(e, shard, "weight_scale_2")] = s2
                    # Distinct per expert, so a wrong EP slice shows.
                    ck.tensors[(e, shard, "input_scale")] = torch.tensor(0.01 * (e + 1) + (0.001 if shard == "w3" else 0.0))
                else:
                    q, sf = quantize_mxfp4(w)
                    ck.tensors[(e, shard, "weight")] = q
                    ck.tensors[(e, shard, "weight_scale")] = sf
        return ck

    def local_experts(self, ep_size: int, ep_rank: int) -> list[int]:
        n = self.num_experts // ep_size
        return list(range(ep_rank * n, (ep_rank + 1) * n))


def build_nvfp4_layer(ck: Checkpoint, *, group_size: int = 16, swiglu_limit: Optional[float] = None,
                      prefix: str = "model.layers.3.mlp.experts"):
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config

    cfg = ModelOptFp4Config(is_checkpoint_nvfp4_serialized=True, group_size=group_size, exclude_modules=[])
    return FusedMoE(num_experts=ck.num_experts, hidden_size=ck.hidden, intermediate_size=ck.intermediate,
                    layer_id=3, top_k=2, params_dtype=torch.bfloat16, quant_config=cfg, prefix=prefix,
                    swiglu_limit=swiglu_limit)


def build_mxfp4_layer(ck: Checkpoint, prefix: str = "model.layers.3.mlp.experts"):
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4Config

    return FusedMoE(num_experts=ck.num_experts, hidden_size=ck.hidden, intermediate_size=ck.intermediate,
                    layer_id=3, top_k=2, params_dtype=torch.bfloat16,
                    quant_config=Mxfp4Config(is_checkpoint_mxfp4_serialized=True), prefix=prefix)


def load_nvfp4(layer, ck: Checkpoint, override: Optional[dict] = None) -> None:
    """Feed every checkpoint tensor through the parameter's own weight_loader, as GLM's load_weights does."""
    override = override or {}
    for (e, shard, kind), t in ck.tensors.items():
        t = override.get((e, shard, kind), t)
        param = getattr(layer, ("w2_" if shard == "w2" else "w13_") + kind)
        param.weight_loader(param, t.clone(), f"model.layers.3.mlp.experts.{e}.{shard}.{kind}",
                            shard_id=shard, expert_id=e)


def load_mxfp4_fused(layer, ck: Checkpoint, local: list[int], override: Optional[dict] = None) -> None:
    """MXFP4 checkpoints (GPT-OSS style) carry all experts of a layer in one tensor: [E, 2I, ...] with
    [gate; up] and [E, H, ...]; SGLang loads them with expert_id=None."""
    override = override or {}
    for kind in ("weight", "weight_scale"):
        w13 = torch.stack([torch.cat([ck.tensors[(e, "w1", kind)], ck.tensors[(e, "w3", kind)]]) for e in local])
        w2 = torch.stack([ck.tensors[(e, "w2", kind)] for e in local])
        for pname, t in ((f"w13_{kind}", w13), (f"w2_{kind}", w2)):
            t = override.get(pname, t)
            param = getattr(layer, pname)
            param.weight_loader(param, t, f"model.layers.3.mlp.experts.{pname}", shard_id=None, expert_id=None)


def param_bytes(layer) -> int:
    """Distinct storage bytes behind every parameter and every MegaMoE tensor the layer holds."""
    from sglang_glm_ext.megamoe.fp4_layout import distinct_bytes

    tensors = [p.data for p in layer.parameters()]
    for attr in ("mega_l1_weights", "mega_l2_weights"):
        tensors.extend(getattr(layer, attr, ()) or ())
    return distinct_bytes(tensors)


def fmt(n: float) -> str:
    from sglang_glm_ext.megamoe.fp4_layout import fmt_bytes

    return ("-" if n < 0 else "") + fmt_bytes(int(abs(n)))
