"""What only an SM100 GPU (B200 / B300) with SGLang 0.5.23, FlashInfer 0.7.2 and sgl-deep-gemm 0.2.3.post2 proves.
NOT verified by this project yet (the lent GPU is an H200, SM90, without SGLang): run on a Blackwell node with
`pytest tests/megamoe/test_fp4_gpu.py -m gpu -ra`.

Nothing is faked here: FlashInfer's real TRTLLM preparation, DeepGEMM's real kernels on a one-rank group.
Reference: a float32 MoE on SGLang's `dequantize_nvfp4` of the checkpoint; MegaMoE and TRTLLM quantize
activations to NVFP4 themselves, hence the relative-error bounds (measured bounds to be recorded on first run).
"""

from __future__ import annotations

import os
import pathlib
import socket
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import fp4_harness as H  # noqa: E402

HID, INTER, EXPERTS, TOKENS, TOPK = 1024, 512, 8, 64, 2


def _need_sm100():
    if torch.cuda.get_device_capability()[0] != 10:
        pytest.skip(f"needs an SM100-class GPU (FP4 MegaMoE kernels), this is SM{torch.cuda.get_device_capability()}")
    pytest.importorskip("flashinfer")
    pytest.importorskip("deep_gemm")


@pytest.fixture(scope="module")
def ep_group():
    """One NCCL group of one rank for the whole module: SGLang caches MegaMoE buffers by id(group)."""
    import torch.distributed as dist

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _runtime(a2a, runner):
    return H.sglang_runtime(quantization="modelopt_fp4", a2a=a2a, runner=runner, sm100=None, device="cuda")


def _layer(ck, *, a2a, runner, keep="1"):
    os.environ["SGLANG_GLM_EXT_MEGAMOE_FP4_KEEP_TRTLLM"] = keep
    try:
        with _runtime(a2a, runner):
            with torch.device("cuda"):
                layer = H.build_nvfp4_layer(ck)
            H.load_nvfp4(layer, _on_cuda(ck))
            before = torch.cuda.memory_allocated()
            layer.quant_method.process_weights_after_loading(layer)
            torch.cuda.synchronize()
            layer._glm_ext_test_pwal_delta = torch.cuda.memory_allocated() - before
    finally:
        os.environ.pop("SGLANG_GLM_EXT_MEGAMOE_FP4_KEEP_TRTLLM", None)
    return layer


def _on_cuda(ck):
    out = H.Checkpoint(ck.num_experts, ck.hidden, ck.intermediate, ck.recipe)
    out.tensors = {k: t.cuda() for k, t in ck.tensors.items()}
    return out


def _reference(ck, x, ids, weights):
    from sglang.srt.layers.quantization.dequantization import dequantize_nvfp4

    def w(e, shard):
        t = ck.tensors
        return dequantize_nvfp4(t[(e, shard, "weight")], t[(e, shard, "weight_scale")],
                                t[(e, shard, "weight_scale_2")], torch.float32).cuda()

    xf, out = x.float(), torch.zeros(x.shape[0], ck.hidden, device="cuda")
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            h = torch.nn.functional.silu(xf[t] @ w(e, "w1").T) * (xf[t] @ w(e, "w3").T)
            out[t] += weights[t, k] * (h @ w(e, "w2").T)
    return out


def _run_mega(layer, x, ids, weights, group):
    from sglang.srt.layers.moe.mega_moe import run_mega_routed_experts
    from sglang.srt.runtime_context import get_parallel

    with _runtime("megamoe", "auto"), get_parallel().override(
            moe_ep_group=type("G", (), {"device_group": group})()):
        return run_mega_routed_experts(layer, x, ids, weights, hidden_size=HID, intermediate_size=INTER,
                                       top_k=TOPK, num_tokens=x.shape[0]).float()


def _inputs(seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(TOKENS, HID, device="cuda", generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(EXPERTS, device="cuda", generator=g)[:TOPK] for _ in range(TOKENS)])
    weights = torch.rand(TOKENS, TOPK, device="cuda", generator=g)
    return x, ids.to(torch.int32), weights / weights.sum(-1, keepdim=True)


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.gpu(reason="DeepGEMM's nvfp4xnvfp4 MegaMoE kernel reading FlashInfer's real TRTLLM-shuffled tensors "
                        "(weight_layout='trtllm', zero copy) computes the MoE: matches a float reference and "
                        "MegaMoE on deep_gemm's own layout built from the same checkpoint")
