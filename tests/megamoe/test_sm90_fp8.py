"""The SM90 FP8 layout equals SGLang's, the reference is layout-independent, and the stock layout reading of
interleaved weights is wrong (why no stock path may run on them)."""

from types import SimpleNamespace

import torch

from sglang.srt.layers.moe import mega_moe, mega_moe_sm90
from sglang.srt.layers.quantization.fp8_utils import block_quant_dequant

from sglang_glm_ext.megamoe import sm90_fp8


def fp8_layer(e=4, h=256, i=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(e, 2 * i, h, generator=g) * 0.05).to(torch.float8_e4m3fn)
    w2 = (torch.randn(e, h, i, generator=g) * 0.05).to(torch.float8_e4m3fn)
    s13 = torch.rand(e, 2 * i // 128, h // 128, generator=g) + 0.5
    s2 = torch.rand(e, h // 128, i // 128, generator=g) + 0.5
    return w13, s13, w2, s2


def test_interleave_equals_sglang_and_inverts():
    w = torch.randn(3, 256, 16)
    got = sm90_fp8.interleave_gate_up(w)
    assert torch.equal(got, mega_moe_sm90._interleave_l1_weight_only(w))
    assert torch.equal(got, mega_moe._interleave_mega_moe_gate_up(w, gran=8))
    assert torch.equal(sm90_fp8.deinterleave_gate_up(got), w)


def test_sglang_builder_interleaves_w13_in_place_and_marks_the_layer():
    w13, s13, w2, s2 = fp8_layer()
    experts = SimpleNamespace(w13_weight=torch.nn.Parameter(w13.clone(), requires_grad=False),
                              w13_weight_scale_inv=torch.nn.Parameter(s13.clone(), requires_grad=False),
                              w2_weight=torch.nn.Parameter(w2.clone(), requires_grad=False),
                              w2_weight_scale_inv=torch.nn.Parameter(s2.clone(), requires_grad=False))
    assert not sm90_fp8.layer_is_interleaved(experts)
    mega_moe_sm90.build_sm90_mega_moe_experts_weights(experts)
    assert sm90_fp8.layer_is_interleaved(experts)
    as_u8 = lambda t: t.view(torch.uint8)  # noqa: E731
    assert torch.equal(as_u8(experts.w13_weight.data), as_u8(sm90_fp8.interleave_gate_up(w13)))
    assert torch.equal(experts.w13_weight_scale_inv.data, s13)  # scales stay in [gate; up] order
    assert experts.mega_l1_weights[0].data_ptr() == experts.w13_weight.data_ptr()  # one buffer, two names


def test_dequant_matches_sglang_block_dequant():
    w13, s13, _, _ = fp8_layer()
    torch.testing.assert_close(sm90_fp8.dequant_block_fp8(w13, s13),
                               block_quant_dequant(w13, s13, [128, 128], torch.float32))


def test_reference_is_layout_independent_and_the_stock_reading_of_interleaved_weights_is_wrong():
    w13, s13, w2, s2 = fp8_layer()
    x = torch.randn(6, 256, generator=torch.Generator().manual_seed(3))
    ids = torch.tensor([[0, 1], [2, 3], [1, 3], [0, 2], [3, 0], [2, 1]], dtype=torch.int32)
    w = torch.rand(6, 2, generator=torch.Generator().manual_seed(4)) + 0.1
    inter = sm90_fp8.interleave_gate_up(w13)
    ref = sm90_fp8.reference_moe(x, ids, w, w13, s13, w2, s2, w13_interleaved=False, routed_scaling_factor=2.5)
    same = sm90_fp8.reference_moe(x, ids, w, inter, s13, w2, s2, w13_interleaved=True, routed_scaling_factor=2.5)
    torch.testing.assert_close(same, ref)
    # A runner that reads the interleaved rows as [gate; up] (SGLang's stock path after the SM90 builder):
    stock = sm90_fp8.reference_moe(x, ids, w, inter, s13, w2, s2, w13_interleaved=False, routed_scaling_factor=2.5)
    assert float((stock - ref).norm() / ref.norm()) > 0.3


def test_reference_quantised_activations_stay_close_and_other_ranks_experts_are_skipped():
    w13, s13, w2, s2 = fp8_layer()
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(5))
    ids = torch.tensor([[0, 5], [1, 6], [4, 2], [7, 3], [0, 1]], dtype=torch.int32)
    w = torch.full((5, 2), 0.5)
    exact = sm90_fp8.reference_moe(x, ids, w, w13, s13, w2, s2, w13_interleaved=False, expert_offset=0)
    q = sm90_fp8.reference_moe(x, ids, w, w13, s13, w2, s2, w13_interleaved=False, quantize_activations=True)
    assert float((q - exact).norm() / exact.norm()) < 0.08
    # Experts 4-7 belong to another rank (offset 4): only they count there, and the two halves sum to the whole.
    w13b, s13b, w2b, s2b = fp8_layer(seed=9)
    full = sm90_fp8.reference_moe(x, ids, w, torch.cat([w13, w13b]), torch.cat([s13, s13b]), torch.cat([w2, w2b]),
                                  torch.cat([s2, s2b]), w13_interleaved=False)
    lo = sm90_fp8.reference_moe(x, ids, w, w13, s13, w2, s2, w13_interleaved=False, expert_offset=0)
    hi = sm90_fp8.reference_moe(x, ids, w, w13b, s13b, w2b, s2b, w13_interleaved=False, expert_offset=4)
    torch.testing.assert_close(lo + hi, full)
