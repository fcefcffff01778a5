"""The thin SGLang side of FP4 MegaMoE weights: hooks declared in megamoe/patches.py (`megamoe_fp4.*`).

What 0.5.23 does under `--moe-a2a-backend megamoe` for ModelOpt NVFP4 experts: `__init__` turns the TRTLLM weight
layout off, `process_weights_after_loading` repacks the experts into MegaMoE's own layout in place and returns
before the TRTLLM preparation, `create_moe_runner` leaves no runner and `apply` raises. What these hooks do instead
(the layer then holds exactly what a2a=none would, plus MegaMoE views of it):

1. AFTER `ModelOptNvFp4FusedMoEMethod.__init__`: when FlashInfer TRTLLM is the runner this layer would use
   (`--moe-runner-backend flashinfer_trtllm[_routed]`, or auto on SM100, as `create_moe_runner` resolves it), turn
   the TRTLLM layout back on, so create_weights and the loader lay the experts out as a2a=none does.
2. AFTER `create_weights`: refuse at construction, before any weight is read, a shape MegaMoE cannot run
   (named), and record what the checkpoint hands each FP4 parameter's loader (shape, dtype), turning a loader
   shape error on a scale into a message naming the layer and both sizes.
3. AROUND `process_weights_after_loading`: check the recorded scale groups (K/16 e4m3), compute MegaMoE's alphas
   from the checkpoint scales, run SGLang's own TRTLLM preparation (the method is called with
   `get_moe_a2a_backend` seen as `none` inside `modelopt_quant` for the call, the one branch that reads it
   there being the MegaMoE early return), then hand MegaMoE int8/int32 views of the TRTLLM tensors with
   `_mega_moe_trtllm_layout` set, so `run_mega_routed_experts` passes `weight_layout="trtllm"`.
4. Mxfp4MoEMethod (AFTER create_weights, BEFORE process_weights_after_loading): the same shape refusal and scale
   check (K/32 ue8m0); its weights stay MegaMoE-only (deep_gemm reads the TRTLLM layout for NVFP4 only), which
   it says at startup with the cost a second copy would have.
5. AFTER `DefaultModelLoader.postprocess_weights`: one summary line of the memory this cost on this GPU.

Each layer gets `fp4_layout.Fallback` at `_glm_ext_fp4_fallback`: the hand-off to the miss path (the megamoe
feature decides what a batch that misses MegaMoE runs; nothing here changes `apply`). Off the megamoe backend
every hook returns at its first check. `SGLANG_GLM_EXT_MEGAMOE_FP4_KEEP_TRTLLM=0` restores 0.5.23's in-place
repack (validation still runs).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator, Optional

import torch

from . import fp4_layout as core, hardware
from .feature import FP4_KEEP_TRTLLM

logger = logging.getLogger("sglang_glm_ext")

KEEP_ATTR = "_glm_ext_keep_trtllm"  # on the quant method: the runner whose layout is kept, or None
WHY_ATTR = "_glm_ext_keep_trtllm_why"
SEEN_ATTR = "_glm_ext_fp4_seen"  # on the layer: fp4_layout.LoadObservations
CKPT_ATTR = "_glm_ext_fp4_ckpt"  # on the layer: (hidden, intermediate per rank) before any padding
FP4_PARAMS = ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale")

TALLY = core.MemoryTally()
_TRTLLM_LAYOUT: dict[str, Any] = {}  # hardware.trtllm_layout(), read once per process (the installed files)


def reset_for_tests() -> None:
    TALLY.clear()
    _TRTLLM_LAYOUT.clear()


def _deep_gemm_reads_trtllm() -> dict[str, Any]:
    if not _TRTLLM_LAYOUT:
        _TRTLLM_LAYOUT.update(hardware.trtllm_layout())
    return _TRTLLM_LAYOUT


def _megamoe() -> bool:
    from sglang.srt.layers.moe.utils import get_moe_a2a_backend

    return get_moe_a2a_backend().is_megamoe()


def _keep_enabled() -> bool:
    return FP4_KEEP_TRTLLM.get_bool()


def layer_name(layer: Any) -> str:
    return getattr(layer, "layer_name", "") or f"MoE layer {getattr(layer, 'layer_id', '?')}"


def _is_plain_nvfp4(method: Any) -> bool:
    # Subclasses (nvfp4_online quantizes FP8 sources at load, MuseSpark) load and prepare differently.
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptNvFp4FusedMoEMethod

    return type(method) is ModelOptNvFp4FusedMoEMethod and bool(
        getattr(method.quant_config, "is_checkpoint_nvfp4_serialized", False))


def _trtllm_runner(method: Any) -> tuple[Optional[str], str]:
    """The TRTLLM runner this layer would get outside megamoe, resolved as create_moe_runner resolves it."""
    import sglang.srt.layers.quantization.modelopt_quant as mq
    from sglang.srt.layers.moe.utils import get_moe_runner_backend

    backend = get_moe_runner_backend()
    if backend.is_flashinfer_trtllm() or backend.is_flashinfer_trtllm_routed():
        return backend.value, ""
    if backend.is_auto():
        if mq.is_cuda() and (8, 0) <= mq.get_device_capability() < (10, 0):
            return None, "below SM100 the auto runner is Marlin, which has no TRTLLM layout"
        return "flashinfer_trtllm", ""
    return None, f"--moe-runner-backend {backend.value} has no TRTLLM layout to keep"


# ---------------------------------------------------------------- NVFP4

def hook_nvfp4_init(result: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ModelOptNvFp4FusedMoEMethod.__init__. Invariant: off megamoe, or for a subclass, nothing changes;
    under megamoe the TRTLLM layout is on exactly when KEEP_ATTR names a runner."""
    if not _megamoe() or not _is_plain_nvfp4(self):
        return None
    runner, why = (None, "SGLANG_GLM_EXT_MEGAMOE_FP4_KEEP_TRTLLM=0") if not _keep_enabled() else _trtllm_runner(self)
    if runner and getattr(self, "_lora_marlin", False):
        runner, why = None, "LoRA (lora_marlin) experts"
    if runner and not _deep_gemm_reads_trtllm()["supported"]:
        # Keeping the layout would hand deep_gemm weight_layout="trtllm" at the first batch, which a deep_gemm
        # without it rejects mid-serving; 0.5.23's own repack serves instead (said at startup, no fallback).
        runner, why = None, f"MegaMoE cannot read the TRTLLM layout: {_deep_gemm_reads_trtllm()['why']}"
    setattr(self, KEEP_ATTR, runner)
    setattr(self, WHY_ATTR, why)
    if runner:
        # The two switches create_weights, the loader (load_up_proj_weight_first) and the weight preparation
        # read: with them on, the layer is laid out and prepared exactly as under a2a=none.
        self.enable_flashinfer_trtllm_moe = True
        self.use_flashinfer_trtllm_weight_layout = True
    return None


