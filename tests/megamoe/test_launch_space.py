"""The MegaMoE launch check over the launch space (issues 22 and 26), through SGLang's real resolution.

For every GLM configuration the launch check accepts, every batch SGLang's own scheduler bounds allow on any rank --
prefill and decode, draft and verify, eager and captured -- either fits the kernel's per-rank cap or takes the
gathered miss path (only where every layer keeps a layout for it, and never for a captured graph, which always runs
the kernel), decided alike on every rank; for every configuration it refuses, each line of the message names what
to change. The bounds come from SGLang's own sizing
code run on the resolved arguments (launch_space.sglang_bounds), not from the plugin's formulas, so a bound the
launch check models wrong (or SGLang changes) fails here.

Space: tp 1-8, DP attention, chunked-prefill size, max running requests (and unset), decode CUDA-graph sizes,
prefill CUDA graphs, EAGLE (top-k 1-8, adaptive), pipeline parallelism with and without dynamic chunking,
mixed chunks, cap 64-8192; GLM-4.x and GLM-5.x with FP8 on SM90 (the miss path serves eager batches above the cap)
and GLM-4.x MXFP4 on SM100 (no miss path: every batch must fit). Fake deep_gemm API, platform SM90 / SM100.
"""

from __future__ import annotations

import random

import sys

import pytest

import sglang.srt.arg_groups.mega_moe_hook as mega_moe_hook
from sglang.srt.plugins.hook_registry import HookType, _wrap_fn
from sglang.srt.runtime_context import override_platform
from sglang.srt.server_args import ServerArgs

import fake_deep_gemm
import launch_space as L
from glm_configs import GLM4_CONFIG, write_model_dir
from sglang_glm_ext.megamoe import guard, hooks, select
from sglang_glm_ext.patching.ledger import resolve_original

TARGET = "sglang.srt.arg_groups.mega_moe_hook.validate_mega_moe_token_budget_for_model"
SM90 = dict(is_cuda=True, is_sm90=True, is_sm100=False, device_sm=90)
SM100 = dict(is_cuda=True, is_sm90=False, is_sm100=True, device_sm=100)
GLM5_CONFIG = dict(GLM4_CONFIG, architectures=["GlmMoeDsaForCausalLM"], model_type="deepseek_v3",
                   kv_lora_rank=64, q_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32,
                   num_key_value_heads=4)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    fake = fake_deep_gemm.FakeDeepGemm()
    for name in sorted(guard.SM100_KERNEL_API - set(dir(fake))):  # the launch check probes names, calls none
        setattr(fake, name, lambda *a, **k: None)
    mp.setitem(sys.modules, "deep_gemm", fake)
    import sglang.srt.layers.quantization as quantization
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4Config

    mp.setitem(quantization.QUANTIZATION_METHODS, "mxfp4", Mxfp4Config)  # registered on CUDA builds only
    for name in guard.RETIRED_ENV:
        mp.delenv(name, raising=False)
    mp.setattr(mega_moe_hook, "validate_mega_moe_token_budget_for_model",
               _wrap_fn(resolve_original(TARGET), hooks.hook_token_budget, HookType.AROUND))
    tmp = tmp_path_factory.mktemp("space")
    models = {"glm4": write_model_dir(tmp / "glm4", GLM4_CONFIG), "glm5": write_model_dir(tmp / "glm5", GLM5_CONFIG),
              "glm4_mxfp4": write_model_dir(tmp / "glm4_mxfp4", dict(GLM4_CONFIG,
                                                                  quantization_config={"quant_method": "mxfp4"}))}
    adaptive = L.write_adaptive_config(tmp / "adaptive.json")
    yield mp, models, adaptive
    mp.undo()


def resolve(env, case, model="glm4"):
    """(ServerArgs, None) when the launch is accepted, (None, exc) when refused."""
    mp, models, _ = env
    mp.setenv("SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK", str(case["cap"]))
    args = dict(model_path=models[model], moe_a2a_backend="megamoe", device="cuda", skip_tokenizer_init=True)
    args.update(case["args"])
    with override_platform(**PLATFORM[model]):
        sa = ServerArgs(**args)
        try:
            sa.resolve_once()
        except (ValueError, SystemExit) as exc:
            return None, exc
        return sa, None


PLATFORM = {"glm4": SM90, "glm5": SM90, "glm4_mxfp4": SM100}
# Whether every MoE layer keeps a layout the miss path runs (guard.fallback_for, checked per layer at load).
MISS_PATH = {"glm4": True, "glm5": True, "glm4_mxfp4": False}


def decisions_alike(case, bound, miss_ok, world, seed):
    """Per-rank batches within SGLang's bounds (DP attention's all-gathered counts): every rank decides alike,
    and never REFUSE for an accepted launch. Returns the violation or ''."""
    rng = random.Random(seed)
    for _ in range(20):
        counts = [rng.choice((0, rng.randrange(0, bound + 1), bound)) for _ in range(world)]
        paths = {select.decide(select.GateInputs(megamoe=True, weights_ready=True, capture=False,
                                                 global_num_tokens=counts, local_rows=counts[r],
                                                 cap=case["cap"], fallback=miss_ok)) for r in range(world)}
        if len(paths) != 1 or next(iter(paths)).path is select.Path.REFUSE:
            return f"counts {counts}: {paths}"
    return ""


