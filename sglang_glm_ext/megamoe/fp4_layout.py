"""FP4 MegaMoE weights, the layout half: recipes, scale-group checks, the MegaMoE shape rule, NVFP4 alphas, the
MegaMoE views of FlashInfer's TRTLLM tensors, and what they cost in memory.

Torch only, no SGLang and no deep_gemm import: it tests on a CPU and the hooks (fp4_hooks.py) hand it plain
tensors and shapes. What each piece answers:
- does a loaded FP4 layer carry the scale groups its recipe needs?   `check_scale_group`, `check_observed_loads`
  (NVFP4: one e4m3 scale per 16 K-elements; MXFP4: one ue8m0 scale per 32)
- can MegaMoE run this layer's shape?                                  `check_megamoe_shapes` (mirrors SGLang 0.5.23's
  `check_mega_moe_shapes`; tests/megamoe/test_fp4_layout.py pins the two against each other)
- what does MegaMoE's NVFP4 kernel multiply by?                        `nvfp4_megamoe_alphas`, `tie_l1_alphas`
- how does MegaMoE read the TRTLLM tensors without a copy?            `trtllm_views`
- how many bytes did MegaMoE add on top of the TRTLLM layout?          `megamoe_memory`, `MemoryTally`
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping, Optional

import torch

MIB = 1 << 20


class FP4LayoutError(ValueError):
    """A layer whose FP4 weights cannot serve MegaMoE as loaded; raised at startup, names the layer."""


class ScaleGroupError(FP4LayoutError):
    """Scale shape or dtype disagrees with the FP4 recipe (K/16 e4m3 for NVFP4, K/32 ue8m0 for MXFP4)."""


class MegaMoEShapeError(FP4LayoutError):
    """hidden / intermediate sizes (after any padding) break MegaMoE's alignment rule."""


class AlphaError(FP4LayoutError):
    """A per-expert scale that would turn MegaMoE's alphas into inf/NaN."""


class SharedStorageError(FP4LayoutError):
    """The MegaMoE views would not read the TRTLLM tensors' own storage (the zero-copy invariant)."""


# ---------------------------------------------------------------- recipes

_E8M0 = getattr(torch, "float8_e8m0fnu", None)


@dataclass(frozen=True)
class Recipe:
    """One FP4 weight recipe as the checkpoint stores it: packed e2m1 pairs plus one scale per `group` K-elements."""

    name: str
    group: int
    scale_format: str
    scale_dtypes: tuple[torch.dtype, ...]
    mma_types: tuple[str, ...]


# ModelOpt NVFP4: float8_e4m3fn block scales (UE4M3 to the kernel), one per 16, plus fp32 per-expert globals.
NVFP4 = Recipe("NVFP4", 16, "e4m3", (torch.float8_e4m3fn,), ("nvfp4xnvfp4",))
# MXFP4 (OCP MX): biased-exponent bytes, one per 32; SGLang loads them as uint8.
MXFP4 = Recipe("MXFP4", 32, "ue8m0", tuple(d for d in (torch.uint8, _E8M0) if d is not None),
               ("mxf4xmxf4", "fp8xfp4"))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_scale_group(layer: str, tensor: str, weight_shape: tuple[int, ...], scale_shape: tuple[int, ...],
                      scale_dtype: torch.dtype, recipe: Recipe) -> None:
    """Raise ScaleGroupError unless `scale` holds one `recipe.scale_format` scale per `recipe.group` elements of
    the K (last, packed) dimension of `weight`, row for row. Invariant: every message names the layer, the tensor
    and both sizes (found vs expected), so a wrong checkpoint is identifiable from the log line alone."""
    k = 2 * int(weight_shape[-1])
    shapes = f"(weight {tuple(weight_shape)} packed two e2m1 per byte, scale {tuple(scale_shape)})"
    if tuple(weight_shape[:-1]) != tuple(scale_shape[:-1]):
        raise ScaleGroupError(
            f"{layer}: {tensor} scale rows {tuple(scale_shape[:-1])} do not match the weight rows "
            f"{tuple(weight_shape[:-1])} {shapes}; {recipe.name} keeps one scale row per weight row")
    if k % recipe.group:
        raise ScaleGroupError(
            f"{layer}: {tensor} has K={k}, not a multiple of the {recipe.name} group {recipe.group} {shapes}")
    expected, found = k // recipe.group, int(scale_shape[-1])
    if found != expected:
        implied = f"groups of {k // found}" if found and k % found == 0 else "no whole group size"
        raise ScaleGroupError(
            f"{layer}: {tensor} has {found} scale columns for K={k}, {recipe.name} needs K/{recipe.group} = "
            f"{expected} ({recipe.scale_format} scales, one per {recipe.group} elements); the checkpoint's scales "
            f"imply {implied} {shapes}. Is this checkpoint really {recipe.name}?")
    if scale_dtype not in recipe.scale_dtypes:
        raise ScaleGroupError(
            f"{layer}: {tensor} scales are {_dtype_name(scale_dtype)}, {recipe.name} needs {recipe.scale_format} "
            f"({' or '.join(_dtype_name(d) for d in recipe.scale_dtypes)}) {shapes}; SGLang would convert the "
            "values numerically instead of reading their bits")


