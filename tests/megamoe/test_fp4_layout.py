"""fp4_layout, the pure core: scale-group checks, the MegaMoE shape rule, NVFP4 alphas, views, memory.

Real here: the core itself, SGLang 0.5.23's `check_mega_moe_shapes`, `_compute_gemm1_alphas`,
`_input_scale_to_local_experts` and `dequantize_nvfp4` (plain torch), deep_gemm 0.2.3.post2's
`transform_ue4m3_sf_into_required_layout` / `transform_weights_for_mega_moe` (plain torch). Nothing is faked.
"""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import fp4_harness as H  # noqa: E402

from sglang_glm_ext.megamoe import fp4_layout as core  # noqa: E402

E4M3 = torch.float8_e4m3fn


# ---------------------------------------------------------------- scale groups

def test_nvfp4_scale_group_k16_e4m3_passes_and_every_mismatch_names_layer_and_both_sizes():
    core.check_scale_group("L", "w13", (4, 512, 128), (4, 512, 16), E4M3, core.NVFP4)  # K=256 -> 16 groups
    with pytest.raises(core.ScaleGroupError) as exc:
        core.check_scale_group("model.layers.7.mlp.experts", "w13_weight_scale", (4, 512, 128), (4, 512, 8),
                               E4M3, core.NVFP4)
    msg = str(exc.value)
    assert "model.layers.7.mlp.experts" in msg and "w13_weight_scale" in msg
    assert "8 scale columns" in msg and "K/16 = 16" in msg and "groups of 32" in msg
    with pytest.raises(core.ScaleGroupError, match=r"uint8.*NVFP4 needs e4m3 \(float8_e4m3fn\)"):
        core.check_scale_group("L", "w2", (4, 256, 128), (4, 256, 16), torch.uint8, core.NVFP4)
    with pytest.raises(core.ScaleGroupError, match="scale rows"):
        core.check_scale_group("L", "w2", (4, 256, 128), (4, 128, 16), E4M3, core.NVFP4)
    with pytest.raises(core.ScaleGroupError, match="not a multiple"):
        core.check_scale_group("L", "w2", (4, 256, 4), (4, 256, 1), E4M3, core.NVFP4)


def test_mxfp4_scale_group_is_k32_ue8m0():
    core.check_scale_group("L", "w13", (4, 512, 128), (4, 512, 8), torch.uint8, core.MXFP4)
    with pytest.raises(core.ScaleGroupError, match=r"16 scale columns .*K/32 = 8"):
        core.check_scale_group("L", "w13", (4, 512, 128), (4, 512, 16), torch.uint8, core.MXFP4)
    with pytest.raises(core.ScaleGroupError, match="float8_e4m3fn.*MXFP4 needs ue8m0"):
        core.check_scale_group("L", "w13", (4, 512, 128), (4, 512, 8), E4M3, core.MXFP4)


def test_observed_loads_pair_scales_with_weights_by_rows():
    obs = core.LoadObservations()
    obs.record("w13_weight", torch.empty(256, 128, dtype=torch.uint8))  # one expert's w1: I=256 rows, K=256
    obs.record("w13_weight_scale", torch.empty(256, 16, dtype=E4M3))
    obs.record("w2_weight", torch.empty(256, 128, dtype=torch.uint8))
    obs.record("w2_weight_scale", torch.empty(256, 8, dtype=E4M3))  # group 32 in an NVFP4 layer
    allocated = {"w13_weight": ((4, 512, 128), torch.uint8), "w13_weight_scale": ((4, 512, 16), E4M3),
                 "w2_weight": ((4, 256, 128), torch.uint8), "w2_weight_scale": ((4, 256, 16), E4M3)}
    with pytest.raises(core.ScaleGroupError, match=r"checkpoint w2_weight_scale has 8 scale columns for K=256"):
        core.check_observed_loads("L", core.NVFP4, obs, allocated)
    good = core.LoadObservations(seen={k: v for k, v in obs.seen.items() if k != "w2_weight_scale"})
    good.record("w2_weight_scale", torch.empty(256, 16, dtype=E4M3))
    assert core.check_observed_loads("L", core.NVFP4, good, allocated) == 2


