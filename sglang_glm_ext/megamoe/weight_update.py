"""Weight updates under megamoe: the layout MegaMoE's kernel reads stays right, or the update is refused.

What SGLang 0.5.23 does on a weight update (RL loops call these constantly): `update_weights_from_disk` restores,
loads and post-processes (model_runner_components/weight_updater.py:216-219); `update_weights_from_tensor` and
`update_weights_from_distributed` load between `begin_weight_update` (restore) and `end_weight_update`
(post-process); `load_weights_from_distributed` itself does neither (:324-341), `update_weights_from_ipc`
post-processes through the checkpoint engine's hook. Every checkpoint-format write lands in FusedMoE's loader,
which copies the gate (w1) / up (w3) rows into w13 in place (layers/moe/fused_moe_triton/layer.py `_load_w13`,
~862-880).

- SM90 block-FP8: SGLang's MegaMoE builder interleaved w13 in place at load (layers/moe/mega_moe_sm90.py:137-149)
  and returns early on every later post-process (:98-99); the restore hook is the base class's no-op
  (layers/quantization/base_config.py:49-54). So a loader write puts plain rows into the interleaved tensor and
  the kernel reads gate and up mixed. Here (`hook_weight_loader_impl`, around `_weight_loader_impl`, the one
  per-expert write path; and `hook_weight_loader_fused` for fused all-expert checkpoints) the written experts
  are de-interleaved in place, the loader writes, and they are interleaved again, in the same storage the
  kernel's weight tuples view. Right after every loader call, whatever the update path, no post-process needed,
  and only for the experts written (a gate-only write keeps that expert's up rows, since nothing was lost).
  Scales stay in [gate; up] order (the builder never touches them), so they need nothing.
- FP4 MegaMoE layouts (NVFP4 on the kept TRTLLM layout or 0.5.23's repack, MXFP4): SGLang's loaders write
  checkpoint rows into the kernel's (or TRTLLM's) shuffled, packed tensors, and the post-processing that built
  them does not run again (the NVFP4 TRTLLM preparation re-run would shuffle the experts not written a second
  time). That cannot be made right in place, so such layers carry SGLang's own refusal marker
  (`_derived_weight_cache_error`, set at load by `mark_refused_layers`): every update entry point returns
  (False, why) before it writes anything, on every rank alike; the loader hook raises for a write that reaches
  such a layer another way (a custom loader).
- `load_format="direct"` copies tensors verbatim into parameters: into an interleaved w13 that would be the
  caller's bytes in an unknown row order, so it is refused for those parameters (send checkpoint names).

EPLB (eplb/expert_location_updater.py:277-290, 507-515) moves whole physical experts: each expert's slice of every
parameter `get_moe_weights` lists (w13 with its interleave, the scales) is copied as a unit in place, so the
layout stays right per expert and the kernel's views see the move (tests/megamoe/test_weight_update.py).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from . import guard, sm90_fp8

logger = logging.getLogger("sglang_glm_ext")

# Expert slices re-laid for the SM90 kernel since the process started (diagnostics; doctor-free, logged).
RELAID = {"experts": 0, "calls": 0}


class MegaMoEWeightUpdateError(RuntimeError):
    """A write into a MegaMoE layout SGLang's loaders cannot keep right (FP4); nothing serves the mixed bytes."""


def fp4_mega_layer(experts: Any) -> bool:
    """Built MegaMoE weights of a layout the loaders cannot rewrite in place (anything but SM90 block-FP8)."""
    return bool(getattr(experts, "_mega_moe_weights_built", False)) and not sm90_fp8.layer_is_interleaved(experts)


def _layout_name(experts: Any) -> str:
    if getattr(experts, "_mega_moe_trtllm_layout", False):
        return "NVFP4 on FlashInfer's TRTLLM layout"
    if getattr(experts, "_mega_moe_nvfp4", False):
        return "NVFP4 in MegaMoE's own layout"
    return "an FP4 MegaMoE layout"


def _is_w13(experts: Any, param: Any) -> bool:
    w13 = getattr(experts, "w13_weight", None)
    return w13 is not None and param is w13


def hook_weight_loader_impl(original: Callable, self, param, loaded_weight, weight_name, shard_id, expert_id,
                            *args, **kwargs):
    """AROUND FusedMoE._weight_loader_impl (expert_id is the local slot here). Invariant: after the call, an SM90
    MegaMoE layer's w13 is interleaved for every expert, with the new rows where the kernel reads them."""
    if not getattr(self, "_mega_moe_weights_built", False):
        return original(self, param, loaded_weight, weight_name, shard_id, expert_id, *args, **kwargs)
    if fp4_mega_layer(self):
        raise MegaMoEWeightUpdateError(refusal([getattr(self, "_glm_ext_prefix", "") or "a MoE layer"],
                                               _layout_name(self)))
    if not (_is_w13(self, param) and shard_id in ("w1", "w3") and sm90_fp8.layer_is_interleaved(self)):
        return original(self, param, loaded_weight, weight_name, shard_id, expert_id, *args, **kwargs)
    return _relaid(lambda: original(self, param, loaded_weight, weight_name, shard_id, expert_id, *args, **kwargs),
                   param.data, [expert_id])