def _set_loader(param: torch.nn.Parameter, loader: Callable) -> None:
    if isinstance(getattr(type(param), "weight_loader", None), property):
        param._weight_loader = loader  # BasevLLMParameter exposes it read-only
    else:
        param.weight_loader = loader


def _observe_loads(layer: Any, recipe: core.Recipe, config_group: Optional[int]) -> None:
    """Wrap the FP4 parameters' loaders to record each checkpoint tensor's shape and dtype (one set insert per
    tensor) and to turn a scale shape error into a named one. The original loader runs unchanged."""
    observed = core.LoadObservations()
    setattr(layer, SEEN_ATTR, observed)
    name = layer_name(layer)
    for pname in FP4_PARAMS:
        param = getattr(layer, pname, None)
        inner = getattr(param, "weight_loader", None)
        if param is None or inner is None:
            continue
        weight = getattr(layer, pname.replace("_scale", ""), None)
        k = 2 * int(weight.shape[-1]) if weight is not None else 0

        def loader(p, loaded_weight, *args, _inner=inner, _pname=pname, _k=k, **kwargs):
            observed.record(_pname, loaded_weight)
            try:
                return _inner(p, loaded_weight, *args, **kwargs)
            except RuntimeError as exc:
                ckpt = args[0] if args else kwargs.get("weight_name", "?")
                msg = core.explain_load_failure(name, _pname, str(ckpt), tuple(loaded_weight.shape),
                                                tuple(p.shape), _k, recipe, config_group)
                if msg:
                    raise core.ScaleGroupError(msg) from exc
                raise

        _set_loader(param, loader)


