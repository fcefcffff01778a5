"""The thin SGLang side of megamoe's GLM MoE layers: its hooks, declared in megamoe/patches.py (`megamoe.*`).

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
  every GLM-4 block plans; else the launch stops with the layer names. GLM-5 layers bound to TRTLLM's bypassed
  routing get standard routing (the MegaMoE path reads topk_ids); FP4 MegaMoE layers are marked so SGLang refuses
  online weight updates before writing (weight_update.py).
- `hook_compat` / `hook_resolve_once`: SGLang's own megamoe refusal and the plugin's as one line each; a
  command-line launch exits with them, no traceback.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import Any, Callable, Optional

import torch

from . import glm4, guard, routing, select
from .miss_hooks import forward_miss_glm4, prepare_fallback
# What the miss path reads as well lives in `reads`; FALLBACK_ATTR stays importable from here.
from .reads import _PLAN_ATTR, FALLBACK_ATTR, GUARD_ATTR, _mega, _mod, block_plan, gate_inputs, megamoe_on  # noqa: F401

logger = logging.getLogger("sglang_glm_ext")


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
    """AROUND Glm4MoeSparseMoeBlock.forward. Under megamoe: the MegaMoE kernel, the gathered miss path
    (miss_hooks) for a batch the kernel cannot take, or MegaMoEMissError for a layer that keeps no layout for it;
    never SGLang's stock paths (wrong there for ep > 1). Otherwise `original`, untouched."""
    if not megamoe_on():
        return original(self, hidden_states, forward_batch, *args, **kwargs)
    inputs = gate_inputs(self.experts, hidden_states)
    decision = select.decide(inputs)
    if decision.path is select.Path.MISS:
        return forward_miss_glm4(self, hidden_states, decision)
    if not decision.mega:
        raise select.MegaMoEMissError(select.miss_message(f"GLM-4 MoE layer {self.layer_id}", decision, inputs.cap))
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
    mm = _mega()

    def routed():  # every rank calls the kernel, with 0 rows too: it is a collective over the EP group
        return mm.run_mega_routed_experts(
            block.experts, hidden_states, kr.topk_ids, kr.topk_weights, **glm4.runner_kwargs(plan, kr))

    # The replicated expert on this rank's own rows, added to the kernel's complete rows: the layer boundary owes
    # no sum. Under CUDA-graph capture with the block's alternate stream it overlaps the kernel, as SGLang's
    # DeepSeek MegaMoE path does (mega_moe.py:217-245): measured on an H200, 2.1-4.2 % of the block at 64-256
    # tokens, bit-identical output (docs_internal/megamoe.md section 3).
    shared = (lambda: block.shared_experts(hidden_states)) if plan.has_separate_shared and num_tokens > 0 else None
    overlap = shared is not None and block.alt_stream is not None and bool(mm.get_is_capture_mode())
    return glm4.routed_plus_shared(routed, shared, block.alt_stream if overlap else None)


# ---------------------------------------------------------------- GLM-5.x (DeepseekV2MoE)

def hook_should_use_mega_moe(original: Callable, moe, hidden_states, *args, **kwargs):
    """AROUND layers.moe.mega_moe.should_use_mega_moe. For a GLM model's layer under megamoe a "no" would send
    DeepseekV2MoE.forward to forward_normal, wrong there for tp > 1: raise on every rank instead."""
    result = original(moe, hidden_states, *args, **kwargs)
    if result or not getattr(moe, GUARD_ATTR, False) or not megamoe_on():
        return result
    inputs = gate_inputs(moe.experts, hidden_states)
    decision = select.decide(inputs)
    if decision.path is not select.Path.REFUSE:  # a miss is taken before (miss_hooks.hook_dsv2_forward); SGLang
        # said no for a reason of its own (e.g. ROCm): still not the stock path
        decision = select.Decision(select.Path.REFUSE, decision.tokens_per_rank, "SGLang's MegaMoE gate declined")
    raise select.MegaMoEMissError(select.miss_message(f"GLM MoE layer {getattr(moe, 'layer_id', '?')}", decision,
                                                      inputs.cap))


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