Shape = tuple[int, ...]


@dataclass
class LoadObservations:
    """The distinct (shape, dtype) of every checkpoint tensor handed to a layer's FP4 parameters' loaders.

    A set per parameter: a GLM-5 layer loads ~3k expert tensors but shows one or two shapes, so this stays tiny.
    """

    seen: dict[str, set[tuple[Shape, torch.dtype]]] = field(default_factory=dict)

    def record(self, param: str, tensor: torch.Tensor) -> None:
        self.seen.setdefault(param, set()).add((tuple(tensor.shape), tensor.dtype))

    def pairs(self, weight: str, scale: str) -> Iterator[tuple[Shape, Shape, torch.dtype]]:
        """(weight shape, scale shape, scale dtype) for every loaded scale, matched to a loaded weight with the
        same rows (scales are per weight row in every FP4 layout); a scale with no such weight yields weight ()."""
        weights = {s for s, _ in self.seen.get(weight, ())}
        for shape, dtype in sorted(self.seen.get(scale, ()), key=repr):
            matched = [w for w in weights if w[:-1] == shape[:-1]]
            yield (matched[0] if matched else (), shape, dtype)


FP4_PAIRS = (("w13_weight", "w13_weight_scale"), ("w2_weight", "w2_weight_scale"))


def check_observed_loads(layer: str, recipe: Recipe, observed: Optional[LoadObservations],
                         allocated: Mapping[str, tuple[Shape, torch.dtype]]) -> int:
    """Check what the checkpoint actually handed the loaders; returns how many (weight, scale) pairs it checked.

    `allocated` (name -> (shape, dtype) of the layer's parameters) covers a scale whose weight was never seen:
    then K comes from the allocated weight, which is exact for w13 (K = hidden, never sharded or padded) and an
    upper bound for a padded w2. Invariant: a scale whose dtype is not the recipe's is refused even unpaired.
    """
    checked = 0
    if observed is not None:
        for weight, scale in FP4_PAIRS:
            for w_shape, s_shape, s_dtype in observed.pairs(weight, scale):
                if not w_shape:
                    alloc = allocated.get(weight)
                    if alloc is None:
                        continue
                    w_shape = s_shape[:-1] + alloc[0][-1:]
                check_scale_group(layer, f"checkpoint {scale}", w_shape, s_shape, s_dtype, recipe)
                checked += 1
    for weight, scale in FP4_PAIRS:
        if weight in allocated and scale in allocated:
            check_scale_group(layer, scale, allocated[weight][0], allocated[scale][0], allocated[scale][1], recipe)
    return checked


def explain_load_failure(layer: str, param: str, checkpoint_name: str, loaded: Shape, allocated: Shape,
                         k: int, recipe: Recipe, config_group: Optional[int]) -> Optional[str]:
    """The clear message for a loader shape error on a scale parameter, or None when it is not about scale groups.

    `allocated` is the parameter's shape (experts first), `k` the K the layer allocated its weight with."""
    if not param.endswith("_scale") or not loaded or not allocated or loaded[-1] == allocated[-1]:
        return None
    implied = f"groups of {k // loaded[-1]}" if loaded[-1] and k % loaded[-1] == 0 else "no whole group size"
    cfg = f"group_size={config_group} from the quantization config" if config_group else f"the {recipe.name} recipe"
    return (f"{layer}: checkpoint tensor {checkpoint_name} has {loaded[-1]} scale columns (shape {tuple(loaded)}), "
            f"the layer allocated {allocated[-1]} (shape {tuple(allocated)}) for K={k} and {cfg}; the checkpoint's "
            f"scales imply {implied}, {recipe.name} needs one {recipe.scale_format} scale per {recipe.group}")


# ---------------------------------------------------------------- MegaMoE shape rule