def test_an_unpaired_scale_is_checked_against_the_allocated_weight():
    obs = core.LoadObservations()
    obs.record("w13_weight_scale", torch.empty(256, 8, dtype=E4M3))  # its weight came through another path
    allocated = {"w13_weight": ((4, 512, 128), torch.uint8), "w13_weight_scale": ((4, 512, 16), E4M3)}
    with pytest.raises(core.ScaleGroupError, match="8 scale columns for K=256"):
        core.check_observed_loads("L", core.NVFP4, obs, allocated)


def test_explain_load_failure_only_speaks_about_scale_columns():
    msg = core.explain_load_failure("L", "w13_weight_scale", "experts.0.w1.weight_scale", (256, 8), (4, 512, 16),
                                    256, core.NVFP4, 16)
    assert "8 scale columns" in msg and "allocated 16" in msg and "group_size=16" in msg and "groups of 32" in msg
    assert core.explain_load_failure("L", "w13_weight", "x", (256, 64), (4, 512, 128), 256, core.NVFP4, 16) is None
    assert core.explain_load_failure("L", "w13_weight_scale", "x", (128, 16), (4, 512, 16), 256, core.NVFP4,
                                     16) is None


# ---------------------------------------------------------------- MegaMoE shape rule

@pytest.mark.parametrize("mma_type", ["nvfp4xnvfp4", "mxf4xmxf4", "fp8xfp4"])
def test_alignment_rule_agrees_with_sglang_check_mega_moe_shapes(mma_type):
    # The core restates SGLang's rule so it can name configurations without importing SGLang; pin the two.
    from sglang.srt.layers.moe.mega_moe import check_mega_moe_shapes

    for hidden in (2048, 2816, 3072, 4096, 5120, 6144, 7168):
        for inter in (128, 384, 512, 768, 1024, 1408, 1536, 2048, 2304):
            try:
                check_mega_moe_shapes(hidden, inter, mma_type)
                sglang_ok = True
            except ValueError:
                sglang_ok = False
            try:
                core.check_megamoe_shapes("L", hidden, inter, mma_type)
                ours_ok = True
            except core.MegaMoEShapeError:
                ours_ok = False
            assert ours_ok == sglang_ok, (mma_type, hidden, inter)


def test_glm_45_air_is_refused_by_name_glm5_and_glm45_pass():
    core.check_megamoe_shapes("L", 6144, 2048, "nvfp4xnvfp4")  # GLM-5.x
    core.check_megamoe_shapes("L", 5120, 1536, "nvfp4xnvfp4")  # GLM-4.5 / 4.6 / 4.7
    with pytest.raises(core.MegaMoEShapeError) as exc:
        core.check_megamoe_shapes("model.layers.1.mlp.experts", 4096, 1408, "nvfp4xnvfp4")
    msg = str(exc.value)
    assert "model.layers.1.mlp.experts" in msg and "GLM-4.5-Air" in msg
    assert "moe_intermediate_size=1408" in msg and "% 256" in msg and "--moe-a2a-backend none" in msg
    with pytest.raises(core.MegaMoEShapeError, match=r"padded from hidden_size=4096, moe_intermediate_size=1400"):
        core.check_megamoe_shapes("L", 4096, 1408, "nvfp4xnvfp4", checkpoint=(4096, 1400))


def test_trtllm_padding_is_refused_for_the_shared_layout():
    core.check_trtllm_unpadded("L", (256, 256), (256, 256), None)
    with pytest.raises(core.MegaMoEShapeError, match=r"from \(256, 200\) to \(256, 256\)"):
        core.check_trtllm_unpadded("L", (256, 200), (256, 256), None)
    with pytest.raises(core.MegaMoEShapeError, match="padded"):
        core.check_trtllm_unpadded("L", (256, 256), (256, 256), 512)


# ---------------------------------------------------------------- alphas

def test_alphas_equal_sglang_0523_formula_bit_for_bit():
    from sglang.srt.layers.quantization.modelopt_quant import _compute_gemm1_alphas, _input_scale_to_local_experts

    g = torch.Generator().manual_seed(1)
    num_experts, local, rank = 8, 4, 1
    w13_s2 = torch.rand(local, 2, generator=g) + 0.1
    w2_s2 = torch.rand(local, generator=g) + 0.1
    w2_in = torch.rand(num_experts, generator=g) + 0.1
    w2_local = _input_scale_to_local_experts(w2_in, local, num_experts, rank)
    ours = core.nvfp4_megamoe_alphas("L", w13_s2, w2_s2, w2_local)
    # 0.5.23's _build_mega_moe_weights, restated from its source with its own helpers:
    gate, up = _compute_gemm1_alphas(w13_s2, torch.ones(local), True)
    assert torch.equal(ours.l1, torch.stack([gate, up], dim=1))
    assert torch.equal(ours.l2_act, 1.0 / w2_local)
    assert torch.equal(ours.l2, w2_local * w2_s2.to(torch.float32))
    assert torch.equal(ours.l2, w2_in[4:] * w2_s2)  # rank 1 reads experts 4..7
    assert ours.nbytes == local * 16
    shared = core.nvfp4_megamoe_alphas("L", w13_s2[:, 0], w2_s2, w2_local)  # one scale for both halves
    assert torch.equal(shared.l1[:, 0], shared.l1[:, 1])