def judge(env, cases, model="glm4"):
    """Every violation of the invariant, as readable lines; and (accepted, refused by the plugin, other) counts."""
    bad, counts = [], {"accepted": 0, "refused": 0, "sglang": 0, "served_by_miss_path": 0}
    for i, case in enumerate(cases):
        sa, exc = resolve(env, case, model)
        if sa is not None:
            counts["accepted"] += 1
            with override_platform(**PLATFORM[model]):
                b = L.sglang_bounds(sa)
            cap = case["cap"]
            if b.captured > cap:
                bad.append(f"ACCEPTED but a CUDA graph is captured at {b.captured} tokens per rank > cap (capture "
                           f"runs the kernel; {b.detail}): {L.describe(case)}")
            if b.largest > cap:
                if MISS_PATH[model]:
                    counts["served_by_miss_path"] += 1
                else:
                    bad.append(f"ACCEPTED but a batch reaches {b.largest} tokens per rank > cap with no miss path "
                               f"(prefill {b.prefill}, decode {b.decode}, {b.detail}): {L.describe(case)}")
            world = max(int(case["args"].get("dp_size", 1)), 2)
            why = decisions_alike(case, max(b.largest, 1), MISS_PATH[model], world, seed=i)
            if why:
                bad.append(f"ACCEPTED but ranks decide differently or refuse: {why}: {L.describe(case)}")
        elif isinstance(exc, guard.MegaMoELaunchError) or "MegaMoE" in str(exc) or "megamoe" in str(exc):
            counts["refused"] += 1
            msg = str(exc)
            if not (L.flag_named(msg) and L.one_line_each(msg)):
                bad.append(f"REFUSED without naming the flag on every line: {msg!r}: {L.describe(case)}")
        else:
            counts["sglang"] += 1  # SGLang's own refusal of an incoherent combination, not the MegaMoE check
    return bad, counts


# Each names the defect it reproduces; all were accepted by the launch check before issue 22's fix.
REGRESSIONS = [
    # 2: DP attention: the chunk is divided by dp in parallel_hook and again in the MegaMoE checks.
    {"cap": 1024, "args": dict(tp_size=8, dp_size=8, enable_dp_attention=True, chunked_prefill_size=16384,
                               max_running_requests=256)},
    # 4: PP with dynamic chunking: SGLang skips its prefill check; chunks grow towards --max-prefill-tokens.
    {"cap": 1024, "args": dict(tp_size=4, pp_size=2, enable_dynamic_chunking=True, chunked_prefill_size=1024,
                               max_running_requests=64)},
    # 4: adaptive speculative decoding grows the draft width past --speculative-num-draft-tokens at run time.
    {"cap": 256, "args": dict(tp_size=4, chunked_prefill_size=256, max_running_requests=64,
                              speculative_algorithm="EAGLE", speculative_adaptive=True, speculative_num_steps=3,
                              speculative_eagle_topk=1, speculative_num_draft_tokens=4)},
    # 4: EAGLE draft decode runs top-k rows per request, more than the draft-token count here.
    {"cap": 256, "args": dict(tp_size=4, chunked_prefill_size=256, max_running_requests=64,
                              speculative_algorithm="EAGLE", speculative_num_steps=1, speculative_eagle_topk=8,
                              speculative_num_draft_tokens=2)},
    # 4: the eager decode batch is padded to a multiple of attention TP (get_eager_max_batch_size).
    {"cap": 63, "args": dict(tp_size=4, chunked_prefill_size=60, max_running_requests=63,
                             cuda_graph_max_bs_decode=32)},
]


@pytest.mark.parametrize("model", ["glm4", "glm4_mxfp4"])
@pytest.mark.parametrize("case", REGRESSIONS, ids=["dp_chunk", "pp_dynamic", "adaptive_spec", "eagle_topk",
                                                   "eager_padding"])
def test_each_defect_configuration_is_refused_or_served(env, case, model):
    """None of these fits the cap: with the miss path (FP8) it serves their eager batches (a captured graph above the
    cap is still refused: capture runs the kernel), without (MXFP4) each is refused."""
    if case["args"].get("speculative_adaptive"):
        case = {"cap": case["cap"], "args": dict(case["args"], speculative_adaptive_config=env[2])}
    bad, counts = judge(env, [case], model)
    assert not bad, "\n".join(bad)
    if MISS_PATH[model]:  # served, or refused for its captured graph (the kernel's), naming the flag
        assert counts["served_by_miss_path"] + counts["refused"] == 1, counts
    else:
        assert counts["refused"] == 1, counts


@pytest.mark.parametrize("model,seed,n", [("glm4", 22, 120), ("glm5", 23, 40), ("glm4_mxfp4", 24, 60)])
def test_launch_space_invariant(env, model, seed, n):
    cases = L.sample(n, seed, env[2])
    bad, counts = judge(env, cases, model)
    assert not bad, f"{len(bad)} of {n} configurations break the invariant ({counts}):\n" + "\n".join(bad[:25])
    # The sample must exercise both sides of the check, or it proves nothing.
    assert counts["accepted"] >= n // 10 and counts["refused"] >= n // 20, counts
    if MISS_PATH[model]:
        assert counts["served_by_miss_path"] >= n // 10, counts
