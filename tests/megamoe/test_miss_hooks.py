"""megamoe/miss_hooks.py's own contract, on a CPU: which layout a layer keeps for the miss path (`fallback_kind`,
recorded at load by `prepare_fallback`), and `runner_layout`, which hands SGLang's runner the layout it reads for one
call and gives the kernel its layout back on every exit, an exception included. The runner itself through SGLang's
pieces: tests/megamoe/test_miss_layouts.py; on GPUs: scripts/gpu/megamoe_miss_2gpu.py."""

from types import SimpleNamespace

import pytest
import torch

from sglang_glm_ext.megamoe import miss_hooks, sm90_fp8
from sglang_glm_ext.megamoe.reads import FALLBACK_ATTR


def _experts(**attrs):
    base = dict(quant_method=SimpleNamespace(runner=None), moe_ep_size=1)
    return SimpleNamespace(**{**base, **attrs})


@pytest.mark.parametrize("attrs, block, want", [
    # SGLang's SM90 builder interleaved w13 in place: the miss lays it back for the FP8 runner, if one was built
    (dict(_mega_moe_sm90_fp8_weights=True, quant_method=SimpleNamespace(runner=object())), None, "sm90_relayout"),
    (dict(_mega_moe_sm90_fp8_weights=True), None, None),  # no runner to read it: this layer cannot miss
    (dict(), None, "stock"),  # MegaMoE does not read these experts: the checkpoint layout, as is
    (dict(_mega_moe_weights_built=True, _mega_moe_trtllm_layout=True), None, "nvfp4_trtllm"),
    (dict(_mega_moe_weights_built=True), None, None),  # MegaMoE-only layouts (MXFP4, the NVFP4 repack)
    # a fused shared expert in per-rank slots has no stock layout to gather over under EP; without EP it does
    (dict(moe_ep_size=2), SimpleNamespace(num_fused_shared_experts=1), None),
    (dict(moe_ep_size=1), SimpleNamespace(num_fused_shared_experts=1), "stock"),
    (dict(moe_ep_size=2), SimpleNamespace(num_fused_shared_experts=0), "stock"),
])
def test_the_fallback_layout_follows_what_the_layer_keeps(attrs, block, want):
    assert miss_hooks.fallback_kind(_experts(**attrs), block) == want


@pytest.mark.parametrize("attrs, want", [(dict(), "stock"), (dict(_mega_moe_weights_built=True), None)])
def test_prepare_fallback_records_the_layout_on_the_layer(attrs, want):
    experts = _experts(**attrs)
    assert miss_hooks.prepare_fallback(experts) == want
    assert experts.__dict__[FALLBACK_ATTR] == want  # what the guard and the forward read later


def _interleaved_w13(experts=3, inter=2 * sm90_fp8.GRAN, hidden=4):
    gen = torch.Generator().manual_seed(0)
    plain = torch.randint(0, 256, (experts, 2 * inter, hidden), dtype=torch.uint8, generator=gen)
    kernel = plain.clone()
    sm90_fp8.interleave_experts_(kernel)
    assert not torch.equal(kernel, plain)  # the interleave moves rows: the checks below can tell the layouts apart
    return plain, kernel


def test_sm90_relayout_gives_the_runner_gate_then_up_and_the_kernel_its_interleave_back():
    plain, kernel = _interleaved_w13()
    experts = SimpleNamespace(w13_weight=SimpleNamespace(data=kernel))
    before = kernel.clone()
    ptr = kernel.data_ptr()
    with miss_hooks.runner_layout(experts, "sm90_relayout"):
        assert torch.equal(kernel, plain)  # [gate; up] as the checkpoint had it: what SGLang's FP8 runner reads
        assert kernel.data_ptr() == ptr  # in place: the kernel's weight views keep reading this storage
    assert torch.equal(kernel, before)


def test_sm90_relayout_restores_the_kernels_layout_when_the_runner_raises():
    _, kernel = _interleaved_w13()
    experts = SimpleNamespace(w13_weight=SimpleNamespace(data=kernel))
    before = kernel.clone()
    with pytest.raises(RuntimeError, match="runner failed"):
        with miss_hooks.runner_layout(experts, "sm90_relayout"):
            raise RuntimeError("runner failed")
    assert torch.equal(kernel, before)  # the next kernel call reads its interleave, not the checkpoint's rows


@pytest.mark.parametrize("raises", [False, True])
def test_nvfp4_trtllm_lifts_the_megamoe_refusal_for_the_call_only(raises):
    experts = SimpleNamespace(_mega_moe_nvfp4=True)
    try:
        with miss_hooks.runner_layout(experts, "nvfp4_trtllm"):
            assert experts._mega_moe_nvfp4 is False  # apply() refuses to run while it is set
            if raises:
                raise ValueError("boom")
    except ValueError:
        assert raises
    assert experts._mega_moe_nvfp4 is True


@pytest.mark.parametrize("kind", ["stock", None])
def test_other_layouts_are_read_as_they_are(kind):
    w = torch.arange(8, dtype=torch.uint8)
    experts = SimpleNamespace(w13_weight=SimpleNamespace(data=w), _mega_moe_nvfp4=True)
    with miss_hooks.runner_layout(experts, kind):
        assert torch.equal(w, torch.arange(8, dtype=torch.uint8)) and experts._mega_moe_nvfp4 is True


def test_a_rank_without_rows_sends_empty_routing_of_the_gathered_shape():
    x = torch.zeros((0, 16), dtype=torch.bfloat16)
    ids, weights = miss_hooks._empty_routing(x, top_k=8)
    assert ids.shape == weights.shape == (0, 8)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32  # what the all-gather of others' routing holds