def test_alphas_refuse_scales_that_would_poison_the_kernel():
    ok = torch.ones(4)
    with pytest.raises(core.AlphaError, match="w2_input_scale of local expert 2 is 0.0"):
        core.nvfp4_megamoe_alphas("L", torch.ones(4, 2), ok, torch.tensor([1.0, 1.0, 0.0, 1.0]))
    with pytest.raises(core.AlphaError, match=r"w13_weight_scale_2 \(up\) of local expert 1 is nan"):
        core.nvfp4_megamoe_alphas("L", torch.tensor([[1.0, 1.0], [1.0, float("nan")], [1, 1], [1, 1]]), ok, ok)
    with pytest.raises(core.AlphaError, match="counts differ"):
        core.nvfp4_megamoe_alphas("L", torch.ones(4, 2), torch.ones(3), ok)


def test_tied_l1_alphas_reproduce_the_weights_from_rescaled_block_scales():
    """SGLang's clamp branch rescales the smaller half's block scales to one shared alpha; MegaMoE reads those
    scales, and the tied alphas give back the checkpoint weights (up to the e4m3 rounding of the rescale)."""
    from sglang.srt.layers.quantization.dequantization import dequantize_nvfp4

    w_gate, w_up = torch.randn(128, 64), torch.randn(128, 64) * 3
    (qg, sg, g2), (qu, su, u2) = H.quantize_nvfp4(w_gate), H.quantize_nvfp4(w_up)
    a = core.nvfp4_megamoe_alphas("L", torch.stack([g2, u2]).view(1, 2), torch.ones(1), torch.ones(1))
    shared = torch.maximum(g2, u2)
    sg_r = (sg.float() * (g2 / shared)).to(E4M3)  # what modelopt_quant does to the gate half
    su_r = (su.float() * (u2 / shared)).to(E4M3)
    tied = core.tie_l1_alphas(a)
    assert torch.equal(tied.l1, torch.stack([shared, shared]).view(1, 2))
    ref = dequantize_nvfp4(qg, sg, g2, torch.float32)
    got = dequantize_nvfp4(qg, sg_r, tied.l1[0, 0], torch.float32)
    stale = dequantize_nvfp4(qg, sg_r, a.l1[0, 0], torch.float32)
    assert torch.allclose(got, ref, rtol=0.07, atol=1e-6)  # e4m3 keeps 3 mantissa bits
    assert not torch.allclose(stale, ref, rtol=0.07, atol=1e-6)  # untied alphas on rescaled scales are wrong
    ref_up = dequantize_nvfp4(qu, su, u2, torch.float32)
    assert torch.allclose(dequantize_nvfp4(qu, su_r, tied.l1[0, 1], torch.float32), ref_up, rtol=0.07, atol=1e-6)


# ---------------------------------------------------------------- views and memory