def hook_weight_loader_fused(original: Callable, self, param, loaded_weight, weight_name, shard_id, *args,
                             **kwargs):
    """AROUND FusedMoE.weight_loader_fused (a checkpoint holding every expert's gate_up in one tensor)."""
    if not getattr(self, "_mega_moe_weights_built", False):
        return original(self, param, loaded_weight, weight_name, shard_id, *args, **kwargs)
    if fp4_mega_layer(self):
        raise MegaMoEWeightUpdateError(refusal([getattr(self, "_glm_ext_prefix", "") or "a MoE layer"],
                                               _layout_name(self)))
    if not (_is_w13(self, param) and shard_id == "w13" and sm90_fp8.layer_is_interleaved(self)):
        return original(self, param, loaded_weight, weight_name, shard_id, *args, **kwargs)
    return _relaid(lambda: original(self, param, loaded_weight, weight_name, shard_id, *args, **kwargs),
                   param.data, None)


def _relaid(call: Callable[[], Any], w13, experts: Optional[list]):
    sm90_fp8.deinterleave_experts_(w13, experts)
    try:
        return call()
    finally:  # also when the loader raised: never leave the experts in the plain order
        sm90_fp8.interleave_experts_(w13, experts)
        RELAID["calls"] += 1
        RELAID["experts"] += w13.shape[0] if experts is None else len(experts)


# ---------------------------------------------------------------- the update entry points

def mega_layers(model: Any) -> list[tuple[str, Any]]:
    """(module name, FusedMoE) for every MoE layer of `model` with built MegaMoE weights."""
    return [(name, m) for name, m in model.named_modules()
            if getattr(m, "_mega_moe_weights_built", False) and hasattr(m, "w13_weight")]


def refusal(layers: list[str], layout: str) -> str:
    shown = ", ".join(layers[:3]) + (f" and {len(layers) - 3} more" if len(layers) > 3 else "")
    return (f"{guard.PREFIX}: online weight updates are refused, nothing written: {shown} hold MegaMoE weights in "
            f"{layout}, which SGLang's loaders cannot rewrite in place (they write checkpoint rows into the kernel's "
            "packed, shuffled tensors and the post-processing that built them does not run again); restart the "
            "server on the new checkpoint, or serve with --moe-a2a-backend none to update weights in place")


def mark_refused_layers(model: Any) -> list[str]:
    """At load: give every FP4 MegaMoE layer SGLang's own refusal marker, `_derived_weight_cache_error`, which
    `update_weights_from_disk / _tensor / _ipc` and `load_weights_from_distributed` check before writing anything
    (model_runner_components/weight_updater.py:43-84): they return (False, the reason), rank-uniformly. The module
    name rides along for the loader hook's message. Returns the marked layers."""
    marked = []
    for name, m in mega_layers(model):
        m.__dict__["_glm_ext_prefix"] = name
        if fp4_mega_layer(m):
            marked.append(name)
    for name, m in mega_layers(model):
        if fp4_mega_layer(m):
            m._derived_weight_cache_error = refusal(marked, _layout_name(m))
    return marked


def direct_problem(model: Any, names: Optional[list[str]]) -> Optional[str]:
    """`load_format="direct"` copies tensors verbatim into parameters: refused for the SM90 MegaMoE w13."""
    w13 = {f"{n}.w13_weight" for n, m in mega_layers(model) if sm90_fp8.layer_is_interleaved(m)}
    hit = sorted(w13.intersection(names or ()))
    if not hit:
        return None
    return (f"{guard.PREFIX}: weight update refused, nothing written: load_format='direct' copies tensors verbatim, "
            f"and {hit[0]}{f' (and {len(hit) - 1} more)' if len(hit) > 1 else ''} is MegaMoE's SM90 w13, whose "
            "gate/up rows are interleaved for the kernel; send checkpoint-named tensors (load_format None), which "
            "the plugin lays out for the kernel")


def _names(named_tensors: Any) -> Optional[list[str]]:
    try:
        return [n for n, _ in named_tensors]
    except (TypeError, ValueError):
        return None


def hook_update_from_tensor(original: Callable, self, named_tensors, load_format=None, *args, **kwargs):
    """AROUND WeightUpdater.update_weights_from_tensor: the 'direct' refusal above; every other format goes through
    FusedMoE's loader, where hook_weight_loader_impl keeps the SM90 layout right."""
    if load_format == "direct":
        problem = direct_problem(self.get_model(), _names(named_tensors))
        if problem:
            logger.error("%s", problem)
            return False, problem
    before = RELAID["experts"]
    result = original(self, named_tensors, load_format, *args, **kwargs)
    if RELAID["experts"] > before:
        logger.info("sglang-glm-ext megamoe: weight update re-interleaved %d expert slice(s) for the SM90 MegaMoE "
                    "kernel", RELAID["experts"] - before)
    return result
