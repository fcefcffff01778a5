"""The thin SGLang side of megamoe's GLM MoE layers: five hooks, declared in megamoe/patches.py (`megamoe.*`).

Active only when SGLang's own a2a backend is megamoe (`get_moe_a2a_backend().is_megamoe()`, or the resolved
`moe_a2a_backend` at argument resolution); otherwise every hook calls SGLang's code and changes nothing. The hooks
ask SGLang's resolved backend rather than `FEATURE.is_active()`: it is the value SGLang's own MoE branches read,
so the hooks and SGLang cannot disagree about a layer (after resolution the two answer alike).

- `hook_glm4_init` (after `Glm4MoeSparseMoeBlock.__init__`): rebuild the separate shared expert replicated
  (parallel_group="replicated"), as DeepSeek-V2 does under megamoe (deepseek_v2.py:874-896); 0.5.23 leaves it
  TP-sharded, and nothing would sum its shards.
- `hook_glm4_forward` (around `Glm4MoeSparseMoeBlock.forward`): the GLM-4.x fast path, ahead of SGLang's
  DeepEP/normal selection: gate -> TopK (bypassed routing materialised) -> `run_mega_routed_experts` -> + the
  replicated shared expert, no all-reduce. A batch the kernel cannot take raises `MegaMoEMissError` on every
  rank; the stock path never runs under megamoe (on SM90 FP8 its weights are interleaved in place anyway).
- `hook_should_use_mega_moe` (around `layers.moe.mega_moe.should_use_mega_moe`): for GLM-5.x's DeepseekV2MoE
  layers (marked at load), a "no" under megamoe raises instead of falling back to `forward_normal`.
- `hook_token_budget` (around `arg_groups.mega_moe_hook.validate_mega_moe_token_budget_for_model`): GLM
  launches get SGLang's own token-budget check (its list covers other architectures) plus the refusals in
  `guard`, before serving.
- `hook_load_check` (after `ModelRunner.load_model`): every GLM MoE layer has MegaMoE weights this GPU runs, and
  every GLM-4 block plans; else the launch stops with the layer names.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Any, Callable, Optional

import torch

from . import glm4, guard, routing, select

logger = logging.getLogger("sglang_glm_ext")

_MODULES: dict[str, Any] = {}
_PLAN_ATTR = "_glm_ext_mega_plan"
GUARD_ATTR = "_glm_ext_megamoe_guard"  # set at load on the MoE modules of a GLM model under megamoe


def _mod(name: str) -> Any:
    """An SGLang module, imported on first use: the plugin registers before SGLang's model code is imported."""
    mod = _MODULES.get(name)
    if mod is None:
        mod = _MODULES[name] = importlib.import_module(name)
    return mod


def _mega() -> Any:
    return _mod("sglang.srt.layers.moe.mega_moe")


def megamoe_on() -> bool:
    return bool(_mega().get_moe_a2a_backend().is_megamoe())


# ---------------------------------------------------------------- per-batch decision

def gate_inputs(experts: Any, hidden_states: torch.Tensor) -> select.GateInputs:
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


# ---------------------------------------------------------------- GLM-4.x block

def hook_glm4_init(result, self, config, layer_id, quant_config=None, prefix="", alt_stream=None, *args, **kwargs):
    """AFTER Glm4MoeSparseMoeBlock.__init__. Invariant: under megamoe a separate shared expert is replicated
    (full weights on every rank), so the hook can add it to the kernel's complete rows without a reduction."""
    if not megamoe_on():
        return None
    shared = getattr(self, "shared_experts", None)
    if shared is None or getattr(shared, "is_replicated", False):
        return None
    gm = _mod("sglang.srt.models.glm4_moe")
    self.shared_experts = gm.Glm4MoeMLP(
        hidden_size=config.hidden_size,
        intermediate_size=config.moe_intermediate_size * config.n_shared_experts,
        hidden_act=config.hidden_act,
        quant_config=quant_config,
        reduce_results=False,
        prefix=gm.add_prefix("shared_experts", prefix),
        parallel_group="replicated",
    )
    return None


def hook_glm4_forward(original: Callable, self, hidden_states: torch.Tensor, forward_batch=None, *args, **kwargs):
    """AROUND Glm4MoeSparseMoeBlock.forward. Under megamoe: the MegaMoE kernel or MegaMoEMissError, never
    SGLang's stock paths; otherwise `original`, untouched."""
    if not megamoe_on():
        return original(self, hidden_states, forward_batch, *args, **kwargs)
    decision = select.decide(gate_inputs(self.experts, hidden_states))
    if not decision.mega:
        raise select.MegaMoEMissError(select.miss_message(f"GLM-4 MoE layer {self.layer_id}", decision))
    return forward_mega(self, hidden_states)