def budget_facts(server_args: Any, cfg: Any, cap: int, *, miss_path: bool = False) -> guard.BudgetFacts:
    """The facts `guard.budget_problems` reads, from SGLang's resolving view (the hook runs after speculative
    resolution, so draft widths are final) and SGLang's own helpers for the two bounds it computes itself: the
    prefill ceiling (`overrides.max_prefill_buffer_tokens`, PP dynamic chunking included) and the largest draft
    width (`overrides.max_speculative_num_draft_tokens`, adaptive speculative decoding included)."""
    ov = _mod("sglang.srt.arg_groups.overrides")
    rc = _mod("sglang.srt.runtime_context")
    graphs = cfg.cuda_graph_config
    prefill_bs: tuple[int, ...] = ()
    decode_bs: tuple[int, ...] = ()
    if graphs is not None and str(getattr(graphs.prefill, "backend", "disabled")) != "disabled":
        prefill_bs = tuple(int(b) for b in (graphs.prefill.bs or ()))
    if graphs is not None and str(getattr(graphs.decode, "backend", "disabled")) != "disabled":
        decode_bs = tuple(int(b) for b in (graphs.decode.bs or ()))
    algo = cfg.speculative_algorithm
    max_draft = static_draft = 1
    frozen = False
    if algo:
        static_draft = int(cfg.speculative_num_draft_tokens or 1)
        max_draft = int(ov.max_speculative_num_draft_tokens(server_args) or static_draft)
        try:
            frozen = bool(_mod("sglang.srt.speculative.spec_info").SpeculativeAlgorithm.from_string(
                algo).is_frozen_kv_mtp())
        except Exception:  # an algorithm name this SGLang does not know: its own resolution refuses it
            frozen = False
    dp = int(cfg.attn_dp_size or 1) if rc.attn_dp_enabled_of(cfg) else 1
    chunk = cfg.chunked_prefill_size
    asked = getattr(server_args, "chunked_prefill_size", None)  # the record keeps the operator's input
    return guard.BudgetFacts(
        cap=cap,
        disaggregation_mode=str(cfg.disaggregation_mode),
        chunked_prefill_size=chunk,
        chunk_asked=asked if asked is not None else (chunk * dp if chunk else chunk),
        prefill_ceiling=int(ov.max_prefill_buffer_tokens(server_args) or 0) if chunk and chunk > 0 else 0,
        dynamic_chunking=bool(cfg.enable_dynamic_chunking and int(cfg.pp_size or 1) > 1),
        max_prefill_tokens=cfg.max_prefill_tokens,
        prefill_graph_bs=prefill_bs,
        enable_prefill_cp=bool(getattr(cfg, "enable_prefill_cp", False)),
        attn_cp_size=int(getattr(cfg, "attn_cp_size", 1) or 1),
        tp_size=int(cfg.tp_size),
        attn_tp_size=int(rc.attn_tp_size_of(cfg)),
        attn_dp_size=dp,
        max_running_requests=cfg.max_running_requests,
        speculative=str(algo) if algo else None,
        num_draft_tokens=max_draft,
        static_draft_tokens=static_draft,
        eagle_topk=int(cfg.speculative_eagle_topk or 1) if algo else 1,
        num_steps=int(cfg.speculative_num_steps or 0) if algo else 0,
        multi_layer_eagle=bool(getattr(cfg, "enable_multi_layer_eagle", False)),
        frozen_kv_mtp=frozen,
        decode_graph_bs=decode_bs,
        miss_path=miss_path,
    )