def hook_nvfp4_create_weights(result: Any, self: Any, layer: Any, num_experts: int, hidden_size: int,
                              intermediate_size_per_partition: int, params_dtype: Any, **extra: Any) -> None:
    """AFTER ModelOptNvFp4FusedMoEMethod.create_weights (model construction, before any weight is read)."""
    if not _megamoe() or not _is_plain_nvfp4(self):
        return None
    name = layer_name(layer)
    ckpt = (int(hidden_size), int(intermediate_size_per_partition))
    after = (int(layer.w13_weight.shape[2]) * 2, int(layer.w13_weight.shape[1]) // 2)
    # A padded size (create_weights rounds the intermediate up for the TRTLLM kernels) is what MegaMoE would
    # see; naming both makes GLM-4.5-Air's I=1408 recognisable.
    core.check_megamoe_shapes(name, after[0], after[1], "nvfp4xnvfp4", checkpoint=ckpt)
    setattr(layer, CKPT_ATTR, ckpt)
    _observe_loads(layer, core.NVFP4, getattr(self.quant_config, "group_size", None))
    return None


def _allocated(layer: Any) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    return {n: (tuple(getattr(layer, n).shape), getattr(layer, n).dtype) for n in FP4_PARAMS
            if getattr(layer, n, None) is not None}


def validate_nvfp4(method: Any, layer: Any) -> int:
    """Scale groups of a loaded ModelOpt NVFP4 layer; returns how many checkpoint pairs were checked."""
    name = layer_name(layer)
    group = getattr(method.quant_config, "group_size", None)
    if group != core.NVFP4.group:
        raise core.ScaleGroupError(
            f"{name}: the quantization config says group_size={group}; NVFP4 (MegaMoE recipe (1, 1, 16), "
            "FlashInfer TRTLLM) needs one e4m3 scale per 16 elements, i.e. group_size=16")
    return core.check_observed_loads(name, core.NVFP4, getattr(layer, SEEN_ATTR, None), _allocated(layer))


@contextlib.contextmanager
def _modelopt_sees_a2a_none() -> Iterator[None]:
    """Inside modelopt_quant only, for one call: the a2a backend reads as none. Restored on every exit."""
    import sglang.srt.layers.quantization.modelopt_quant as mq
    from sglang.srt.layers.moe.utils import MoeA2ABackend

    real = mq.get_moe_a2a_backend
    mq.get_moe_a2a_backend = lambda: MoeA2ABackend.NONE
    try:
        yield
    finally:
        mq.get_moe_a2a_backend = real


def hook_nvfp4_process_weights(original: Callable, self: Any, layer: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ModelOptNvFp4FusedMoEMethod.process_weights_after_loading. Invariants: off megamoe the original runs
    untouched; on the keep path the TRTLLM tensors are exactly what a2a=none builds, MegaMoE's weight tensors are
    views of them (checked by storage), and MegaMoE's alphas come from the checkpoint scales."""
    if not _megamoe() or not _is_plain_nvfp4(self):
        return original(self, layer, *args, **kwargs)
    name = layer_name(layer)
    validate_nvfp4(self, layer)
    runner = getattr(self, KEEP_ATTR, None)
    if not runner:
        result = original(self, layer, *args, **kwargs)
        _no_fallback(layer, f"NVFP4 repacked in place for MegaMoE: {getattr(self, WHY_ATTR, '') or 'not kept'}")
        return result

    from sglang.srt.layers.quantization.modelopt_quant import _input_scale_to_local_experts

    if not layer.moe_runner_config.is_gated:
        raise core.MegaMoEShapeError(f"{name}: MegaMoE NVFP4 needs a gated MLP (SwiGLU); this layer is not gated")
    w2_in = _input_scale_to_local_experts(layer.w2_input_scale, layer.num_local_experts, layer.num_experts,
                                          layer.moe_ep_rank)
    alphas = core.nvfp4_megamoe_alphas(name, layer.w13_weight_scale_2.data, layer.w2_weight_scale_2.data, w2_in)

    with _modelopt_sees_a2a_none():
        result = original(self, layer, *args, **kwargs)

    ckpt = getattr(layer, CKPT_ATTR, None) or (int(layer.w13_weight.shape[2]) * 2,
                                               int(layer.intermediate_size_per_partition))
    core.check_trtllm_unpadded(name, ckpt, (int(layer.w2_weight.shape[1]), int(layer.intermediate_size_per_partition)),
                               getattr(layer, "trtllm_padded_hidden_size", None))
    if not torch.equal(alphas.l1[:, 0], alphas.l1[:, 1]) and torch.equal(layer.g1_alphas, layer.g1_alphas_up):
        # The TRTLLM preparation tied untied gate/up alphas by rescaling block scales (gemm1 clamp limit).
        alphas = core.tie_l1_alphas(alphas)
    l1, l2 = core.trtllm_views(name, layer.w13_weight.data, layer.w13_weight_scale.data, layer.w2_weight.data,
                               layer.w2_weight_scale.data)
    layer.mega_l1_weights = l1
    layer.mega_l2_weights = l2
    # Parameters, so EPLB moves each expert's alphas with its weights (as 0.5.23 registers them).
    for pname, value in alphas.named().items():
        layer.register_parameter(pname, torch.nn.Parameter(value, requires_grad=False))
    layer._mega_moe_nvfp4 = True
    layer._mega_moe_trtllm_layout = True
    layer._mega_moe_weights_built = True
    setattr(layer, core.FALLBACK_ATTR, core.Fallback(True, runner))
    mem = core.megamoe_memory(
        name,
        [layer.w13_weight, layer.w13_weight_scale, layer.w2_weight, layer.w2_weight_scale],
        [*l1, *l2], list(alphas.named().values()))
    TALLY.kept.append(mem)
    logger.debug("sglang-glm-ext megamoe_fp4: %s: MegaMoE reads the %s layout (weights shared %s, extra %s)",
                 name, runner, core.fmt_bytes(mem.shared_bytes), core.fmt_bytes(mem.extra_bytes))
    return result


def _no_fallback(layer: Any, why: str) -> None:
    setattr(layer, core.FALLBACK_ATTR, core.Fallback(False, None, why))
    cost = sum(int(getattr(layer, n).numel()) * getattr(layer, n).element_size() for n in FP4_PARAMS
               if getattr(layer, n, None) is not None)
    TALLY.no_fallback.append((layer_name(layer), why, cost))


# ---------------------------------------------------------------- MXFP4

def _is_plain_mxfp4(method: Any) -> bool:
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4MoEMethod

    return type(method) is Mxfp4MoEMethod and bool(getattr(method, "use_mega_moe", False))


def _mxfp4_mma_type(layer: Any) -> str:
    from sglang.srt.layers.moe.mega_moe import _mega_moe_mma_type

    return _mega_moe_mma_type(layer)


def hook_mxfp4_create_weights(result: Any, self: Any, layer: Any, num_experts: int, hidden_size: int,
                              intermediate_size_per_partition: int, params_dtype: Any, *args: Any,
                              **extra: Any) -> None:
    """AFTER Mxfp4MoEMethod.create_weights: refuse an unservable shape before loading; observe the loads."""
    if not _megamoe() or not _is_plain_mxfp4(self):
        return None
    name = layer_name(layer)
    after = (int(layer.w13_weight.shape[2]) * 2, int(layer.w13_weight.shape[1]) // 2)
    core.check_megamoe_shapes(name, after[0], after[1], _mxfp4_mma_type(layer),
                              checkpoint=(int(hidden_size), int(intermediate_size_per_partition)))
    _observe_loads(layer, core.MXFP4, core.MXFP4.group)
    return None


def hook_mxfp4_process_weights(self: Any, layer: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE Mxfp4MoEMethod.process_weights_after_loading: scale groups (K/32 ue8m0) and the no-fallback record.

    deep_gemm 0.2.3.post2 reads a TRTLLM layout only for nvfp4xnvfp4 (`fp8_fp4_mega_moe` raises "TRT-LLM packed
    weights require NVFP4 MMA"), and FlashInfer's MXFP4 runner wants padded, differently shuffled weights; so
    MXFP4 keeps MegaMoE's layout alone, as 0.5.23 does, and says so."""
    if not _megamoe() or not _is_plain_mxfp4(self):
        return None
    name = layer_name(layer)
    core.check_observed_loads(name, core.MXFP4, getattr(layer, SEEN_ATTR, None), _allocated(layer))
    _no_fallback(layer, f"MXFP4 ({_mxfp4_mma_type(layer)}): deep_gemm's TRTLLM weight layout is NVFP4-only")
    return None


# ---------------------------------------------------------------- summary

def hook_postprocess_weights(result: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER DefaultModelLoader.postprocess_weights: the per-GPU memory line, once per load."""
    for line in TALLY.summary():
        logger.info("sglang-glm-ext %s", line)
    TALLY.clear()
    return None
