"""One rank of a CPU run of the MegaMoE hit and miss paths through SGLang's real GLM MoE blocks, over gloo.
Started by tests/megamoe/test_miss_path.py as `python miss_harness.py KIND WORLD RANK PORT MODEL_DIR OUT.json`
(KIND: glm4 = Glm4MoeSparseMoeBlock, glm5 = DeepseekV2MoE, GLM-5.x's block), one process per rank.

Real: SGLang's block (gate, TopK, the replicated shared expert, its forward for GLM-5), an FP8 FusedMoE built by
SGLang's Fp8MoEMethod (block 128x128) with its loaders and process_weights_after_loading (which runs SGLang's own
SM90 MegaMoE builder: w13 interleaved in place), SGLang's dispatcher, MoeRunner and combine, SGLang's gloo groups
(tp = ep = WORLD), the plugin's hooks as register() installs them. Fake: deep_gemm (fake_deep_gemm: the hit path's
kernel, dispatch and combine over the group), the Triton kernel under SGLang's FP8 runner (reference_runner, the
miss path's expert math), the platform's SM (90) and CUDA flag (so the blocks apply the GPU's routed-scaling
rule), and DP attention's all-gathered per-rank token counts (get_dp_global_num_tokens), which make every rank's
batch size different. The reference each rank checks against is computed on the whole batch (every rank's rows)
in this process, from the checkpoint, with SGLang's select_experts and block dequant: no plugin code.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import zlib
from types import SimpleNamespace
from unittest import mock

KIND, WORLD, RANK, PORT, MODEL_DIR, OUT = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5],
                                           sys.argv[6])
CAP = 64
E, H, I = 8, 256, 128
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=PORT, RANK=str(RANK), WORLD_SIZE=str(WORLD),
                  LOCAL_RANK=str(RANK), SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK=str(CAP))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import fake_deep_gemm  # noqa: E402
import reference_runner  # noqa: E402

FAKE = fake_deep_gemm.FakeDeepGemm()
sys.modules["deep_gemm"] = FAKE

import sglang_glm_ext  # noqa: E402

LEDGER = sglang_glm_ext.register()

import sglang.srt.arg_groups.mega_moe_hook as mega_moe_hook  # noqa: E402
import sglang.srt.layers.moe.mega_moe as mega_moe  # noqa: E402
import sglang.srt.layers.moe.mega_moe_sm90 as mega_moe_sm90  # noqa: E402
import sglang.srt.layers.quantization.fp8 as fp8  # noqa: E402
from sglang.srt.distributed import parallel_state  # noqa: E402
from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel  # noqa: E402
from sglang.srt.layers.moe.utils import initialize_moe_config  # noqa: E402
from sglang.srt.runtime_context import SpawnRanks, get_parallel, override_platform, publish, reset_context  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

from sglang_glm_ext.megamoe import hooks, miss, select, sm90_fp8  # noqa: E402

results: dict = {"rank": RANK, "kind": KIND}


def checkpoint():
    g = torch.Generator().manual_seed(4321)
    ck = {}
    for e in range(E):
        for shard, (rows, cols) in {"w1": (I, H), "w3": (I, H), "w2": (H, I)}.items():
            ck[(e, shard, "weight")] = (torch.randn(rows, cols, generator=g) * 0.08).to(torch.float8_e4m3fn)
            ck[(e, shard, "weight_scale_inv")] = torch.rand(rows // 128, cols // 128, generator=g) * 0.5 + 0.5
    return ck


def main() -> None:
    init_distributed_environment(world_size=WORLD, rank=RANK, local_rank=RANK, backend="gloo",
                                 timeout=60)  # seconds: a collective another rank skips fails, not hangs
    reset_context()
    platform = SimpleNamespace(is_cuda=True, is_sm90=True, is_sm100=False, is_hip=False)
    with override_platform(is_cuda=True, is_sm90=True, is_sm100=False, device_sm=90), \
            mock.patch.object(mega_moe_hook, "get_platform", lambda: platform):
        publish(ServerArgs(model_path=MODEL_DIR, tp_size=WORLD, moe_a2a_backend="megamoe", device="cpu",
                           max_running_requests=32, chunked_prefill_size=CAP, skip_tokenizer_init=True),
                role="test", ranks=SpawnRanks(world_rank=RANK))
    get_parallel().override_permanently(world_group=parallel_state._WORLD)
    real_group = parallel_state.init_model_parallel_group

    def cpu_group(*a, **k):
        k["use_pynccl"] = False
        return real_group(*a, **k)

    with mock.patch.object(parallel_state, "init_model_parallel_group", cpu_group):
        initialize_model_parallel(backend="gloo")
    initialize_moe_config()
    par = get_parallel()
    results["parallel"] = {"tp": par.tp_size, "ep": par.moe_ep_size, "ep_rank": par.moe_ep_rank}
    mega_moe._device_sm = 90
    mega_moe_sm90._device_sm = 90
    fp8._is_cpu = False  # Fp8MoEMethod's GPU branch: the one that builds the SM90 MegaMoE weights
    import sglang.srt.layers.moe.token_dispatcher.standard as standard

    standard.get_device = lambda *a, **k: "cpu"  # the dispatcher puts its expert map on the platform's device

    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.moe.topk import select_experts
    from sglang.srt.layers.moe.utils import RoutingMethodType
    from sglang.srt.layers.quantization.fp8 import Fp8Config
    from sglang.srt.layers.quantization.fp8_utils import block_quant_dequant

    torch.set_grad_enabled(False)
    prefix = "model.layers.3.mlp"
    with override_platform(is_cuda=True, is_sm90=True, is_sm100=False, device_sm=90):
        if KIND == "glm4":
            from sglang.srt.models import glm4_moe as model_mod
            from sglang.srt.models.glm4_moe import Glm4MoeSparseMoeBlock

            cfg = SimpleNamespace(num_experts_per_tok=2, routed_scaling_factor=2.5, n_shared_experts=1,
                                  n_routed_experts=E, hidden_act="silu", hidden_size=H, moe_intermediate_size=I,
                                  norm_topk_prob=True, n_group=4, topk_group=2)
            block = Glm4MoeSparseMoeBlock(cfg, layer_id=3, quant_config=None, prefix=prefix)
            arch = "Glm4MoeForCausalLM"
        else:
            from transformers import DeepseekV3Config

            from sglang.srt.models import deepseek_v2 as model_mod
            from sglang.srt.models.deepseek_v2 import DeepseekV2MoE

            cfg = DeepseekV3Config(hidden_size=H, intermediate_size=512, moe_intermediate_size=I, n_routed_experts=E,
                                   n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
                                   routed_scaling_factor=2.5, norm_topk_prob=True, num_hidden_layers=4,
                                   first_k_dense_replace=1, hidden_act="silu", topk_method="noaux_tc",
                                   scoring_func="sigmoid")
            block = DeepseekV2MoE(cfg, layer_id=3, quant_config=None, prefix=prefix)
            arch = "GlmMoeDsaForCausalLM"
        # The FP8 experts a block-FP8 checkpoint gives (the blocks would also FP8-quantise the shared expert,
        # whose CUDA GEMM has no CPU path; it stays bf16 here).
        qc = Fp8Config(is_checkpoint_fp8_serialized=True, weight_block_size=[128, 128])
        block.experts = FusedMoE(num_experts=E, num_fused_shared_experts=0, top_k=2, layer_id=3, hidden_size=H,
                                 intermediate_size=I, quant_config=qc, routed_scaling_factor=2.5,
                                 routing_method_type=RoutingMethodType.DeepSeekV3, prefix=prefix + ".experts")
    experts = block.experts
    ck = checkpoint()
    for (e, shard, kind), t in ck.items():  # every rank feeds every expert; the loader keeps its own
        param = getattr(experts, ("w2_" if shard == "w2" else "w13_") + kind)
        param.weight_loader(param, t.clone(), f"{prefix}.experts.{e}.{shard}.{kind}", shard_id=shard, expert_id=e)
    with override_platform(is_cuda=True, is_sm90=True, is_sm100=False, device_sm=90):
        experts.quant_method.process_weights_after_loading(experts)
    local = E // par.moe_ep_size
    mine = range(par.moe_ep_rank * local, (par.moe_ep_rank + 1) * local)
    w13 = torch.stack([torch.cat([ck[(e, "w1", "weight")], ck[(e, "w3", "weight")]]) for e in range(E)])
    s13 = torch.stack([torch.cat([ck[(e, "w1", "weight_scale_inv")], ck[(e, "w3", "weight_scale_inv")]])
                       for e in range(E)])
    w2 = torch.stack([ck[(e, "w2", "weight")] for e in range(E)])
    s2 = torch.stack([ck[(e, "w2", "weight_scale_inv")] for e in range(E)])
    interleaved = sm90_fp8.interleave_gate_up(w13[mine.start:mine.stop]).view(torch.uint8)
    results["interleaved_at_load"] = bool(experts._mega_moe_sm90_fp8_weights) and torch.equal(
        experts.w13_weight.data.view(torch.uint8), interleaved)

    g = torch.Generator().manual_seed(99)
    gate = block.gate
    gate.weight.copy_(torch.randn(E, H, generator=g) * 0.1)
    gate.e_score_correction_bias.copy_(torch.randn(E, generator=g) * 0.05)
    sh_gu = torch.randn(2 * I, H, generator=g) * 0.05
    sh_down = torch.randn(H, I, generator=g) * 0.05
    block.shared_experts.gate_up_proj.weight.copy_(sh_gu)
    block.shared_experts.down_proj.weight.copy_(sh_down)
    results["shared_rows"] = int(block.shared_experts.gate_up_proj.weight.shape[0])  # replicated: 2I, not 2I/tp

    holder = torch.nn.Module()
    holder.layers = torch.nn.ModuleList([torch.nn.Module()])
    holder.layers[0].mlp = block
    results["load_check"] = hooks.check_loaded_model(holder, arch)
    results["fallback"] = experts.__dict__.get(hooks.FALLBACK_ATTR)
    reference_runner.install(experts)

    dense13 = block_quant_dequant(w13, s13, [128, 128], torch.float32)
    dense2 = block_quant_dequant(w2, s2, [128, 128], torch.float32)

    def reference(x):
        """The whole batch, from the checkpoint: SGLang's routing and dequant, every expert, + the shared expert."""
        logits = torch.nn.functional.linear(x.float(), gate.weight.float())
        topk = select_experts(x, logits, block.topk.topk_config, layer_id=3)
        out = torch.zeros(x.shape[0], H)
        fused = bool(getattr(block, "routed_scaling_factor_fused_in_topk", False))
        for t in range(x.shape[0]):
            for k in range(topk.topk_ids.shape[1]):
                e = int(topk.topk_ids[t, k])
                h = dense13[e] @ x[t].float()
                out[t] += (1.0 if fused else 2.5) * float(topk.topk_weights[t, k]) * (
                    dense2[e] @ (torch.nn.functional.silu(h[:I]) * h[I:]))
        gu = sh_gu @ x.float().t()
        return out + (sh_down @ (torch.nn.functional.silu(gu[:I]) * gu[I:])).t()

    def rows_of(name, r, n):
        return torch.randn(n, H, generator=torch.Generator().manual_seed(zlib.crc32(f"{name}/{r}".encode())))

    gathered = []
    real_gathered = miss.gathered_moe

    def counting_gathered(*a, **k):
        gathered.append(1)
        return real_gathered(*a, **k)

    def run(name, rows, capture=False):
        xs = [rows_of(name, r, rows[r]) for r in range(WORLD)]
        x = xs[RANK]
        n_kernel, n_gather, n_runner = FAKE.names().count("fp8_mega_moe"), len(gathered), len(reference_runner.CALLS)
        entry = {"rows": rows}
        with mock.patch.object(mega_moe, "get_dp_global_num_tokens", lambda: list(rows)), \
                mock.patch.object(mega_moe, "get_is_capture_mode", lambda: capture), \
                mock.patch.object(miss, "gathered_moe", counting_gathered), \
                mock.patch.object(model_mod, "_is_cuda", True):
            try:
                y = block(x, None) if KIND == "glm4" else block.forward(x)
                entry["outcome"] = "ok"
                entry["y_shape"] = list(y.shape)
                if rows[RANK]:
                    start = sum(rows[:RANK])
                    ref = reference(torch.cat(xs))[start:start + rows[RANK]]
                    entry["rel_err"] = float((y.float() - ref).norm() / ref.norm())
            except select.MegaMoEMissError as exc:
                entry["outcome"] = "refused"
                entry["message"] = str(exc)
        entry["kernel_calls"] = FAKE.names().count("fp8_mega_moe") - n_kernel
        entry["miss_calls"] = len(gathered) - n_gather
        entry["runner_rows"] = [c["rows"] for c in reference_runner.CALLS[n_runner:]]
        entry["layout_restored"] = torch.equal(experts.w13_weight.data.view(torch.uint8), interleaved)
        results.setdefault("runs", {})[name] = entry

    pad = [0] * max(0, 4 - WORLD)
    run("hit_uneven", ([5, 3, 0, 7] + pad)[:WORLD])
    run("miss_one_rank_over_cap", ([70, 3, 0, 12] + pad)[:WORLD])
    run("miss_only_one_rank_busy", ([0, 65, 0, 0] + pad)[:WORLD])
    run("miss_even", [66] * WORLD)
    run("hit_after_misses", ([9, 1, 4, 0] + pad)[:WORLD])
    run("capture_takes_the_kernel", ([3, 3, 3, 3] + pad)[:WORLD], capture=True)
    experts._mega_moe_weights_built = False  # the layer's MegaMoE weights not ready: every batch misses
    run("not_ready", ([4, 0, 9, 2] + pad)[:WORLD])
    # ... under capture too (a layer MegaMoE cannot read captures its miss path): every rank captures the same
    # size, and the count all-gather (a host read, not capturable) is not made.
    sizes_gathered = []
    real_ep_sizes = miss.ep_sizes
    with mock.patch.object(miss, "ep_sizes", lambda *a, **k: sizes_gathered.append(1) or real_ep_sizes(*a, **k)):
        run("not_ready_capture", [6] * WORLD, capture=True)
    results["runs"]["not_ready_capture"]["count_all_gathers"] = len(sizes_gathered)
    experts._mega_moe_weights_built = True
    results["counters"] = miss.COUNTERS.snapshot()


try:
    main()
except BaseException as exc:  # report, never hang the peers: the test reads the error from the file
    results["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
finally:
    with open(OUT, "w") as f:
        json.dump(results, f, default=str)
    os._exit(0)