def keeps_trtllm(cfg: Any, sm: Optional[int]) -> bool:
    """Whether ModelOpt NVFP4 experts keep FlashInfer's TRTLLM layout under megamoe here (fp4_hooks): the opt-out
    is off and the runner the layer would get is TRTLLM (auto on SM100, or asked for)."""
    from .feature import FP4_KEEP_TRTLLM

    runner = str(getattr(cfg, "moe_runner_backend", "auto") or "auto")
    return (FP4_KEEP_TRTLLM.get_bool() and sm is not None and sm // 10 == 10
            and runner in ("auto", "flashinfer_trtllm", "flashinfer_trtllm_routed"))


def launch_facts(server_args: Any, cfg: Any, model_config: Any, arch: str, *, sm: Optional[int], api: frozenset,
                 api_error: str, cap: int) -> tuple[guard.LaunchFacts, list[str]]:
    """The launch's facts (budget problems included) and the startup notes of what the miss path serves."""
    hf_config = model_config.hf_config
    text_config = getattr(hf_config, "text_config", None) or hf_config
    facts = guard.LaunchFacts(
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
        ep_num_redundant_experts=int(getattr(cfg, "ep_num_redundant_experts", 0) or 0),
        keep_trtllm=keeps_trtllm(cfg, sm),
    )
    miss_ok = guard.miss_path_available(facts)
    budget = guard.budget_check(budget_facts(server_args, cfg, cap, miss_path=miss_ok))
    problems = list(budget.problems)
    if problems and not miss_ok and sm is not None:
        quant = guard.classify_experts(facts.quantization, facts.hf_quant_config)
        problems.append("the gathered miss path cannot serve those batches instead: "
                        + guard.no_fallback_why(quant, sm))
    facts = dataclasses.replace(facts, budget=tuple(problems))
    return facts, guard.served_notes(facts, budget.served)


def hook_token_budget(original: Callable, server_args, *args, **kwargs):
    """AROUND arg_groups.mega_moe_hook.validate_mega_moe_token_budget_for_model (runs after speculative
    resolution, so draft-token counts are final). Invariant: a GLM launch under megamoe passes only when every
    batch of every layer can take the MegaMoE kernel; anything else is one MegaMoELaunchError, a line per reason.

    For GLM models SGLang's own budget check (which runs here only for NVFP4 checkpoints) is superseded by
    `guard.budget_problems`: it divides a DP-attention chunk by dp a second time, skips PP dynamic chunking, and
    bounds decode by the graph bucket alone (no eager padding, no adaptive or top-k draft width)."""
    retired = retired_env()
    ov = _mod("sglang.srt.arg_groups.overrides")
    cfg = ov.resolving_view(server_args)
    if cfg.moe_a2a_backend != "megamoe":
        if retired:
            raise guard.MegaMoELaunchError(guard.retired_message(retired))
        return original(server_args, *args, **kwargs)
    mh = _mod("sglang.srt.arg_groups.mega_moe_hook")
    arch = None
    if not cfg.encoder_only and mh.parse_connector_type(cfg.model_path) != mh.ConnectorType.INSTANCE:
        model_config = ov.model_config_of(server_args)
        arch = model_config.hf_config.architectures[0]
    if arch not in guard.GLM_ARCHS:
        return original(server_args, *args, **kwargs)
    sglang_said = ""
    try:
        original(server_args, *args, **kwargs)
    except ValueError as exc:  # SGLang's own budget check (NVFP4): kept only if the plugin's finds nothing
        sglang_said = " ".join(str(exc).split())
    cap = int(mh.envs.SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK.get())
    sm = _platform_sm()
    api, api_error = _probe_api() if sm is not None else (frozenset(), "")
    facts, served = launch_facts(server_args, cfg, model_config, arch, sm=sm, api=api, api_error=api_error, cap=cap)
    problems = guard.check_launch(facts)
    if sglang_said and not problems and not served:
        problems.append(sglang_said)  # SGLang's own (NVFP4) budget refusal, unless the miss path serves it
    if problems:
        raise guard.MegaMoELaunchError(guard.launch_message(arch, problems))
    logger.info("sglang-glm-ext megamoe: %s passes the MegaMoE launch checks (cap %d tokens per rank)", arch, cap)
    for note in served:
        logger.info("sglang-glm-ext megamoe: %s: %s", arch, note)
    return None


