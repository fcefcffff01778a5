"""fp4_hooks on real SGLang 0.5.23 layers, on a CPU.

Real in every test unless it says otherwise: SGLang's FusedMoE with ModelOpt NVFP4 / MXFP4 quant methods
(create_weights, the parameter loaders, process_weights_after_loading, SGLang's TRTLLM alignment code
`align_fp4_moe_weights_for_flashinfer_trtllm` / `prepare_static_weights_for_trtllm_fp4_moe`), the plugin's hooks
as register() installs them, SGLang's `dequantize_nvfp4`, deep_gemm 0.2.3.post2's torch transforms.
Faked at the CUDA boundary only, named in each test:
- FlashInfer's TRTLLM permutations and `nvfp4_block_scale_interleave` (fp4_harness.FakeFlashInfer: bijections
  with known inverses; not FlashInfer's own permutations);
- deep_gemm's compiled ops (`deep_gemm.mega._C`, a recorder) and the symmetric buffer (needs CUDA memory);
- deep_gemm's UE8M0 `transform_sf_into_required_layout` (CUDA op) by deep_gemm's own torch fallback.
"""

from __future__ import annotations

import contextlib
import logging
import pathlib
import sys
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import fp4_harness as H  # noqa: E402

from sglang_glm_ext.megamoe import fp4_hooks, fp4_layout as core  # noqa: E402

E4M3 = torch.float8_e4m3fn
HID, INTER = 256, 256
TRTLLM_ATTRS = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale", "g1_alphas", "g1_alphas_up",
                "g1_scale_c", "g2_alphas", "w13_input_scale_quant", "w2_input_scale_quant")


@pytest.fixture(scope="module", autouse=True)
def plugin_registered():
    import sglang_glm_ext as plugin

    plugin.register()
    states = {s.patch.id: s.state.value for s in plugin.ledger_state().status.values()
              if s.patch.id.startswith("megamoe_fp4.")}
    assert len(states) == 6 and set(states.values()) == {"applied"}, states


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    monkeypatch.delenv("SGLANG_GLM_EXT_MEGAMOE_FP4_KEEP_TRTLLM", raising=False)
    fp4_hooks.reset_for_tests()
    yield
    fp4_hooks.reset_for_tests()


@pytest.fixture
def fake_fi():
    fi = H.FakeFlashInfer()
    with fi.installed():
        yield fi


def nvfp4_layer(ck, *, a2a="megamoe", runner="auto", ep_size=1, ep_rank=0, process=True, override=None,
                swiglu_limit=None, group_size=16):
    with H.sglang_runtime(quantization="modelopt_fp4", a2a=a2a, runner=runner, ep_size=ep_size, ep_rank=ep_rank):
        layer = H.build_nvfp4_layer(ck, group_size=group_size, swiglu_limit=swiglu_limit)
        H.load_nvfp4(layer, ck, override)
        if process:
            layer.quant_method.process_weights_after_loading(layer)
    return layer


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.detach().view(torch.uint8) if t.element_size() == 1 else t.detach()


# ---------------------------------------------------------------- the kept TRTLLM layout

