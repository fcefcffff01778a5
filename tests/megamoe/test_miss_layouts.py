"""The miss path's local experts on the layouts no lent machine runs (issue 26): ModelOpt NVFP4 on the kept TRTLLM
layout (SM100) and block-FP8 on SM100 (MegaMoE does not read it: the checkpoint layout), each through SGLang's own
runner for that layout, against a reference runner, on a CPU.

Expert parallelism is emulated in one process: the layer is built as each rank of ep = 2 (its own local experts),
`miss_hooks.run_local_experts` runs it on the same gathered rows with global ids, and the two partial sums -- what
the miss path's reduce-scatter adds -- equal the reference on all experts (the collectives themselves are proven
over gloo in test_miss_collectives.py / test_miss_path.py).

Real: SGLang's FusedMoE with ModelOptNvFp4FusedMoEMethod (create_weights, loaders, the plugin's kept-TRTLLM
processing through SGLang's own TRTLLM preparation) or Fp8MoEMethod, the dispatcher, the MoeRunner SGLang builds for
the layout (FLASHINFER_TRTLLM's fused entry `fused_experts_none_to_flashinfer_trtllm_fp4`; TRITON), the plugin's
miss_hooks. Fake, at the CUDA boundary: FlashInfer's permutations (fp4_harness.FakeFlashInfer), FlashInfer's
`trtllm_fp4_block_scale_routed_moe` kernel and `fp4_quantize` (a reference computing the MoE from the checkpoint's
fp32 experts for the rank's expert range it is handed; the activation passes through unquantised), the Triton
kernel (reference_runner), the platform (SM100). FP4 and FP8 kernel numerics on SM100 are FlashInfer's and
Triton's, not run here: no lent machine has an SM100 GPU.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

import fp4_harness as H
import reference_runner
from sglang_glm_ext.megamoe import miss_hooks, sm90_fp8

HID, INTER, E = 256, 256, 4


@pytest.fixture(scope="module", autouse=True)
def plugin():
    import sglang_glm_ext

    sglang_glm_ext.register()


def routing(n=6, seed=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, HID, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:2] for _ in range(n)]).to(torch.int32)
    return x, ids, torch.rand(n, 2, generator=g)


def ref_moe(x, ids, w, experts_fp32, experts=range(E)):
    out = torch.zeros(x.shape[0], HID)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            if e in experts:
                w1, w3, w2 = experts_fp32(e)
                out[t] += float(w[t, k]) * (w2 @ (torch.nn.functional.silu(w1 @ x[t].float()) * (w3 @ x[t].float())))
    return out


# ---------------------------------------------------------------- NVFP4 on the kept TRTLLM layout

class FakeTrtllmKernel:
    """flashinfer.fused_moe.trtllm_fp4_block_scale_routed_moe: the MoE of the routed (ids, weights) over the
    experts [local_expert_offset, + local_num_experts), from the checkpoint's fp32 experts; records its inputs."""

    def __init__(self, ck):
        self.ck, self.calls, self.activations = ck, [], []

    def quantize(self, hs, scale, *args):
        """fp4_quantize stand-in: (packed uint8 [T, H/2], e4m3 scales [T, H/16]) of the right shapes; the rows
        themselves pass to the kernel unquantised through `activations` (FP4 activation numerics: SM100)."""
        self.activations.append(hs)
        return (torch.zeros(hs.shape[0], hs.shape[1] // 2, dtype=torch.uint8),
                torch.zeros(hs.shape[0], hs.shape[1] // 16, dtype=torch.uint8))

    def routed(self, **kw):
        ids, weights = kw["topk_ids"]
        self.calls.append(kw)
        x = self.activations[-1]
        assert kw["hidden_states"].shape == (x.shape[0], x.shape[1] // 2) and kw["hidden_states"].dtype == torch.uint8
        lo, n = kw["local_expert_offset"], kw["local_num_experts"]
        out = ref_moe(x, ids, weights,
                      lambda e: (self.ck.floats[(e, "w1")], self.ck.floats[(e, "w3")], self.ck.floats[(e, "w2")]),
                      experts=range(lo, lo + n))
        kw["output"].copy_(out.to(kw["output"].dtype))
        return [kw["output"]]


def nvfp4_rank(ck, ep_rank, monkeypatch):
    with H.sglang_runtime(quantization="modelopt_fp4", a2a="megamoe", runner="auto", ep_size=2, ep_rank=ep_rank):
        layer = H.build_nvfp4_layer(ck)
        H.load_nvfp4(layer, ck)
        layer.quant_method.process_weights_after_loading(layer)
        assert layer._mega_moe_trtllm_layout and layer.quant_method.runner is None  # 0.5.23 builds none
        assert miss_hooks.prepare_fallback(layer) == "nvfp4_trtllm"
        assert layer.quant_method.runner is not None and layer.quant_method.runner.runner_backend.is_flashinfer_trtllm()
    return layer


def test_nvfp4_trtllm_miss_through_sglangs_trtllm_runner(monkeypatch):
    import sglang.srt.layers.moe.moe_runner.flashinfer_trtllm as fit

    ck = H.Checkpoint.random(E, HID, INTER, seed=5)
    fi = H.FakeFlashInfer()
    kernel = FakeTrtllmKernel(ck)
    x, ids, w = routing()
    parts = []
    with fi.installed():
        layers = [nvfp4_rank(ck, r, monkeypatch) for r in (0, 1)]
        # On the fake flashinfer's own module: a sys.modules entry monkeypatch put back after fi.installed() has
        # removed it would leave the fake behind for every later test.
        fused_moe = sys.modules["flashinfer.fused_moe"]
        monkeypatch.setattr(fused_moe, "trtllm_fp4_block_scale_routed_moe", kernel.routed, raising=False)
        monkeypatch.setattr(fused_moe, "trtllm_fp4_block_scale_moe",
                            lambda **kw: pytest.fail("the logits (bypassed) kernel ran"), raising=False)
        monkeypatch.setattr(fit, "fp4_quantize", kernel.quantize)
        monkeypatch.setattr(fit, "trtllm_moe_enable_pdl", lambda n: False)
        monkeypatch.setattr(fit, "get_activation_type", lambda act, is_gated=True: f"{act}/gated={is_gated}")
        for r, layer in enumerate(layers):
            with H.sglang_runtime(quantization="modelopt_fp4", a2a="megamoe", runner="auto", ep_size=2, ep_rank=r):
                from sglang.srt.runtime_context import get_parallel

                get_parallel().override_permanently(tp_group=SimpleNamespace(world_size=2))  # read, not used
                flag = layer._mega_moe_nvfp4
                parts.append(miss_hooks.run_local_experts(layer, x, ids, w, "nvfp4_trtllm").float())
                assert layer._mega_moe_nvfp4 == flag  # apply's refusal is back after the call
            call = kernel.calls[-1]
            assert call["local_expert_offset"] == r * 2 and call["local_num_experts"] == 2
            assert call["num_experts"] == E and torch.equal(call["topk_ids"][0], ids)  # global ids, routed form
            # SGLang's runner reads the layer's kept TRTLLM tensors, the storage MegaMoE views too
            assert call["gemm1_weights"].data_ptr() == layer.w13_weight.data_ptr()
            assert call["gemm2_weights"].data_ptr() == layer.w2_weight.data_ptr()
            assert call["gemm1_weights_scale"].data_ptr() == layer.w13_weight_scale.data_ptr()
            assert call["routed_scaling_factor"] is None  # the block applies it (GLM's rule), as a2a=none does
    ref = ref_moe(x, ids, w, lambda e: (ck.floats[(e, "w1")], ck.floats[(e, "w3")], ck.floats[(e, "w2")]))
    for r, part in enumerate(parts):  # each rank's partial: its own experts only
        mine = ref_moe(x, ids, w, lambda e: (ck.floats[(e, "w1")], ck.floats[(e, "w3")], ck.floats[(e, "w2")]),
                       experts=range(2 * r, 2 * r + 2))
        assert float((part - mine).norm() / mine.norm()) < 1e-2
    total = parts[0] + parts[1]  # what the reduce-scatter sums
    assert float((total - ref).norm() / ref.norm()) < 1e-2


def test_nvfp4_layout_without_the_kept_trtllm_has_no_fallback(monkeypatch):
    monkeypatch.setenv("SGLANG_GLM_EXT_MEGAMOE_FP4_KEEP_TRTLLM", "0")
    ck = H.Checkpoint.random(2, 512, 512)
    with H.sglang_runtime(quantization="modelopt_fp4", a2a="megamoe", runner="auto"):
        layer = H.build_nvfp4_layer(ck)
        H.load_nvfp4(layer, ck)
        layer.quant_method.process_weights_after_loading(layer)
    assert layer._mega_moe_weights_built and not layer._mega_moe_trtllm_layout
    assert miss_hooks.prepare_fallback(layer) is None


# ---------------------------------------------------------------- block-FP8 on SM100 (not read by MegaMoE)

def fp8_rank(ep_rank, w13, s13, w2, s2, monkeypatch):
    import sglang.srt.layers.quantization.fp8 as fp8
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.quantization.fp8 import Fp8Config

    monkeypatch.setattr(fp8, "_is_cpu", False)
    with H.sglang_runtime(quantization="fp8", a2a="megamoe", runner="auto", ep_size=2, ep_rank=ep_rank):
        layer = FusedMoE(num_experts=E, hidden_size=HID, intermediate_size=INTER, layer_id=3, top_k=2,
                         params_dtype=torch.bfloat16, prefix="model.layers.3.mlp.experts",
                         quant_config=Fp8Config(is_checkpoint_fp8_serialized=True, weight_block_size=[128, 128]))
        for e in range(E):
            for shard in ("w1", "w3", "w2"):
                if shard == "w2":
                    wt, sc, p, ps = w2[e], s2[e], layer.w2_weight, layer.w2_weight_scale_inv
                else:
                    half = slice(0, INTER) if shard == "w1" else slice(INTER, 2 * INTER)
                    shalf = slice(0, INTER // 128) if shard == "w1" else slice(INTER // 128, 2 * INTER // 128)
                    wt, sc, p, ps = w13[e][half], s13[e][shalf], layer.w13_weight, layer.w13_weight_scale_inv
                p.weight_loader(p, wt.clone(), f"x.{e}.{shard}.weight", shard_id=shard, expert_id=e)
                ps.weight_loader(ps, sc.clone(), f"x.{e}.{shard}.weight_scale_inv", shard_id=shard, expert_id=e)
        monkeypatch.setattr(fp8, "requant_block_scale_ue8m0_for_deepgemm", lambda *a, **k: None)  # CUDA op
        layer.quant_method.process_weights_after_loading(layer)  # SM100: no SM90 builder, checkpoint layout kept
        assert not layer._mega_moe_weights_built and not sm90_fp8.layer_is_interleaved(layer)
        assert miss_hooks.prepare_fallback(layer) == "stock"
    return layer


def test_fp8_on_sm100_miss_through_sglangs_fp8_runner(monkeypatch):
    g = torch.Generator().manual_seed(11)
    w13 = (torch.randn(E, 2 * INTER, HID, generator=g) * 0.05).to(torch.float8_e4m3fn)
    w2 = (torch.randn(E, HID, INTER, generator=g) * 0.05).to(torch.float8_e4m3fn)
    s13 = torch.rand(E, 2 * INTER // 128, HID // 128, generator=g) + 0.5
    s2 = torch.rand(E, HID // 128, INTER // 128, generator=g) + 0.5
    x, ids, w = routing(seed=4)
    parts = []
    import sglang.srt.layers.moe.token_dispatcher.standard as standard

    monkeypatch.setattr(standard, "get_device", lambda *a, **k: "cpu")
    for r in (0, 1):
        layer = fp8_rank(r, w13, s13, w2, s2, monkeypatch)
        reference_runner.install(layer, monkeypatch)
        with H.sglang_runtime(quantization="fp8", a2a="megamoe", runner="auto", ep_size=2, ep_rank=r):
            from sglang.srt.runtime_context import get_parallel

            get_parallel().override_permanently(tp_group=SimpleNamespace(world_size=2))  # read, not used
            parts.append(miss_hooks.run_local_experts(layer, x, ids, w, "stock").float())
        (call,) = reference_runner.CALLS
        assert call["rows"] == x.shape[0]
        assert set(call["ids"].flatten().tolist()) <= {-1, 0, 1}  # the dispatcher mapped other ranks' experts out
    ref = sm90_fp8.reference_moe(x.float(), ids, w, w13, s13, w2, s2, routed_scaling_factor=1.0,
                                 w13_interleaved=False)
    total = parts[0] + parts[1]
    assert float((total - ref).norm() / ref.norm()) < 1e-2