def hook_compat(original: Callable, server_args, *args, **kwargs):
    """AROUND arg_groups.mega_moe_hook.check_mega_moe_compat: SGLang's own refusal of a megamoe launch (no SM90 /
    SM100 GPU here, or two-batch / single-batch overlap) as the plugin's one line naming the fix, not a bare
    ValueError deep in a traceback."""
    try:
        return original(server_args, *args, **kwargs)
    except ValueError as exc:
        text = " ".join(str(exc).split())
        if "needs a CUDA SM90 GPU" in text:
            sm = _platform_sm()
            here = f"this machine's GPU is SM{sm}" if sm else "this machine has no CUDA GPU"
            text = (f"--moe-a2a-backend megamoe runs DeepGEMM's MegaMoE kernels, which need an SM90 GPU (block-FP8 "
                    f"experts) or an SM100-class GPU (FP4 experts), and {here}; drop --moe-a2a-backend megamoe (or "
                    "--moe-runner-backend megamoe) here, or launch on such a GPU")
        raise guard.MegaMoELaunchError(f"{guard.PREFIX}: {text}") from None


def hook_resolve_once(original: Callable, self, *args, **kwargs):
    """AROUND ServerArgs.resolve_once, where every MegaMoE launch check runs (SGLang's resolution pipeline). A
    command-line launch (`launch_server`, `sglang serve`: the record carries its argv in `_launch_command`) that
    the checks refuse exits with their lines and no traceback, as the plugin's other launch refusals do; Python
    callers (`Engine(...)`, a bare ServerArgs) keep the MegaMoELaunchError, a ValueError."""
    try:
        return original(self, *args, **kwargs)
    except guard.MegaMoELaunchError as exc:
        command = getattr(self, "_launch_command", None)
        if command and not str(command).startswith("Engine("):
            raise SystemExit(str(exc)) from None
        raise


def _moe_classes() -> tuple[Optional[type], Optional[type]]:
    glm = sys.modules.get("sglang.srt.models.glm4_moe")
    dsv2 = sys.modules.get("sglang.srt.models.deepseek_v2")
    return (getattr(glm, "Glm4MoeSparseMoeBlock", None), getattr(dsv2, "DeepseekV2MoE", None))


def materialise_bypassed_routing(moe: Any, name: str = "") -> bool:
    """GLM-5.x's DeepseekV2MoE under megamoe: SGLang's MegaMoE path reads `topk_output.topk_ids`
    (layers/moe/mega_moe.py:376-383), but when the experts' runner is FlashInfer TRTLLM (ModelOpt NVFP4 with the
    runner on auto, modelopt_quant.py:3117-3125) TopK was bound to return its BYPASSED form (topk.py:793-804: GLM's
    grouped, biased, renormalised routing is bypassable), which has none: the first forward (warm-up or graph
    capture) raised AttributeError. Make that layer's TopK return standard routing, computed by the same
    `select_experts` that `BypassedTopKOutput.to_standard` would call. True when it changed a layer."""
    topk = getattr(moe, "topk", None)
    config = getattr(topk, "topk_config", None)
    if config is None:
        return False
    topk_mod = _mod("sglang.srt.layers.moe.topk")
    if config.output_format != topk_mod.TopKOutputFormat.BYPASSED:
        return False
    config.output_format = topk_mod.TopKOutputFormat.STANDARD
    logger.info("sglang-glm-ext megamoe: %s: TopK returns standard routing for the MegaMoE kernel (it was bound "
                "to FlashInfer TRTLLM's bypassed routing)", name or f"layer {getattr(moe, 'layer_id', '?')}")
    return True