def test_megamoe_on_the_trtllm_layout_matches_reference_and_own_layout(ep_group):
    _need_sm100()
    ck = H.Checkpoint.random(EXPERTS, HID, INTER, seed=11)
    shared = _layer(ck, a2a="megamoe", runner="auto")
    own = _layer(ck, a2a="megamoe", runner="auto", keep="0")
    assert shared._mega_moe_trtllm_layout and not own._mega_moe_trtllm_layout
    x, ids, weights = _inputs()
    ref = _reference(ck, x, ids, weights)
    y_shared, y_own = _run_mega(shared, x, ids, weights, ep_group), _run_mega(own, x, ids, weights, ep_group)
    assert _rel(y_shared, ref) < 0.1, "MegaMoE on the TRTLLM layout is off the float reference"
    assert _rel(y_shared, y_own) < 1e-2, "the two MegaMoE layouts disagree: alphas or the TRTLLM row order"


@pytest.mark.gpu(reason="FlashInfer's TRTLLM runner still runs on the tensors MegaMoE shares (after a MegaMoE call) "
                        "and gives a2a=none's output bit for bit: the kept fallback layout is usable")
def test_trtllm_runner_on_the_shared_storage_equals_a2a_none(ep_group):
    _need_sm100()
    from sglang.srt.layers.moe.moe_runner.flashinfer_trtllm import (
        FlashInferTrtllmFp4MoeQuantInfo,
        fused_experts_none_to_flashinfer_trtllm_fp4,
    )
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    ck = H.Checkpoint.random(EXPERTS, HID, INTER, seed=12)
    shared = _layer(ck, a2a="megamoe", runner="auto")
    plain = _layer(ck, a2a="none", runner="flashinfer_trtllm")
    x, ids, weights = _inputs(1)
    _run_mega(shared, x, ids, weights, ep_group)

    def trtllm(layer):
        info = FlashInferTrtllmFp4MoeQuantInfo(
            w13_weight=layer.w13_weight.data, w2_weight=layer.w2_weight.data,
            w13_weight_scale=layer.w13_weight_scale.data, w2_weight_scale=layer.w2_weight_scale.data,
            g1_scale_c=layer.g1_scale_c.data, g1_alphas=layer.g1_alphas.data, g2_alphas=layer.g2_alphas.data,
            w13_input_scale_quant=layer.w13_input_scale_quant, global_num_experts=layer.num_experts,
            local_expert_offset=0, local_num_experts=layer.num_local_experts,
            intermediate_size_per_partition=layer.intermediate_size_per_partition,
            routing_method_type=layer.routing_method_type, use_per_token_activation=False,
            padded_hidden_size=layer.trtllm_padded_hidden_size)
        topk = StandardTopKOutput(weights, ids, torch.empty(0, device="cuda"))
        with _runtime("none", "flashinfer_trtllm"):
            return fused_experts_none_to_flashinfer_trtllm_fp4(StandardDispatchOutput(x, None, topk), info,
                                                               layer.moe_runner_config, use_routed_topk=True)

    a, b = trtllm(shared).hidden_states.float(), trtllm(plain).hidden_states.float()
    assert torch.equal(a, b)
    assert _rel(a, _reference(ck, x, ids, weights)) < 0.1


@pytest.mark.gpu(reason="on the GPU the kept-TRTLLM build allocates no more than a2a=none's TRTLLM build beyond "
                        "the alphas (16 B per local expert, allocator rounding aside)")
def test_gpu_memory_of_the_kept_layout_is_the_trtllm_layout_plus_alphas():
    _need_sm100()
    ck = H.Checkpoint.random(EXPERTS, HID, INTER, seed=13)
    shared = _layer(ck, a2a="megamoe", runner="auto")
    plain = _layer(ck, a2a="none", runner="flashinfer_trtllm")
    assert shared._glm_ext_test_pwal_delta - plain._glm_ext_test_pwal_delta <= 3 * 512  # 3 alpha tensors
    assert H.param_bytes(shared) - H.param_bytes(plain) == 16 * EXPERTS


@pytest.mark.gpu(reason="deep_gemm's CUDA transform_sf_into_required_layout (UE8M0, recipe (1, 32)) gives the "
                        "layout of deep_gemm's torch fallback, which the CPU MXFP4 tests use in its place")
def test_ue8m0_cuda_transform_matches_the_torch_fallback_the_cpu_tests_use():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    deep_gemm = pytest.importorskip("deep_gemm", reason="needs sgl-deep-gemm built for this torch (the lent GPU's "
                                    "image has torch 2.11 and no deep_gemm in its SGLang environment)")
    from deep_gemm.utils.layout import _pack_fp32_into_ue8m0_fallback

    sf = torch.exp2(torch.randint(-8, 8, (2, 512, 16), device="cuda").float())
    got = deep_gemm.transform_sf_into_required_layout(sf, mn=512, k=512, recipe=(1, 32), num_groups=2,
                                                      disable_ue8m0_cast=False)
    want = _pack_fp32_into_ue8m0_fallback(sf)
    assert got.shape == want.shape and got.stride() == want.stride() and torch.equal(got, want)