def forward_mega(block: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """One GLM-4 MoE block on this rank's rows through the MegaMoE kernel; the rows come back complete."""
    plan = block_plan(block)
    num_tokens = int(hidden_states.shape[0])
    ids = weights = None
    if num_tokens > 0:
        topk_mod = _mod("sglang.srt.layers.moe.topk")
        router_logits = block.gate(hidden_states)
        topk_output = block.topk(hidden_states, router_logits)
        if topk_mod.TopKOutputChecker.format_is_bypassed(topk_output):
            topk_output = topk_output.to_standard(block.layer_id)
        if not topk_mod.TopKOutputChecker.format_is_standard(topk_output):
            raise routing.RoutingError(f"{plan.layer}: TopK returned {topk_output.format}, which carries no "
                                       "expert ids for the MegaMoE kernel")
        ids, weights = topk_output.topk_ids, topk_output.topk_weights
    kr = routing.kernel_routing(
        ids, weights, num_tokens=num_tokens, top_k=plan.top_k, num_experts=plan.num_experts,
        routed_scaling_factor=plan.routed_scaling_factor, scale_fused_in_topk=plan.scale_fused_in_topk,
        device=hidden_states.device,
    )
    shared = block.shared_experts(hidden_states) if plan.has_separate_shared and num_tokens > 0 else None
    # Every rank calls the kernel, with 0 rows too: it is a collective over the EP group.
    y = _mega().run_mega_routed_experts(
        block.experts, hidden_states, kr.topk_ids, kr.topk_weights, **glm4.runner_kwargs(plan, kr))
    if shared is not None:
        y.add_(shared)  # replicated expert on this rank's own rows: the layer boundary owes no sum (complete)
    return y


# ---------------------------------------------------------------- GLM-5.x (DeepseekV2MoE)

def hook_should_use_mega_moe(original: Callable, moe, hidden_states, *args, **kwargs):
    """AROUND layers.moe.mega_moe.should_use_mega_moe. For a GLM model's layer under megamoe a "no" would send
    DeepseekV2MoE.forward to forward_normal, wrong there for tp > 1: raise on every rank instead."""
    result = original(moe, hidden_states, *args, **kwargs)
    if result or not getattr(moe, GUARD_ATTR, False) or not megamoe_on():
        return result
    decision = select.decide(gate_inputs(moe.experts, hidden_states))
    if decision.mega:  # SGLang said no for a reason of its own (e.g. ROCm); still not the stock path
        decision = select.Decision(select.Path.REFUSE, decision.tokens_per_rank, "SGLang's MegaMoE gate declined")
    raise select.MegaMoEMissError(select.miss_message(f"GLM MoE layer {getattr(moe, 'layer_id', '?')}", decision))


# ---------------------------------------------------------------- startup

def _platform_sm() -> Optional[int]:
    platform = _mod("sglang.srt.runtime_context").get_platform()
    try:
        if not platform.is_cuda:
            return None
        sm = int(platform.device_sm)
    except Exception:  # no device: SGLang's probe may raise instead of answering
        return None
    return sm or None


def _probe_api() -> tuple[frozenset, str]:
    from .hardware import probe_deep_gemm

    probe = probe_deep_gemm()
    return probe.api, probe.error


def retired_env() -> dict[str, str]:
    return {n: os.environ[n] for n in guard.RETIRED_ENV if os.environ.get(n, "") not in ("", "0")}


def launch_facts(cfg: Any, model_config: Any, arch: str, *, sm: Optional[int], api: frozenset, api_error: str,
                 cap: int) -> guard.LaunchFacts:
    tokens_per_request = (cfg.speculative_num_draft_tokens or 1) if cfg.speculative_algorithm else 1
    hf_config = model_config.hf_config
    text_config = getattr(hf_config, "text_config", None) or hf_config
    return guard.LaunchFacts(
        arch=arch,
        quantization=cfg.quantization,
        hf_quant_config=model_config.hf_quant_config or {},
        sm=sm,
        num_hidden_layers=int(getattr(text_config, "num_hidden_layers", 0) or 0),
        speculative=bool(cfg.speculative_algorithm),
        enable_w4a4_mxfp4_megamoe=bool(getattr(cfg, "enable_w4a4_mxfp4_megamoe", False)),
        cap=cap,
        deep_gemm_api=api,
        deep_gemm_error=api_error,
        retired_env=retired_env(),
        decode=tuple(guard.decode_problems(
            cap=cap, max_running_requests=cfg.max_running_requests, attn_dp_size=int(cfg.attn_dp_size or 1),
            tp_size=int(cfg.tp_size), tokens_per_request=int(tokens_per_request),
            disaggregation_mode=str(cfg.disaggregation_mode), enable_mixed_chunk=bool(cfg.enable_mixed_chunk),
            chunked_prefill_size=cfg.chunked_prefill_size,
        )),
    )


def hook_token_budget(original: Callable, server_args, *args, **kwargs):
    """AROUND arg_groups.mega_moe_hook.validate_mega_moe_token_budget_for_model (runs after speculative
    resolution, so draft-token counts are final). Invariant: a GLM launch under megamoe passes only when every
    batch of every layer can take the MegaMoE kernel; anything else is one MegaMoELaunchError listing why."""
    original(server_args, *args, **kwargs)
    retired = retired_env()
    ov = _mod("sglang.srt.arg_groups.overrides")
    cfg = ov.resolving_view(server_args)
    if cfg.moe_a2a_backend != "megamoe":
        if retired:
            raise guard.MegaMoELaunchError(guard.launch_message("this launch", [
                f"{n}={v!r} is retired and does nothing in SGLang 0.5.23; use {guard.RETIRED_ENV[n]}"
                for n, v in retired.items()]))
        return None
    if cfg.encoder_only:
        return None
    mh = _mod("sglang.srt.arg_groups.mega_moe_hook")
    if mh.parse_connector_type(cfg.model_path) == mh.ConnectorType.INSTANCE:
        return None
    model_config = ov.model_config_of(server_args)
    arch = model_config.hf_config.architectures[0]
    if arch not in guard.GLM_ARCHS:
        return None
    cap = int(mh.envs.SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK.get())
    sm = _platform_sm()
    api, api_error = _probe_api() if sm is not None else (frozenset(), "")
    problems = guard.check_launch(launch_facts(cfg, model_config, arch, sm=sm, api=api, api_error=api_error,
                                               cap=cap))
    if arch not in guard.GLM_NO_MEGAMOE_ARCHS and not mh.mega_moe_needs_token_budget(
            arch, model_config.hf_quant_config or {}, cfg.quantization):
        # SGLang's own check, for a GLM model it does not list (it already ran above for those it does).
        try:
            mh.validate_mega_moe_token_budget(server_args, arch)
        except ValueError as exc:
            problems.append(str(exc))
    if problems:
        raise guard.MegaMoELaunchError(guard.launch_message(arch, problems))
    logger.info("sglang-glm-ext megamoe: %s passes the MegaMoE launch checks (cap %d tokens per rank)", arch, cap)
    return None


def _moe_classes() -> tuple[Optional[type], Optional[type]]:
    glm = sys.modules.get("sglang.srt.models.glm4_moe")
    dsv2 = sys.modules.get("sglang.srt.models.deepseek_v2")
    return (getattr(glm, "Glm4MoeSparseMoeBlock", None), getattr(dsv2, "DeepseekV2MoE", None))


def check_loaded_model(model: Any, arch: str) -> list[str]:
    """Mark a GLM model's MoE modules for the runtime guard and list the layers that cannot take MegaMoE."""
    glm_block, dsv2_moe = _moe_classes()
    mm = _mega()
    problems = []
    for name, module in model.named_modules():
        is_glm4 = glm_block is not None and isinstance(module, glm_block)
        if not (is_glm4 or (dsv2_moe is not None and isinstance(module, dsv2_moe))):
            continue
        module.__dict__[GUARD_ATTR] = True
        if is_glm4:
            module.__dict__.pop(_PLAN_ATTR, None)
            try:
                block_plan(module, name)
            except glm4.PlanError as exc:
                problems.append(str(exc))
        experts = module.experts
        if not mm.is_mega_moe_experts_ready(experts):
            sm = int(getattr(mm, "_device_sm", 0) or 0)
            dg_api, _ = _probe_api()
            problems.append(f"{name}: " + guard.not_ready_reason(
                built=bool(getattr(experts, "_mega_moe_weights_built", False)), sm=sm,
                sm90_fp8_weights=bool(getattr(experts, "_mega_moe_sm90_fp8_weights", False)),
                has_sm90_api={"fp8_mega_moe", "mega_moe_pre_dispatch_sm90"} <= dg_api,
                quant_method=type(getattr(experts, "quant_method", None)).__name__))
    return problems


def hook_load_check(result, runner, *args, **kwargs):
    """AFTER ModelRunner.load_model (weights loaded and post-processed). Invariant: serving starts only when
    every MoE layer of a GLM model under megamoe has ready MegaMoE weights (so every rank takes the kernel)."""
    if not megamoe_on():
        return None
    arch = (getattr(runner.model_config.hf_config, "architectures", None) or [""])[0]
    if arch not in guard.GLM_ARCHS:
        return None
    problems = check_loaded_model(runner.model, arch)
    if problems:
        shown = problems[:8] + ([f"... and {len(problems) - 8} more"] if len(problems) > 8 else [])
        raise guard.MegaMoELaunchError(guard.launch_message(arch, shown))
    return None