def _batches_above_cap() -> bool:
    """Whether this launch's scheduler bounds let an eager batch exceed the cap (the launch check's own bound, on
    the published arguments), so that every layer must keep a layout for the miss path."""
    try:
        rc = _mod("sglang.srt.runtime_context")
        sa = rc.get_server_args()
        cfg = _mod("sglang.srt.arg_groups.overrides").resolving_view(sa)
        cap = int(_mega().envs.SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK.get())
        return bool(guard.budget_check(budget_facts(sa, cfg, cap, miss_path=True)).served)
    except Exception:  # nothing published (a unit test's bare model): only readiness decides
        return False


def check_loaded_model(model: Any, arch: str) -> list[str]:
    """Mark a GLM model's MoE modules for the runtime guard, record each one's miss-path layout, and list the
    layers that can serve neither the kernel nor the miss path."""
    glm_block, dsv2_moe = _moe_classes()
    mm = _mega()
    problems = []
    always_miss, kinds = [], {}
    above_cap = None
    for name, module in model.named_modules():
        is_glm4 = glm_block is not None and isinstance(module, glm_block)
        if not (is_glm4 or (dsv2_moe is not None and isinstance(module, dsv2_moe))):
            continue
        module.__dict__[GUARD_ATTR] = True
        if not is_glm4:
            materialise_bypassed_routing(module, name)
        if is_glm4:
            module.__dict__.pop(_PLAN_ATTR, None)
            try:
                block_plan(module, name)
            except glm4.PlanError as exc:
                problems.append(str(exc))
        experts = module.experts
        kind = prepare_fallback(experts, module)
        kinds[kind] = kinds.get(kind, 0) + 1
        if not mm.is_mega_moe_experts_ready(experts):
            if kind is not None:
                always_miss.append(name)
                continue
            sm = int(getattr(mm, "_device_sm", 0) or 0)
            dg_api, _ = _probe_api()
            problems.append(f"{name}: " + guard.not_ready_reason(
                built=bool(getattr(experts, "_mega_moe_weights_built", False)), sm=sm,
                sm90_fp8_weights=bool(getattr(experts, "_mega_moe_sm90_fp8_weights", False)),
                has_sm90_api={"fp8_mega_moe", "mega_moe_pre_dispatch_sm90"} <= dg_api,
                quant_method=type(getattr(experts, "quant_method", None)).__name__)
                + ", and it keeps no layout the miss path runs; use another --moe-a2a-backend")
        elif kind is None:
            above_cap = _batches_above_cap() if above_cap is None else above_cap
            if above_cap:
                problems.append(f"{name}: batches above SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK can "
                                "reach this layer and its MegaMoE-only layout keeps nothing the miss path runs; "
                                "lower the launch's batch bounds to the cap (the launch check names them)")
    if always_miss:
        logger.info("sglang-glm-ext megamoe: %d MoE layer(s) take the gathered miss path on every batch (MegaMoE "
                    "cannot read their experts on this GPU): %s", len(always_miss),
                    ", ".join(always_miss[:4]) + (" ..." if len(always_miss) > 4 else ""))
    if kinds:
        logger.info("sglang-glm-ext megamoe: miss-path layouts of the MoE layers: %s",
                    ", ".join(f"{k or 'none (kernel only)'} x{v}" for k, v in kinds.items()))
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
    from .miss import COUNTERS
    from .weight_update import mark_refused_layers

    if getattr(getattr(runner, "server_args", None), "enable_metrics", False):
        COUNTERS.attach_prometheus()

    refused = mark_refused_layers(runner.model)
    if refused:
        logger.info("sglang-glm-ext megamoe: %d MoE layer(s) hold an FP4 MegaMoE layout; online weight updates "
                    "will be refused (restart on the new checkpoint instead)", len(refused))
    if problems:
        shown = problems[:8] + ([f"... and {len(problems) - 8} more"] if len(problems) > 8 else [])
        raise guard.MegaMoELaunchError(guard.launch_message(arch, shown))
    return None