def _trtllm_like(e=2, rows=256, k=256):
    return (torch.randint(0, 256, (e, 2 * rows, k // 2), dtype=torch.uint8),
            torch.rand(e, 2 * rows, k // 16).to(E4M3),
            torch.randint(0, 256, (e, k, rows // 2), dtype=torch.uint8),
            torch.rand(e, k, rows // 16).to(E4M3))


def test_views_share_storage_and_invert_bit_exactly():
    w13, s13, w2, s2 = _trtllm_like()
    (l1w, l1s), (l2w, l2s) = core.trtllm_views("L", w13, s13, w2, s2)
    for view, src in ((l1w, w13), (l1s, s13), (l2w, w2), (l2s, s2)):
        assert view.data_ptr() == src.data_ptr() and view.untyped_storage().data_ptr() == src.untyped_storage().data_ptr()
    assert l1w.dtype == torch.int8 and l1s.dtype == torch.int32 and tuple(l1s.shape) == (2, 512, 4)
    assert tuple(l2s.shape) == (2, 256, 4)  # w2: K = I = 256 -> 16 e4m3 scales -> 4 words
    # The inverse of a view is a view: bit for bit the TRTLLM tensors.
    assert torch.equal(l1w.view(torch.uint8), w13) and torch.equal(l2w.view(torch.uint8), w2)
    assert torch.equal(l1s.view(torch.uint8), s13.view(torch.uint8))
    assert torch.equal(l2s.view(E4M3).view(torch.uint8), s2.view(torch.uint8))
    w13[0, 0, 0] ^= 0xFF  # an in-place update (EPLB) is what MegaMoE reads
    assert l1w[0, 0, 0].item() == w13[0, 0, 0].view(torch.int8).item()


def test_views_refuse_what_would_need_a_copy():
    w13, s13, w2, s2 = _trtllm_like()
    with pytest.raises(core.SharedStorageError, match="not contiguous"):
        core.trtllm_views("L", w13.transpose(1, 2).contiguous().transpose(1, 2), s13, w2, s2)
    with pytest.raises(core.ScaleGroupError, match="TRTLLM w2_weight_scale"):
        core.trtllm_views("L", w13, s13, w2, s2[..., :8])
    with pytest.raises(core.SharedStorageError, match="bfloat16"):
        core.trtllm_views("L", w13.to(torch.bfloat16), s13, w2, s2)


def test_memory_counts_views_as_shared_and_copies_as_copied():
    w13, s13, w2, s2 = _trtllm_like()
    alphas = core.nvfp4_megamoe_alphas("L", torch.ones(2, 2), torch.ones(2), torch.ones(2))
    views = [t for pair in core.trtllm_views("L", w13, s13, w2, s2) for t in pair]
    mem = core.megamoe_memory("L", [w13, s13, w2, s2], views, alphas.named().values())
    total = sum(t.numel() * t.element_size() for t in (w13, s13, w2, s2))
    assert (mem.trtllm_bytes, mem.shared_bytes, mem.copied_weight_bytes, mem.extra_bytes) == (total, total, 0, 32)
    copied = core.megamoe_memory("L", [w13, s13, w2, s2], [w13.clone(), *views[1:]], alphas.named().values())
    assert copied.copied_weight_bytes == w13.numel() and copied.extra_bytes == w13.numel() + 32
    tally = core.MemoryTally(kept=[mem, mem], no_fallback=[("L9", "MXFP4 (mxf4xmxf4): x", 3 << 20)])
    kept_line, missing_line = tally.summary()
    assert "2 NVFP4 MoE layer(s)" in kept_line and "copied: 0 B" in kept_line and "64 B" in kept_line
    assert "NO fallback" in missing_line and "3.00 MiB" in missing_line


# ---------------------------------------------------------------- deep_gemm's own layout (the opt-out path)

def test_deep_gemm_megamoe_layout_inverts_bit_exactly_to_the_checkpoint():
    import deep_gemm
    from deep_gemm.utils.math import transform_ue4m3_sf_into_required_layout

    w13, s13, w2, s2 = _trtllm_like(e=2, rows=256, k=256)
    l1, l2 = deep_gemm.transform_weights_for_mega_moe(
        (w13.view(torch.int8), transform_ue4m3_sf_into_required_layout(s13, s13.shape[1])),
        (w2.view(torch.int8), transform_ue4m3_sf_into_required_layout(s2, s2.shape[1])),
        mma_type="nvfp4xnvfp4")
    assert not torch.equal(l1[0].view(torch.uint8), w13)  # the layout really moved rows
    (b13, c13), (b2, c2) = H.invert_megamoe_nvfp4(l1, l2)
    assert torch.equal(b13, w13) and torch.equal(b2, w2)
    assert torch.equal(c13.view(torch.uint8), s13.view(torch.uint8))
    assert torch.equal(c2.view(torch.uint8), s2.view(torch.uint8))
    # deep_gemm's canonical->MegaMoE scale transform is the same as the one 0.5.23 applies piecewise.
    t13, t2 = deep_gemm.transform_scales_for_mega_moe(
        transform_ue4m3_sf_into_required_layout(s13, s13.shape[1]),
        transform_ue4m3_sf_into_required_layout(s2, s2.shape[1]))
    assert torch.equal(t13.contiguous(), l1[1].contiguous()) and torch.equal(t2.contiguous(), l2[1].contiguous())