def test_megamoe_keeps_the_exact_trtllm_layout_and_views_its_storage(fake_fi):
    """Real: everything but FlashInfer's permutations. The NVFP4 layer built under megamoe holds, bit for bit,
    the TRTLLM tensors a2a=none builds from the same checkpoint; MegaMoE's weights are views of them."""
    ck = H.Checkpoint.random(4, HID, INTER)
    ref = nvfp4_layer(ck, a2a="none", runner="flashinfer_trtllm")
    ours = nvfp4_layer(ck)
    for name in TRTLLM_ATTRS:
        a, b = getattr(ref, name), getattr(ours, name)
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(raw(a), raw(b)), name
    assert ours.intermediate_size_per_partition == ref.intermediate_size_per_partition == INTER
    assert ours.trtllm_padded_hidden_size is ref.trtllm_padded_hidden_size is None
    assert ours.w13_blockscale_swizzled is ours.w13_weight_scale  # TRTLLM's alias, no swizzled copy

    (l1w, l1s), (l2w, l2s) = ours.mega_l1_weights, ours.mega_l2_weights
    for view, src in ((l1w, ours.w13_weight), (l1s, ours.w13_weight_scale), (l2w, ours.w2_weight),
                      (l2s, ours.w2_weight_scale)):
        assert view.data_ptr() == src.data_ptr(), "MegaMoE must read the TRTLLM storage, not a copy"
    assert (l1w.dtype, l1s.dtype, tuple(l1s.shape)) == (torch.int8, torch.int32, (4, 2 * INTER, HID // 64))
    assert ours._mega_moe_nvfp4 and ours._mega_moe_trtllm_layout and ours._mega_moe_weights_built
    assert getattr(ours, core.FALLBACK_ATTR) == core.Fallback(True, "flashinfer_trtllm")
    # Memory: the only bytes beyond a2a=none's layer are the alphas (16 B per local expert).
    assert H.param_bytes(ours) - H.param_bytes(ref) == 16 * 4
    (mem,) = fp4_hooks.TALLY.kept
    assert mem.copied_weight_bytes == 0 and mem.extra_bytes == 64 and mem.shared_bytes == mem.trtllm_bytes
    # Off megamoe the hooks did nothing to the reference layer.
    assert not hasattr(ref, fp4_hooks.SEEN_ATTR) and not hasattr(ref.quant_method, fp4_hooks.KEEP_ATTR)
    assert not ref._mega_moe_weights_built


def test_views_and_alphas_reproduce_the_checkpoint_under_expert_parallelism(fake_fi):
    """Real: SGLang's loaders (global -> local experts), TRTLLM prep, dequantize_nvfp4. Fake: FlashInfer's
    permutations, undone here with their known inverse. Rank 1 of 2 holds global experts 4..7; every byte MegaMoE
    reads un-shuffles to that expert's checkpoint tensor, and its alphas dequantize it exactly as the
    checkpoint's own scales do."""
    from sglang.srt.layers.quantization.dequantization import dequantize_nvfp4

    ck = H.Checkpoint.random(8, HID, INTER, seed=3)
    layer = nvfp4_layer(ck, ep_size=2, ep_rank=1)
    assert layer.num_local_experts == 4
    (l1w, l1s), (l2w, l2s) = layer.mega_l1_weights, layer.mega_l2_weights
    w13 = fake_fi.unshuffle_rows(l1w.view(torch.uint8), gated=True)  # TRTLLM order [up; gate]
    s13 = fake_fi.unshuffle_scales(l1s.view(E4M3), gated=True)
    w2 = fake_fi.unshuffle_rows(l2w.view(torch.uint8), gated=False)
    s2 = fake_fi.unshuffle_scales(l2s.view(E4M3), gated=False)
    l1a, l2a, l2act = layer.mega_l1_alphas, layer.mega_l2_alphas, layer.mega_l2_act_scales
    for j, e in enumerate(ck.local_experts(2, 1)):
        t = ck.tensors
        halves = {"w3": (w13[j, :INTER], s13[j, :INTER], l1a[j, 1]), "w1": (w13[j, INTER:], s13[j, INTER:], l1a[j, 0])}
        for shard, (q, s, alpha) in halves.items():
            assert torch.equal(q, t[(e, shard, "weight")]) and torch.equal(raw(s), raw(t[(e, shard, "weight_scale")]))
            ours = dequantize_nvfp4(q, s, alpha, torch.float32)
            ref = dequantize_nvfp4(t[(e, shard, "weight")], t[(e, shard, "weight_scale")],
                                   t[(e, shard, "weight_scale_2")], torch.float32)
            assert torch.equal(ours, ref), (e, shard)
            rel = (ref - ck.floats[(e, shard)]).norm() / ck.floats[(e, shard)].norm()
            assert rel < 0.15  # the quantizer itself is sane
        assert torch.equal(w2[j], t[(e, "w2", "weight")]) and torch.equal(raw(s2[j]), raw(t[(e, "w2", "weight_scale")]))
        # L2: the kernel requantizes the L1 output with l2_act and dequantizes with l2 -> net factor = scale_2.
        assert l2a[j] == t[(e, "w2", "input_scale")] * t[(e, "w2", "weight_scale_2")]
        assert l2act[j] == 1.0 / t[(e, "w2", "input_scale")]
        ours = dequantize_nvfp4(w2[j], s2[j], l2a[j] * l2act[j], torch.float32)
        ref = dequantize_nvfp4(t[(e, "w2", "weight")], t[(e, "w2", "weight_scale")], t[(e, "w2", "weight_scale_2")],
                               torch.float32)
        assert torch.allclose(ours, ref, rtol=1e-6, atol=0)


def test_alphas_are_tied_when_trtllm_rescales_block_scales_for_a_clamp(fake_fi):
    """Real: SGLang's gemm1 clamp branch (rescales the smaller half's e4m3 block scales in place). Fake:
    FlashInfer's permutations. MegaMoE reads the rescaled scales, so its l1 alphas must be the shared max."""
    from sglang.srt.layers.quantization.dequantization import dequantize_nvfp4

    ck = H.Checkpoint.random(2, HID, INTER, seed=5, untied_gate_up=True)
    layer = nvfp4_layer(ck, swiglu_limit=7.0)
    l1a = layer.mega_l1_alphas
    assert torch.equal(l1a[:, 0], l1a[:, 1])
    s13 = fake_fi.unshuffle_scales(layer.mega_l1_weights[1].view(E4M3), gated=True)
    w13 = fake_fi.unshuffle_rows(layer.mega_l1_weights[0].view(torch.uint8), gated=True)
    for j in range(2):
        t = ck.tensors
        assert l1a[j, 0] == max(t[(j, "w1", "weight_scale_2")], t[(j, "w3", "weight_scale_2")])
        ref = dequantize_nvfp4(t[(j, "w1", "weight")], t[(j, "w1", "weight_scale")], t[(j, "w1", "weight_scale_2")],
                               torch.float32)
        got = dequantize_nvfp4(w13[j, INTER:], s13[j, INTER:], l1a[j, 0], torch.float32)
        assert torch.allclose(got, ref, rtol=0.07, atol=1e-7)


# ---------------------------------------------------------------- the kernel call

class RecordingOps:
    """deep_gemm.mega._C: records the compiled-op calls the real Python wrappers make."""

    def __init__(self):
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args: self.calls.append((name, args))


@contextlib.contextmanager
def fake_mega_kernel(monkeypatch, force_mma_type=None):
    import deep_gemm
    import deep_gemm.mega as mega

    import sglang.srt.layers.moe.mega_moe as mm

    ops = RecordingOps()
    group = SimpleNamespace(size=lambda: 1, rank=lambda: 0)
    buffers = []

    def symm_buffer(group_, num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden, **kw):
        buffers.append(kw)
        z = torch.zeros(1, dtype=torch.int8)
        return SimpleNamespace(group=group_, num_experts=num_experts, num_topk=num_topk, buffer=z,
                               num_max_tokens_per_rank=num_max_tokens_per_rank,
                               mma_type=force_mma_type or kw["mma_type"],
                               handle=SimpleNamespace(buffer_ptrs=[0]), x=z, x_sf=z, topk_idx=z, topk_weights=z,
                               x_scales=z)

    monkeypatch.setattr(mega, "_C", ops)
    monkeypatch.setattr(deep_gemm, "get_symm_buffer_for_mega_moe", symm_buffer)
    monkeypatch.setattr(deep_gemm, "get_num_sms", lambda: 148)
    monkeypatch.setattr(mm, "_device_sm", 100)
    monkeypatch.setattr(mm, "_mega_moe_max_num_sms", lambda: None)
    monkeypatch.setattr(mm, "_MEGA_MOE_SYMM_BUFFER", {})
    from sglang.srt.runtime_context import get_parallel, reset_context

    reset_context()
    try:
        with get_parallel().override(moe_ep_group=SimpleNamespace(device_group=group)):
            yield ops, buffers
    finally:
        reset_context()


def run_routed(layer, tokens=3):
    from sglang.srt.layers.moe.mega_moe import run_mega_routed_experts

    hs = torch.randn(tokens, HID, dtype=torch.bfloat16)
    ids = torch.tensor([[0, 1], [2, 3], [1, 2]])[:tokens]
    return run_mega_routed_experts(layer, hs, ids, torch.full((tokens, 2), 0.5), hidden_size=HID,
                                   intermediate_size=INTER, top_k=2, num_tokens=tokens)


def test_weight_layout_trtllm_reaches_the_kernel_with_the_shared_tensors(fake_fi, monkeypatch):
    """Real: SGLang's run_mega_routed_experts and deep_gemm's Python wrappers (argument checks, marshalling).
    Fake: deep_gemm's compiled ops (recorded) and its symmetric buffer."""
    layer = nvfp4_layer(H.Checkpoint.random(4, HID, INTER))
    with fake_mega_kernel(monkeypatch) as (ops, buffers):
        run_routed(layer)
    assert buffers[0]["mma_type"] == "nvfp4xnvfp4"
    (pre,) = [a for n, a in ops.calls if n == "mega_moe_pre_dispatch"]
    assert pre[8] == 16 and pre[9] == "nvfp4xnvfp4"  # group_size, mma_type
    (kernel,) = [a for n, a in ops.calls if n == "fp8_fp4_mega_moe"]
    assert kernel[1].data_ptr() == layer.w13_weight.data_ptr() and kernel[2].data_ptr() == layer.w13_weight_scale.data_ptr()
    assert kernel[3].data_ptr() == layer.w2_weight.data_ptr() and kernel[4].data_ptr() == layer.w2_weight_scale.data_ptr()
    assert kernel[5] is None and kernel[7] is None  # no shared experts: the TRTLLM layout forbids them
    assert kernel[16] == (1, 1, 16) and kernel[17] == "nvfp4xnvfp4"
    assert kernel[21] is True and kernel[22] is layer.mega_l1_alphas and kernel[23] is layer.mega_l2_alphas
    assert kernel[24] is layer.mega_l2_act_scales
    assert kernel[-2] is True, "weight_layout='trtllm' must reach the compiled kernel"

    layer._mega_moe_trtllm_layout = False  # control: the flag is what decides
    with fake_mega_kernel(monkeypatch) as (ops, _):
        run_routed(layer)
    assert [a for n, a in ops.calls if n == "fp8_fp4_mega_moe"][0][-2] is False


def test_deep_gemm_refuses_the_trtllm_layout_for_a_non_nvfp4_buffer(fake_fi, monkeypatch):
    """Real: deep_gemm 0.2.3.post2's fp8_fp4_mega_moe checks; why MXFP4 cannot share a TRTLLM layout."""
    layer = nvfp4_layer(H.Checkpoint.random(4, HID, INTER))
    with fake_mega_kernel(monkeypatch, force_mma_type="mxf4xmxf4") as (ops, _):
        with pytest.raises(ValueError, match="TRT-LLM packed weights require NVFP4 MMA"):
            run_routed(layer)
    assert not [n for n, _ in ops.calls if n == "fp8_fp4_mega_moe"]


# ---------------------------------------------------------------- the paths that keep no fallback

def test_opt_out_restores_0523_in_place_repack_with_real_deep_gemm(monkeypatch):
    """Real: SGLang's _build_mega_moe_weights with deep_gemm's torch transforms. Nothing faked (no TRTLLM prep
    runs). Validation still runs; the layer says it has no fallback; deep_gemm's layout inverts to the checkpoint."""
    monkeypatch.setenv("SGLANG_GLM_EXT_MEGAMOE_FP4_KEEP_TRTLLM", "0")
    ck = H.Checkpoint.random(4, HID, INTER)
    layer = nvfp4_layer(ck)
    assert layer._mega_moe_weights_built and not layer._mega_moe_trtllm_layout
    fb = getattr(layer, core.FALLBACK_ATTR)
    assert not fb.kept and "KEEP_TRTLLM=0" in fb.reason
    assert isinstance(getattr(layer, fp4_hooks.SEEN_ATTR), core.LoadObservations)
    (w13, s13), (w2, s2) = H.invert_megamoe_nvfp4(layer.mega_l1_weights, layer.mega_l2_weights)
    for e in range(4):  # canonical [gate; up]: 0.5.23 loads gate first when the TRTLLM layout is off
        assert torch.equal(w13[e, :INTER], ck.tensors[(e, "w1", "weight")])
        assert torch.equal(w13[e, INTER:], ck.tensors[(e, "w3", "weight")])
        assert torch.equal(raw(s13[e, INTER:]), raw(ck.tensors[(e, "w3", "weight_scale")]))
        assert torch.equal(w2[e], ck.tensors[(e, "w2", "weight")])
        assert torch.equal(raw(s2[e]), raw(ck.tensors[(e, "w2", "weight_scale")]))
    (line,) = fp4_hooks.TALLY.summary()
    assert "NO fallback" in line


def test_a_deep_gemm_without_the_trtllm_layout_gets_0523s_repack_instead_of_failing_at_the_first_batch(monkeypatch):
    """Real: as the opt-out test. Faked: what doctor's probe reads from the installed deep_gemm (an sgl-deep-gemm
    0.2.0, whose fp8_fp4_mega_moe has no weight_layout). Keeping the layout would make run_mega_routed_experts pass
    weight_layout='trtllm' to a kernel wrapper that does not take it; the layer is repacked and says why."""
    from sglang_glm_ext.megamoe import hardware

    why = "deep_gemm 0.2.0 has no weight_layout='trtllm' (needs sgl-deep-gemm >= 0.2.3)"
    monkeypatch.setattr(hardware, "trtllm_layout", lambda: {"supported": False, "why": why})
    layer = nvfp4_layer(H.Checkpoint.random(4, HID, INTER))
    assert layer._mega_moe_weights_built and not layer._mega_moe_trtllm_layout
    fb = getattr(layer, core.FALLBACK_ATTR)
    assert not fb.kept and why in fb.reason and "cannot read the TRTLLM layout" in fb.reason
    (line,) = fp4_hooks.TALLY.summary()
    assert "NO fallback" in line


@pytest.mark.parametrize("backend,cuda,cap,expect", [
    ("flashinfer_trtllm", False, None, "flashinfer_trtllm"),
    ("flashinfer_trtllm_routed", False, None, "flashinfer_trtllm_routed"),
    ("auto", False, None, "flashinfer_trtllm"),
    ("auto", True, (10, 0), "flashinfer_trtllm"),
    ("auto", True, (9, 0), None),
    ("flashinfer_cutlass", False, None, None),
])
def test_the_kept_runner_is_the_one_create_moe_runner_would_pick(monkeypatch, backend, cuda, cap, expect):
    import sglang.srt.layers.quantization.modelopt_quant as mq
    from sglang.srt.layers.moe.utils import MoeRunnerBackend

    monkeypatch.setattr(mq, "is_cuda", lambda: cuda)
    monkeypatch.setattr(mq, "get_device_capability", lambda: cap)
    monkeypatch.setattr("sglang.srt.layers.moe.utils.get_moe_runner_backend", lambda: MoeRunnerBackend(backend))
    runner, why = fp4_hooks._trtllm_runner(None)
    assert runner == expect and (bool(why) == (expect is None))


def test_a2a_swap_is_scoped_to_the_call_and_restored_on_error():
    import sglang.srt.layers.quantization.modelopt_quant as mq

    real = mq.get_moe_a2a_backend
    with pytest.raises(RuntimeError, match="boom"):
        with fp4_hooks._modelopt_sees_a2a_none():
            assert mq.get_moe_a2a_backend().is_none()
            raise RuntimeError("boom")
    assert mq.get_moe_a2a_backend is real


# ---------------------------------------------------------------- refusals

def test_glm_45_air_shape_is_refused_at_construction_before_any_weight_loads():
    ck = H.Checkpoint(num_experts=2, hidden=4096, intermediate=1408, recipe="nvfp4")
    with H.sglang_runtime(quantization="modelopt_fp4", a2a="megamoe", runner="auto"):
        with pytest.raises(core.MegaMoEShapeError) as exc:
            H.build_nvfp4_layer(ck, prefix="model.layers.1.mlp.experts")
    msg = str(exc.value)
    assert "model.layers.1.mlp.experts" in msg and "GLM-4.5-Air" in msg and "1408" in msg and "256" in msg
    with H.sglang_runtime(quantization="modelopt_fp4", a2a="none", runner="flashinfer_trtllm"):
        H.build_nvfp4_layer(ck)  # control: FlashInfer TRTLLM serves this shape without MegaMoE


def _halve_scales(ck, shard, kind="weight_scale"):
    # Group-32 scales: one per 32 elements, what an MXFP4-style export would carry.
    return {(e, s, k): t[:, : t.shape[1] // 2].contiguous()
            for (e, s, k), t in ck.tensors.items() if s == shard and k == kind}


def test_group32_w13_scales_fail_at_load_with_a_named_error_not_a_bare_shape_error(fake_fi):
    ck = H.Checkpoint.random(2, HID, INTER)
    with pytest.raises(core.ScaleGroupError) as exc:
        nvfp4_layer(ck, override=_halve_scales(ck, "w1"))
    msg = str(exc.value)
    assert "model.layers.3.mlp.experts" in msg and "experts.0.w1.weight_scale" in msg
    assert "8 scale columns" in msg and "allocated 16" in msg and "groups of 32" in msg
    with pytest.raises(RuntimeError) as bare:  # what 0.5.23 says without the hook (a2a none)
        nvfp4_layer(ck, a2a="none", runner="flashinfer_trtllm", override=_halve_scales(ck, "w1"))
    assert not isinstance(bare.value, core.ScaleGroupError)


def test_group32_w2_scales_that_0523_loads_silently_are_refused_before_serving(fake_fi):
    ck = H.Checkpoint.random(2, HID, INTER)
    bad = _halve_scales(ck, "w2")
    # 0.5.23's w2 loader zero-pads a narrower tensor along K: no error, half the scales are 0 (a2a none shown).
    silent = nvfp4_layer(ck, a2a="none", runner="flashinfer_trtllm", process=False, override=bad)
    assert silent.w2_weight_scale.float()[:, :, 8:].eq(0).all()
    with pytest.raises(core.ScaleGroupError, match=r"checkpoint w2_weight_scale has 8 scale columns for K=256"):
        nvfp4_layer(ck, override=bad)


def test_scales_stored_as_bytes_are_refused(fake_fi):
    ck = H.Checkpoint.random(2, HID, INTER)
    as_bytes = {k: t.view(torch.uint8) for k, t in ck.tensors.items() if k[2] == "weight_scale"}
    with pytest.raises(core.ScaleGroupError, match="scales are uint8, NVFP4 needs e4m3"):
        nvfp4_layer(ck, override=as_bytes)


def test_a_group_size_32_config_is_named_in_the_load_error(fake_fi):
    ck = H.Checkpoint.random(2, HID, INTER)
    with pytest.raises(core.ScaleGroupError, match=r"allocated 8 .*group_size=32 from the quantization config"):
        nvfp4_layer(ck, group_size=32)


def test_bad_input_scale_is_refused_naming_the_expert(fake_fi):
    ck = H.Checkpoint.random(2, HID, INTER)
    with pytest.raises(core.AlphaError, match="w2_input_scale of local expert 1 is 0.0"):
        nvfp4_layer(ck, override={(1, "w2", "input_scale"): torch.tensor(0.0)})


# ---------------------------------------------------------------- MXFP4

@pytest.fixture
def ue8m0_transform(monkeypatch):
    """deep_gemm's transform_sf_into_required_layout is a CUDA op; stand in deep_gemm's own torch fallback for
    the same MN-major packed UE8M0 layout (fp32 power-of-two scales in, int32 words out)."""
    import deep_gemm
    from deep_gemm.utils.layout import _pack_fp32_into_ue8m0_fallback

    def transform(sf, mn, k, recipe, num_groups=None, is_sfa=None, disable_ue8m0_cast=False, psum_layout=None):
        assert recipe == (1, 32) and sf.shape[-2] == mn and sf.shape[-1] * 32 == k
        return _pack_fp32_into_ue8m0_fallback(sf)

    monkeypatch.setattr(deep_gemm, "transform_sf_into_required_layout", transform)


def mxfp4_layer(ck, override=None, hidden=None):
    with H.sglang_runtime(quantization="mxfp4", a2a="megamoe", runner="auto"):
        layer = H.build_mxfp4_layer(ck)
        H.load_mxfp4_fused(layer, ck, list(range(ck.num_experts)), override)
        layer.quant_method.process_weights_after_loading(layer)
    return layer


def test_mxfp4_layers_are_validated_built_and_say_they_keep_no_fallback(ue8m0_transform, caplog):
    """Real: Mxfp4MoEMethod's megamoe build and deep_gemm's transform_weights_for_mega_moe. Fake: the UE8M0
    scale transform (CUDA op)."""
    ck = H.Checkpoint.random(2, 512, 512, recipe="mxfp4")
    layer = mxfp4_layer(ck)
    assert layer._mega_moe_weights_built
    fb = getattr(layer, core.FALLBACK_ATTR)
    assert not fb.kept and "NVFP4-only" in fb.reason and "fp8xfp4" in fb.reason
    from sglang.srt.model_loader.loader import DefaultModelLoader

    with caplog.at_level(logging.INFO, logger="sglang_glm_ext"):
        DefaultModelLoader.postprocess_weights(torch.nn.Module(), torch.device("cpu"))
    (line,) = [r.getMessage() for r in caplog.records if "MegaMoE FP4" in r.getMessage()]
    cost = 2 * (1024 * 256 + 1024 * 16 + 512 * 256 + 512 * 16)  # both experts' FP4 weights and scales
    assert "1 MoE layer(s) on this GPU keep NO fallback" in line and core.fmt_bytes(cost) in line


def test_mxfp4_scale_mismatches_give_their_errors(ue8m0_transform):
    ck = H.Checkpoint.random(2, 512, 512, recipe="mxfp4")
    local = list(range(2))
    full = torch.stack([torch.cat([ck.tensors[(e, "w1", "weight_scale")], ck.tensors[(e, "w3", "weight_scale")]])
                        for e in local])
    # K/64 scales: 0.5.23's fused loader copies them into a slice of the 1.0-filled buffer without a word.
    with pytest.raises(core.ScaleGroupError, match=r"checkpoint w13_weight_scale has 8 scale columns for K=512"):
        mxfp4_layer(ck, override={"w13_weight_scale": full[..., :8].contiguous()})
    # K/16 scales do not fit: the loader's shape error comes back named.
    with pytest.raises(core.ScaleGroupError, match=r"32 scale columns .*allocated 16"):
        mxfp4_layer(ck, override={"w13_weight_scale": torch.cat([full, full], -1)})
    with pytest.raises(core.ScaleGroupError, match="float8_e4m3fn, MXFP4 needs ue8m0"):
        mxfp4_layer(ck, override={"w13_weight_scale": full.view(E4M3)})


def test_mxfp4_shape_refusal_names_the_mma_type():
    ck = H.Checkpoint(num_experts=2, hidden=4096, intermediate=1344, recipe="mxfp4")
    with H.sglang_runtime(quantization="mxfp4", a2a="megamoe", runner="auto"):
        with pytest.raises(core.MegaMoEShapeError, match=r"\(fp8xfp4\).*% 128.*moe_intermediate_size=1344"):
            H.build_mxfp4_layer(ck)


# ---------------------------------------------------------------- summary, contracts the hooks rely on

def test_summary_line_after_loading_reports_zero_copied_weights(fake_fi, caplog):
    nvfp4_layer(H.Checkpoint.random(4, HID, INTER))
    from sglang.srt.model_loader.loader import DefaultModelLoader

    with caplog.at_level(logging.INFO, logger="sglang_glm_ext"):
        DefaultModelLoader.postprocess_weights(torch.nn.Module(), torch.device("cpu"))
    (line,) = [r.getMessage() for r in caplog.records if "MegaMoE FP4" in r.getMessage()]
    assert "1 NVFP4 MoE layer(s)" in line and "expert weights copied: 0 B" in line and "64 B" in line
    assert not fp4_hooks.TALLY.kept  # logged once per load


def test_the_a2a_swap_only_skips_the_megamoe_early_return():
    """The keep path calls process_weights_after_loading with modelopt_quant's get_moe_a2a_backend reading
    'none'. That is right only while the method reads it once (the MegaMoE early return) and the one helper it
    calls that also reads it gives the same answer for none and megamoe. Pin both."""
    import inspect

    import sglang.srt.layers.quantization.modelopt_quant as mq
    from sglang_glm_ext.patching.ledger import resolve_original, source_sha

    src = inspect.getsource(resolve_original(
        "sglang.srt.layers.quantization.modelopt_quant.ModelOptNvFp4FusedMoEMethod.process_weights_after_loading"))
    assert src.count("get_moe_a2a_backend()") == 1 and "get_moe_a2a_backend().is_megamoe()" in src
    assert "_use_nvfp4_dispatch()" in src
    assert source_sha(mq._use_nvfp4_dispatch) == "5936c542fbc82e6a", "re-check _use_nvfp4_dispatch under a2a none"
    assert "get_moe_a2a_backend" in vars(mq)


def test_installed_deep_gemm_has_the_trtllm_weight_layout():
    import importlib.metadata
    import inspect

    import deep_gemm

    from sglang_glm_ext.megamoe import hardware

    assert importlib.metadata.version("sgl-deep-gemm") == hardware.deep_gemm_version() == "0.2.3.post2"
    assert inspect.signature(deep_gemm.fp8_fp4_mega_moe).parameters["weight_layout"].default == "megamoe"
    assert hardware.trtllm_layout() == {"supported": True, "why": ""}