# Public model configs (hidden_size, moe_intermediate_size) -> name, only to make a refusal recognisable.
KNOWN_GLM_SHAPES: dict[tuple[int, int], str] = {
    (6144, 2048): "GLM-5.x",
    (5120, 1536): "GLM-4.5 / 4.6 / 4.7",
    (4096, 1408): "GLM-4.5-Air",
}


def megamoe_alignment(mma_type: str) -> tuple[int, int]:
    """(hidden, intermediate) multiples DeepGEMM MegaMoE needs for `mma_type` (SGLang 0.5.23 mega_moe.py:100-116:
    16 scale groups per K block; fp8xfp4 relaxes the intermediate to 128)."""
    if mma_type not in ("nvfp4xnvfp4", "mxf4xmxf4", "fp8xfp4"):
        raise ValueError(f"unknown MegaMoE mma type {mma_type!r}")
    group = 16 if mma_type == "nvfp4xnvfp4" else 32
    return 16 * group, (128 if mma_type == "fp8xfp4" else 16 * group)


def check_megamoe_shapes(layer: str, hidden: int, intermediate: int, mma_type: str, *,
                         checkpoint: Optional[tuple[int, int]] = None) -> None:
    """Raise MegaMoEShapeError, naming the configuration, when MegaMoE cannot run these (possibly padded) sizes.
    `checkpoint` is the unpadded (hidden, intermediate), when padding happened."""
    h_align, i_align = megamoe_alignment(mma_type)
    if hidden % h_align == 0 and intermediate % i_align == 0:
        return
    ckpt = checkpoint or (hidden, intermediate)
    known = KNOWN_GLM_SHAPES.get(ckpt)
    padded = (f" (padded from hidden_size={ckpt[0]}, moe_intermediate_size={ckpt[1]})"
              if checkpoint and checkpoint != (hidden, intermediate) else "")
    raise MegaMoEShapeError(
        f"{layer}: DeepGEMM MegaMoE ({mma_type}) needs hidden_size % {h_align} == 0 and moe_intermediate_size "
        f"per rank % {i_align} == 0; this configuration has hidden_size={hidden}, moe_intermediate_size="
        f"{intermediate}{padded}{f', the shape of {known}' if known else ''}. MegaMoE cannot serve it: use "
        "--moe-a2a-backend none (FlashInfer TRTLLM MoE serves this shape) or another a2a backend.")


def check_trtllm_unpadded(layer: str, checkpoint: tuple[int, int], after: tuple[int, int],
                          padded_hidden: Optional[int]) -> None:
    """The TRTLLM preparation must not have padded a layer MegaMoE will read: the model hands MegaMoE the
    checkpoint sizes, so padded weights would be read with the wrong strides."""
    h, i = checkpoint
    if padded_hidden is not None or after != checkpoint:
        raise MegaMoEShapeError(
            f"{layer}: FlashInfer's TRTLLM preparation padded (hidden_size, moe_intermediate_size) from {(h, i)} "
            f"to {(padded_hidden or after[0], after[1])}; MegaMoE reads the checkpoint sizes, so it cannot share "
            "the padded TRTLLM tensors. Use --moe-a2a-backend none, or set "
            "SGLANG_GLM_EXT_MEGAMOE_FP4_KEEP_TRTLLM=0 (MegaMoE only, no fallback layout).")


# ---------------------------------------------------------------- NVFP4 alphas

@dataclass(frozen=True)
class NvFp4Alphas:
    """What DeepGEMM's nvfp4xnvfp4 kernel multiplies by, per local expert (all float32, contiguous).

    l1 [E, 2]: (gate, up) weight global scales; activations are quantized per token at dispatch (x_scales), so
    no static input scale enters. l2_act [E]: 1 / fc2 input scale, applied before the L1 output is requantized.
    l2 [E]: fc2 input scale x fc2 weight global scale, the L2 epilogue's dequant factor.
    """

    l1: torch.Tensor
    l2: torch.Tensor
    l2_act: torch.Tensor

    def named(self) -> dict[str, torch.Tensor]:
        """SGLang's attribute names (mega_moe.py run_mega_routed_experts reads these from the experts)."""
        return {"mega_l1_alphas": self.l1, "mega_l2_alphas": self.l2, "mega_l2_act_scales": self.l2_act}

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.l1, self.l2, self.l2_act))


