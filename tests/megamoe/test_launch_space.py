"""The MegaMoE launch check over the launch space (issue 22's invariant), through SGLang's real resolution.

For every GLM configuration the launch check accepts, the largest batch SGLang's own scheduler bounds allow on any
rank -- prefill and decode, draft and verify, eager and captured -- fits the kernel's per-rank cap; for every
configuration it refuses, each line of the message names what to change. The bounds come from SGLang's own sizing
code run on the resolved arguments (launch_space.sglang_bounds), not from the plugin's formulas, so a bound the
launch check models wrong (or SGLang changes) fails here.

Space: tp 1-8, DP attention, chunked-prefill size, max running requests (and unset), decode CUDA-graph sizes,
prefill CUDA graphs, EAGLE (top-k 1-8, adaptive), pipeline parallelism with and without dynamic chunking,
mixed chunks, cap 64-8192; GLM-4.x (FP8 on SM90) and GLM-5.x. Platform said to be SM90; fake deep_gemm API.
"""

from __future__ import annotations

import sys

import pytest

import sglang.srt.arg_groups.mega_moe_hook as mega_moe_hook
from sglang.srt.plugins.hook_registry import HookType, _wrap_fn
from sglang.srt.runtime_context import override_platform
from sglang.srt.server_args import ServerArgs

import fake_deep_gemm
import launch_space as L
from glm_configs import GLM4_CONFIG, write_model_dir
from sglang_glm_ext.megamoe import guard, hooks
from sglang_glm_ext.patching.ledger import resolve_original

TARGET = "sglang.srt.arg_groups.mega_moe_hook.validate_mega_moe_token_budget_for_model"
SM90 = dict(is_cuda=True, is_sm90=True, is_sm100=False, device_sm=90)
GLM5_CONFIG = dict(GLM4_CONFIG, architectures=["GlmMoeDsaForCausalLM"], model_type="deepseek_v3",
                   kv_lora_rank=64, q_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32,
                   num_key_value_heads=4)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setitem(sys.modules, "deep_gemm", fake_deep_gemm.FakeDeepGemm())
    for name in guard.RETIRED_ENV:
        mp.delenv(name, raising=False)
    mp.setattr(mega_moe_hook, "validate_mega_moe_token_budget_for_model",
               _wrap_fn(resolve_original(TARGET), hooks.hook_token_budget, HookType.AROUND))
    tmp = tmp_path_factory.mktemp("space")
    models = {"glm4": write_model_dir(tmp / "glm4", GLM4_CONFIG), "glm5": write_model_dir(tmp / "glm5", GLM5_CONFIG)}
    adaptive = L.write_adaptive_config(tmp / "adaptive.json")
    yield mp, models, adaptive
    mp.undo()


def resolve(env, case, model="glm4"):
    """(ServerArgs, None) when the launch is accepted, (None, exc) when refused."""
    mp, models, _ = env
    mp.setenv("SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK", str(case["cap"]))
    args = dict(model_path=models[model], moe_a2a_backend="megamoe", device="cuda", skip_tokenizer_init=True)
    args.update(case["args"])
    with override_platform(**SM90):
        sa = ServerArgs(**args)
        try:
            sa.resolve_once()
        except (ValueError, SystemExit) as exc:
            return None, exc
        return sa, None


def judge(env, cases, model="glm4"):
    """Every violation of the invariant, as readable lines; and (accepted, refused by the plugin, other) counts."""
    bad, counts = [], {"accepted": 0, "refused": 0, "sglang": 0}
    for case in cases:
        sa, exc = resolve(env, case, model)
        if sa is not None:
            counts["accepted"] += 1
            with override_platform(**SM90):
                b = L.sglang_bounds(sa)
            if b.largest > case["cap"]:
                bad.append(f"ACCEPTED but a batch reaches {b.largest} tokens per rank > cap (prefill {b.prefill}, "
                           f"decode {b.decode}, {b.detail}): {L.describe(case)}")
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


@pytest.mark.parametrize("case", REGRESSIONS, ids=["dp_chunk", "pp_dynamic", "adaptive_spec", "eagle_topk",
                                                   "eager_padding"])
def test_each_defect_configuration_is_refused_or_fits(env, case, tmp_path):
    if case["args"].get("speculative_adaptive"):
        case = {"cap": case["cap"], "args": dict(case["args"], speculative_adaptive_config=env[2])}
    bad, counts = judge(env, [case])
    assert not bad, "\n".join(bad)
    assert counts["refused"] == 1, counts  # none of these fits: each must be refused, naming the flag


@pytest.mark.parametrize("model,seed,n", [("glm4", 22, 160), ("glm5", 23, 40)])
def test_launch_space_invariant(env, model, seed, n):
    cases = L.sample(n, seed, env[2])
    bad, counts = judge(env, cases, model)
    assert not bad, f"{len(bad)} of {n} configurations break the invariant ({counts}):\n" + "\n".join(bad[:25])
    # The sample must exercise both sides of the check, or it proves nothing.
    assert counts["accepted"] >= n // 10 and counts["refused"] >= n // 10, counts
