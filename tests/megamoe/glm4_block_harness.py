"""One rank of a CPU run of SGLang's real Glm4MoeSparseMoeBlock under --moe-a2a-backend megamoe, with the plugin's
hooks applied by its own ledger and a fake deep_gemm (fake_deep_gemm.py). Started by tests/megamoe/test_glm4_block.py
as `python glm4_block_harness.py WORLD RANK PORT MODEL_DIR OUT.json`, one process per rank over gloo.

It publishes SGLang's runtime context from real ServerArgs (so the resolution pipeline, the plugin's launch check
included, runs on a real GLM-4 config), builds the block with tp = ep = WORLD, gives its experts block-FP8 weights
and lets SGLang's own `build_sm90_mega_moe_experts_weights` interleave them, then drives the forward through every
branch SGLang's stock forward has. Results (numbers, recorded calls) go to OUT.json for the test to judge.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from types import SimpleNamespace
from unittest import mock

WORLD, RANK, PORT, MODEL_DIR, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
CAP = 64
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=PORT, RANK=str(RANK), WORLD_SIZE=str(WORLD),
                  LOCAL_RANK=str(RANK), SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK=str(CAP))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import fake_deep_gemm  # noqa: E402

FAKE = fake_deep_gemm.FakeDeepGemm()
sys.modules["deep_gemm"] = FAKE

import sglang_glm_ext  # noqa: E402

LEDGER = sglang_glm_ext.register()

import sglang.srt.arg_groups.mega_moe_hook as mega_moe_hook  # noqa: E402
import sglang.srt.layers.moe.mega_moe as mega_moe  # noqa: E402
import sglang.srt.layers.moe.mega_moe_sm90 as mega_moe_sm90  # noqa: E402
from sglang.srt.distributed import parallel_state  # noqa: E402
from sglang.srt.distributed.parallel_state import (  # noqa: E402
    GroupCoordinator,
    init_distributed_environment,
    initialize_model_parallel,
)
from sglang.srt.layers.moe.utils import initialize_moe_config  # noqa: E402
from sglang.srt.runtime_context import SpawnRanks, get_parallel, override_platform, publish, reset_context  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

from sglang_glm_ext.megamoe import hooks, select  # noqa: E402

results: dict = {"rank": RANK, "patches": {k: v.state.value for k, v in LEDGER.status.items()}}


def main() -> None:
    init_distributed_environment(world_size=WORLD, rank=RANK, local_rank=RANK, backend="gloo")
    reset_context()
    # The CPU has no SM90: say so to SGLang's compat check and the plugin's launch check, for resolution only.
    with override_platform(is_cuda=True, is_sm90=True, is_sm100=False, device_sm=90), \
            mock.patch.object(mega_moe_hook, "get_platform",
                              lambda: SimpleNamespace(is_cuda=True, is_sm90=True, is_sm100=False, is_hip=False)):
        publish(ServerArgs(model_path=MODEL_DIR, tp_size=WORLD, moe_a2a_backend="megamoe", device="cpu",
                           max_running_requests=32, chunked_prefill_size=CAP, skip_tokenizer_init=True),
                role="test", ranks=SpawnRanks(world_rank=RANK))
    get_parallel().override_permanently(world_group=parallel_state._WORLD)
    real_group = parallel_state.init_model_parallel_group

    def cpu_group(*a, **k):  # no NCCL communicator on a CPU: gloo groups only
        k["use_pynccl"] = False
        return real_group(*a, **k)

    with mock.patch.object(parallel_state, "init_model_parallel_group", cpu_group):
        initialize_model_parallel(backend="gloo")
    initialize_moe_config()
    par = get_parallel()
    results["parallel"] = {"tp": par.tp_size, "ep": par.moe_ep_size, "ep_rank": par.moe_ep_rank}
    mega_moe._device_sm = 90  # the kernel-side modules read the SM they were imported on
    mega_moe_sm90._device_sm = 90

    from sglang.srt.layers.moe.topk import TopKOutputFormat, select_experts
    from sglang.srt.layers.quantization.fp8_utils import block_quant_dequant
    from sglang.srt.models.glm4_moe import Glm4MoeSparseMoeBlock

    cfg = SimpleNamespace(num_experts_per_tok=2, routed_scaling_factor=2.5, n_shared_experts=1, n_routed_experts=8,
                          hidden_act="silu", hidden_size=256, moe_intermediate_size=128, norm_topk_prob=True,
                          n_group=4, topk_group=2)
    torch.set_grad_enabled(False)
    block = Glm4MoeSparseMoeBlock(cfg, layer_id=3, quant_config=None, prefix="model.layers.3.mlp")
    shared = block.shared_experts
    results["shared"] = {"is_replicated": bool(shared.is_replicated),
                         "gate_up_rows": int(shared.gate_up_proj.weight.shape[0]),
                         "down_cols": int(shared.down_proj.weight.shape[1])}

    # Same weights on every rank (seeded); each rank holds its experts' slice, as the loader would give it.
    g = torch.Generator().manual_seed(1234)
    E, H, I = 8, 256, 128
    w13 = (torch.randn(E, 2 * I, H, generator=g) * 0.08).to(torch.float8_e4m3fn)
    w2 = (torch.randn(E, H, I, generator=g) * 0.08).to(torch.float8_e4m3fn)
    s13 = torch.rand(E, 2 * I // 128, H // 128, generator=g) * 0.5 + 0.5
    s2 = torch.rand(E, H // 128, I // 128, generator=g) * 0.5 + 0.5
    block.gate.weight.copy_(torch.randn(E, H, generator=g) * 0.1)
    block.gate.e_score_correction_bias.copy_(torch.randn(E, generator=g) * 0.05)
    sh_gate_up = torch.randn(2 * I, H, generator=g) * 0.05
    sh_down = torch.randn(H, I, generator=g) * 0.05
    shared.gate_up_proj.weight.copy_(sh_gate_up)
    shared.down_proj.weight.copy_(sh_down)
    local = E // par.moe_ep_size
    sl = slice(par.moe_ep_rank * local, (par.moe_ep_rank + 1) * local)
    experts = block.experts
    experts.w13_weight = torch.nn.Parameter(w13[sl].clone(), requires_grad=False)
    experts.w2_weight = torch.nn.Parameter(w2[sl].clone(), requires_grad=False)
    experts.w13_weight_scale_inv = torch.nn.Parameter(s13[sl].clone(), requires_grad=False)
    experts.w2_weight_scale_inv = torch.nn.Parameter(s2[sl].clone(), requires_grad=False)
    mega_moe_sm90.build_sm90_mega_moe_experts_weights(experts)  # SGLang's own builder: w13 interleaved in place
    results["interleaved"] = bool(experts._mega_moe_sm90_fp8_weights) and not torch.equal(
        experts.w13_weight.data.view(torch.uint8), w13[sl].view(torch.uint8))
    results["ready"] = bool(mega_moe.is_mega_moe_experts_ready(experts))

    stock_calls = []

    def stock_forward(*a, **k):
        stock_calls.append(1)
        raise AssertionError("SGLang's stock fused-MoE path ran on interleaved weights")

    experts.forward = stock_forward  # nn.Module.__call__ finds the instance attribute first
    all_reduces = []
    real_ar = GroupCoordinator.all_reduce

    def counting_all_reduce(self, *a, **k):
        all_reduces.append(getattr(self, "unique_name", "?"))
        return real_ar(self, *a, **k)

    dense_w13 = block_quant_dequant(w13, s13, [128, 128], torch.float32)
    dense_w2 = block_quant_dequant(w2, s2, [128, 128], torch.float32)

    def reference(x):
        """Independent of the plugin: SGLang's own routing and dequant, every expert in the [gate; up] layout."""
        logits = torch.nn.functional.linear(x.float(), block.gate.weight)
        topk = select_experts(x, logits, block.topk.topk_config, layer_id=3)
        out = torch.zeros(x.shape[0], H)
        for t in range(x.shape[0]):
            for k in range(topk.topk_ids.shape[1]):
                e = int(topk.topk_ids[t, k])
                h = dense_w13[e] @ x[t].float()
                out[t] += cfg.routed_scaling_factor * float(topk.topk_weights[t, k]) * (
                    dense_w2[e] @ (torch.nn.functional.silu(h[:I]) * h[I:]))
        gu = sh_gate_up @ x.float().t()
        out += (sh_down @ (torch.nn.functional.silu(gu[:I]) * gu[I:])).t()
        return out, topk

    def run(name, rows, global_tokens, capture=False, alt_stream=None):
        torch.manual_seed(100 + RANK)
        x = torch.randn(rows, H)
        n_kernel = FAKE.names().count("fp8_mega_moe")
        block.alt_stream = alt_stream
        entry = {"rows": rows}
        with mock.patch.object(mega_moe, "get_dp_global_num_tokens", lambda: global_tokens), \
                mock.patch.object(mega_moe, "get_is_capture_mode", lambda: capture), \
                mock.patch.object(GroupCoordinator, "all_reduce", counting_all_reduce):
            try:
                y = block(x, None)
                entry["outcome"] = "mega"
                entry["y_shape"] = list(y.shape)
                if rows:
                    ref, topk = reference(x)
                    entry["rel_err"] = float((y.float() - ref).norm() / ref.norm())
                    pre = [c for n, c in FAKE.calls if n == "mega_moe_pre_dispatch_sm90"][-1]
                    entry["ids_equal_select_experts"] = bool(torch.equal(
                        pre["ids"].sort(dim=-1).values, topk.topk_ids.to(torch.int32).sort(dim=-1).values))
                    entry["weights_equal_select_experts"] = bool(torch.allclose(
                        pre["weights"].gather(1, pre["ids"].argsort(dim=-1)),
                        topk.topk_weights.float().gather(1, topk.topk_ids.argsort(dim=-1))))
            except select.MegaMoEMissError as exc:
                entry["outcome"] = "refused"
                entry["message"] = str(exc)
        entry["kernel_calls"] = FAKE.names().count("fp8_mega_moe") - n_kernel
        entry["all_reduces"] = list(all_reduces)
        all_reduces.clear()
        results.setdefault("runs", {})[name] = entry

    rows = 5 if RANK == 0 else 3
    run("dp", rows, [5, 3][:WORLD])
    run("tp_no_global", 4, None)
    # TopK returns the BYPASSED form only from its CUDA forward (a CPU dispatches to forward_native, which ignores
    # the format): take the GPU's branch, and count the materialisations the hook does.
    from sglang.srt.layers.moe import topk as topk_mod

    block.topk.topk_config.output_format = TopKOutputFormat.BYPASSED
    block.topk._forward_method = block.topk.forward_cuda
    real_to_standard = topk_mod.BypassedTopKOutput.to_standard
    materialised = []

    def counting_to_standard(self, *a, **k):
        materialised.append(1)
        return real_to_standard(self, *a, **k)

    with mock.patch.object(topk_mod.BypassedTopKOutput, "to_standard", counting_to_standard):
        run("bypassed", rows, [5, 3][:WORLD])
    results["bypassed_materialised"] = len(materialised)
    block.topk._forward_method = None
    block.topk.topk_config.output_format = TopKOutputFormat.STANDARD
    run("empty_rank", 4 if RANK == 0 else 0, [4, 0][:WORLD])
    # Capture with the block's alternate stream: the kernel runs on it, the shared expert on the current stream.
    # A CPU has no streams: record what the block asks of them, in order.
    events = []

    class FakeStream:
        def __init__(self, name):
            self.name = name

        def wait_stream(self, other):
            events.append(f"{self.name}.wait({other.name})")

    current, alt = FakeStream("current"), FakeStream("alt")

    @contextlib.contextmanager
    def on_stream(stream):
        events.append(f"enter {stream.name}")
        yield
        events.append(f"leave {stream.name}")

    real_kernel = FAKE.fp8_mega_moe

    def kernel_in_order(*a, **k):
        events.append("kernel")
        return real_kernel(*a, **k)

    with mock.patch.object(torch.cuda, "current_stream", lambda: current), \
            mock.patch.object(torch.cuda, "stream", on_stream), mock.patch.object(FAKE, "fp8_mega_moe", kernel_in_order):
        run("capture", rows, None, capture=True, alt_stream=alt)
    results["capture_stream_events"] = events
    run("over_cap_elsewhere", 2, [2, CAP + 1][:WORLD] if WORLD > 1 else [CAP + 1])
    experts._mega_moe_weights_built = False
    run("not_ready", rows, [5, 3][:WORLD])
    experts._mega_moe_weights_built = True
    results["stock_calls"] = len(stock_calls)
    results["calls"] = [
        (n, {k: (list(v) if isinstance(v, tuple) else v if not isinstance(v, torch.dtype) else str(v))
             for k, v in c.items()
             if v is None or isinstance(v, (int, float, str, bool, torch.dtype))
             or (isinstance(v, tuple) and all(isinstance(i, int) for i in v))})
        for n, c in FAKE.calls
    ]
    results["l1_is_mega_l1"] = all(
        c["l1"] is experts.mega_l1_weights for n, c in FAKE.calls if n == "fp8_mega_moe")

    # The load check on a model holding this block: ready -> no problem; not ready -> the layer is named.
    holder = torch.nn.Module()
    holder.mlp = block
    results["load_check_ready"] = hooks.check_loaded_model(holder, "Glm4MoeForCausalLM")
    experts._mega_moe_weights_built = False  # not ready; w13 still interleaved: the miss path relays it (issue 26)
    results["load_check_not_ready"] = hooks.check_loaded_model(holder, "Glm4MoeForCausalLM")
    results["fallback_not_ready"] = experts.__dict__.get(hooks.FALLBACK_ATTR)
    experts._mega_moe_weights_built = True
    experts._mega_moe_sm90_fp8_weights = False  # built, but not a layout SM90 runs, and none kept for the miss
    results["load_check_unservable"] = hooks.check_loaded_model(holder, "Glm4MoeForCausalLM")
    experts._mega_moe_sm90_fp8_weights = True


try:
    main()
except BaseException as exc:  # report, never hang the peer: the test reads the error from the file
    results["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
finally:
    with open(OUT, "w") as f:
        json.dump(results, f, default=str)
    os._exit(0)
