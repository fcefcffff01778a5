"""What both SGLang-side modules of the GLM MoE path (`hooks`, `miss_hooks`) read: SGLang's modules (imported on
first use), its resolved a2a backend, the per-batch facts `select.decide` reads, and the marks a layer carries from
load (the runtime guard, the miss path's layout, a GLM-4 block's plan). Both import it; neither imports the other
for these. No SGLang at import time: the plugin registers before SGLang's model code is imported.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import glm4, select

_MODULES: dict[str, Any] = {}
_PLAN_ATTR = "_glm_ext_mega_plan"  # on a GLM-4 block: its glm4.BlockPlan, made at load
FALLBACK_ATTR = "_glm_ext_miss_fallback"  # on the FusedMoE: a guard.FALLBACKS key, or None (miss_hooks sets it)
GUARD_ATTR = "_glm_ext_megamoe_guard"  # set at load on the MoE modules of a GLM model under megamoe


def _mod(name: str) -> Any:
    """An SGLang module, imported on first use."""
    mod = _MODULES.get(name)
    if mod is None:
        mod = _MODULES[name] = importlib.import_module(name)
    return mod


def _mega() -> Any:
    return _mod("sglang.srt.layers.moe.mega_moe")


def megamoe_on() -> bool:
    return bool(_mega().get_moe_a2a_backend().is_megamoe())


def gate_inputs(experts: Any, hidden_states: Any) -> select.GateInputs:
    """The rank-identical facts `select.decide` reads, taken where SGLang's should_use_mega_moe takes them."""
    mm = _mega()
    return select.GateInputs(
        megamoe=bool(mm.get_moe_a2a_backend().is_megamoe()),
        weights_ready=bool(mm.is_mega_moe_experts_ready(experts)),
        capture=bool(mm.get_is_capture_mode()),
        global_num_tokens=mm.get_dp_global_num_tokens(),
        local_rows=int(hidden_states.shape[0]),
        cap=int(mm.envs.SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK.get()),
        use_global_num_tokens=not mm.is_dsa_enable_prefill_cp(),
        fallback=experts.__dict__.get(FALLBACK_ATTR) is not None,
    )


def block_plan(block: Any, name: str = "") -> glm4.BlockPlan:
    plan = block.__dict__.get(_PLAN_ATTR)
    if plan is None:
        topk_mod = _mod("sglang.srt.layers.moe.topk")
        plan = glm4.plan_block(
            block,
            scale_fused_in_topk=topk_mod.is_routed_scaling_factor_fused_in_topk(block.topk.topk_config),
            moe_ep_size=int(_mod("sglang.srt.runtime_context").get_parallel().moe_ep_size),
            name=name,
        )
        block.__dict__[_PLAN_ATTR] = plan
    return plan