def _gate_up(w13_scale_2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # [E, 2] = (gate, up); a shared [E] / [E, 1] scale serves both halves (SGLang's _compute_gemm1_alphas).
    if w13_scale_2.dim() == 2 and w13_scale_2.shape[1] >= 2:
        return w13_scale_2[:, 0], w13_scale_2[:, 1]
    shared = w13_scale_2.reshape(w13_scale_2.shape[0])
    return shared, shared


def _require(layer: str, name: str, t: torch.Tensor, *, positive: bool) -> None:
    bad = ~torch.isfinite(t) | ((t <= 0) if positive else (t < 0))
    if bool(bad.any()):
        idx = int(bad.nonzero()[0][0])
        raise AlphaError(
            f"{layer}: {name} of local expert {idx} is {float(t.reshape(-1)[idx])}; MegaMoE needs it finite and "
            f"{'> 0' if positive else '>= 0'} (it enters the kernel's alphas; inf/NaN would reach every output)")


def nvfp4_megamoe_alphas(layer: str, w13_scale_2: torch.Tensor, w2_scale_2: torch.Tensor,
                         w2_input_scale: torch.Tensor) -> NvFp4Alphas:
    """MegaMoE's NVFP4 alphas from the checkpoint's per-expert scales (`w2_input_scale` already this rank's local
    experts). Same arithmetic as SGLang 0.5.23's `_build_mega_moe_weights`, so the fast path's numerics do not
    change with the layout. Must run before the TRTLLM preparation: it rewrites block scales in place."""
    gate, up = _gate_up(w13_scale_2.detach().to(torch.float32))
    w2_in = w2_input_scale.detach().to(torch.float32).reshape(-1)
    w2_s2 = w2_scale_2.detach().to(torch.float32).reshape(-1)
    if not (gate.shape[0] == w2_in.shape[0] == w2_s2.shape[0]):
        raise AlphaError(f"{layer}: per-expert scale counts differ: w13_weight_scale_2 {gate.shape[0]}, "
                         f"w2_weight_scale_2 {w2_s2.shape[0]}, w2_input_scale (local) {w2_in.shape[0]}")
    _require(layer, "w13_weight_scale_2 (gate)", gate, positive=False)
    _require(layer, "w13_weight_scale_2 (up)", up, positive=False)
    _require(layer, "w2_weight_scale_2", w2_s2, positive=False)
    _require(layer, "w2_input_scale", w2_in, positive=True)
    return NvFp4Alphas(
        l1=torch.stack([gate, up], dim=1).contiguous(),
        l2=(w2_in * w2_s2).contiguous(),
        l2_act=(1.0 / w2_in).contiguous(),
    )


def tie_l1_alphas(alphas: NvFp4Alphas) -> NvFp4Alphas:
    """The l1 alphas that match block scales FlashInfer's preparation rescaled to one shared alpha per expert.

    SGLang (modelopt_quant.py, gemm1 clamp branch) multiplies the smaller half's e4m3 block scales by
    alpha_half / max(alpha_gate, alpha_up) when a clamp limit is set and the halves differ. MegaMoE reads those
    same scales, so its alphas must move to the max too: gate * s_gate = max * (s_gate * gate / max)."""
    shared = torch.maximum(alphas.l1[:, 0], alphas.l1[:, 1])
    return dataclasses.replace(alphas, l1=torch.stack([shared, shared], dim=1).contiguous())


# ---------------------------------------------------------------- MegaMoE views of the TRTLLM tensors

Pair = tuple[torch.Tensor, torch.Tensor]


def _view_pair(layer: str, name: str, weight: torch.Tensor, scale: torch.Tensor) -> Pair:
    if weight.dtype not in (torch.uint8, torch.int8) or scale.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise SharedStorageError(f"{layer}: {name} is {_dtype_name(weight.dtype)} with "
                                 f"{_dtype_name(scale.dtype)} scales; MegaMoE's TRTLLM layout reads packed NVFP4 "
                                 "(uint8) with e4m3 scales")
    check_scale_group(layer, f"TRTLLM {name}_scale", tuple(weight.shape), tuple(scale.shape),
                      torch.float8_e4m3fn, NVFP4)
    if not (weight.is_contiguous() and scale.is_contiguous()) or scale.shape[-1] % 4:
        raise SharedStorageError(f"{layer}: TRTLLM {name} tensors are not contiguous with whole int32 scale "
                                 f"words (scale {tuple(scale.shape)}); a view would need a copy")
    w_view = weight.view(torch.int8)
    # Four e4m3 bytes per int32 word along K: the kernel's SF word, in TRTLLM's shuffled row order.
    s_view = scale.view(torch.uint8).view(torch.int32)
    if w_view.data_ptr() != weight.data_ptr() or s_view.data_ptr() != scale.data_ptr():
        raise SharedStorageError(f"{layer}: MegaMoE view of {name} does not start at the TRTLLM tensor's storage")
    return w_view, s_view


def trtllm_views(layer: str, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                 w2_scale: torch.Tensor) -> tuple[Pair, Pair]:
    """(l1, l2) = ((int8 weight, int32 scale), ...) for `fp8_fp4_mega_moe(..., weight_layout="trtllm")`.

    Invariant: pure views, no copy; each view's bytes are the TRTLLM tensor's bytes, so `view(uint8)` of a view
    gives back the TRTLLM tensor bit for bit, and anything that updates the TRTLLM tensors in place (EPLB)
    updates what MegaMoE reads."""
    return _view_pair(layer, "w13_weight", w13, w13_scale), _view_pair(layer, "w2_weight", w2, w2_scale)


# ---------------------------------------------------------------- memory

def _storage(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def distinct_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (views of one storage count once)."""
    return sum(n for _, n in {_storage(t) for t in tensors})


@dataclass(frozen=True)
class LayerMemory:
    """What MegaMoE costs on one layer of one GPU on top of the TRTLLM layout."""

    layer: str
    trtllm_bytes: int  # the TRTLLM layout's tensors, which a2a=none would hold as well
    shared_bytes: int  # MegaMoE tensors that are views of those
    extra_bytes: int  # MegaMoE storage of its own (alphas: 16 B per local expert)
    copied_weight_bytes: int  # expert weights / block scales MegaMoE holds a second copy of (target 0)


def megamoe_memory(layer: str, trtllm: Iterable[torch.Tensor], megamoe_weights: Iterable[torch.Tensor],
                   megamoe_other: Iterable[torch.Tensor] = ()) -> LayerMemory:
    """Split MegaMoE's tensors into views of the TRTLLM storages and storage of their own."""
    trtllm = list(trtllm)
    owned = {_storage(t) for t in trtllm}
    shared = copied = 0
    for t in megamoe_weights:
        if _storage(t) in owned:
            shared += t.numel() * t.element_size()
        else:
            copied += t.numel() * t.element_size()
    extra = distinct_bytes(t for t in megamoe_other if _storage(t) not in owned)
    return LayerMemory(layer, distinct_bytes(trtllm), shared, extra + copied, copied)


def fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


@dataclass
class MemoryTally:
    """Per-process record of what the FP4 MegaMoE weight build did, summarised once after weight loading."""

    kept: list[LayerMemory] = field(default_factory=list)
    no_fallback: list[tuple[str, str, int]] = field(default_factory=list)  # (layer, why, bytes a copy would cost)

    def summary(self) -> list[str]:
        lines = []
        if self.kept:
            n = len(self.kept)
            copied = sum(m.copied_weight_bytes for m in self.kept)
            extra = sum(m.extra_bytes for m in self.kept)
            shared = sum(m.shared_bytes for m in self.kept)
            lines.append(
                f"MegaMoE FP4: {n} NVFP4 MoE layer(s) on this GPU read FlashInfer's TRTLLM layout "
                f"(weight_layout=trtllm); expert weights copied: {fmt_bytes(copied)} (target 0), shared with the "
                f"TRTLLM fallback: {fmt_bytes(shared)}, extra memory on this GPU: {fmt_bytes(extra)} "
                f"(alphas, {fmt_bytes(extra // n)} per layer)")
        if self.no_fallback:
            why = sorted({w for _, w, _ in self.no_fallback})
            cost = sum(b for _, _, b in self.no_fallback)
            lines.append(
                f"MegaMoE FP4: {len(self.no_fallback)} MoE layer(s) on this GPU keep NO fallback layout "
                f"({'; '.join(why)}); keeping one would cost {fmt_bytes(cost)} more on this GPU. Every batch of "
                "these layers must take MegaMoE (see the MegaMoE token cap).")
        return lines

    def clear(self) -> None:
        self.kept.clear()
        self.no_fallback.clear()


# ---------------------------------------------------------------- the hand-off to the miss path

FALLBACK_ATTR = "_glm_ext_fp4_fallback"


@dataclass(frozen=True)
class Fallback:
    """Set on every FP4 MoE layer built under megamoe: whether a layout other than MegaMoE's can run it.

    `kept` True: `layout` names the runner whose tensors are in place on the layer (today only
    "flashinfer_trtllm" / "flashinfer_trtllm_routed": w13/w2 weights and scales, g1_scale_c, g1_alphas,
    g2_alphas, w13_input_scale_quant, intermediate_size_per_partition, exactly as a2a=none builds them).
    False: the weights were repacked for MegaMoE only; `reason` says why."""

    kept: bool
    layout: Optional[str]
    reason: str = ""
