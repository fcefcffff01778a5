"""Startup refusals for GLM models under --moe-a2a-backend megamoe. Pure; no SGLang import.

Every launch where some batch could miss the MegaMoE kernel is refused here with the fix in the message, because
the miss would run SGLang's stock fused-MoE path, which under megamoe computes each token with only its own
rank's experts (docs_internal/megamoe.md). What can miss, in SGLang 0.5.23:

- a GLM architecture whose MoE block has no MegaMoE branch at all (`Glm4MoeLiteSparseMoeBlock`);
- expert weights for which no MegaMoE builder exists on this SM (bf16 experts, experts excluded from
  quantisation, FP8 on SM100, NVFP4 / MXFP4 on SM90, any other method): the layer is never "ready";
- a batch above SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK (SGLang's own budget check, which the hook
  runs for GLM models, plus the decode bounds it leaves out, `decode_problems`);
- a deep_gemm without the kernel this SM needs.

The hooks gather plain facts (`LaunchFacts`) from SGLang's resolved server arguments and the model config, and
raise `MegaMoELaunchError` with every problem found.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

# Architectures whose sparse layers are Glm4MoeSparseMoeBlock: the plugin's GLM-4.x fast path (hooks).
GLM4_BLOCK_ARCHS = frozenset({
    "Glm4MoeForCausalLM",  # GLM-4.5 / 4.6 / 4.7, GLM-4.5-Air
    "Glm4MoeForCausalLMNextN",  # their MTP draft layer (same block class)
    "Glm4vMoeForConditionalGeneration",  # GLM-4.5V / 4.6V text tower (Glm4MoeModel)
})
# Architectures whose sparse layers are DeepseekV2MoE: SGLang's own MegaMoE branch (deepseek_v2.py:1061-1069).
GLM_DEEPSEEK_ARCHS = frozenset({
    "GlmMoeDsaForCausalLM",  # GLM-5.x
    "GlmMoeDsaForCausalLMNextN",
    "Glm5NextForConditionalGeneration",
    "Glm5NextForConditionalGenerationNextN",
})
# GLM architectures whose MoE block has no MegaMoE branch: every batch would take the stock path.
GLM_NO_MEGAMOE_ARCHS = frozenset({
    "Glm4MoeLiteForCausalLM",  # Glm4MoeLiteSparseMoeBlock (glm4_moe_lite.py)
    "Glm4MoeLiteForCausalLMNextN",
})
GLM_MEGAMOE_ARCHS = GLM4_BLOCK_ARCHS | GLM_DEEPSEEK_ARCHS
GLM_ARCHS = GLM_MEGAMOE_ARCHS | GLM_NO_MEGAMOE_ARCHS

# Retired fork-era switches (seed line 30 and 20-29) and what replaces each. The plugin never sets DG_USE_FP4_ACTS:
# deep_gemm >= 0.2.0 refuses to import when it is set (its __init__ checks the legacy DG_* names).
RETIRED_ENV = {
    "SGLANG_OPT_USE_DEEPGEMM_MEGA_MOE": "--moe-a2a-backend megamoe (or its alias --moe-runner-backend megamoe)",
    "SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_FP4_ACTS": (
        "nothing to set: the quantisation method picks the MegaMoE MMA type (ModelOpt NVFP4 -> nvfp4xnvfp4, "
        "MXFP4 -> fp8xfp4, or mxf4xmxf4 with --enable-w4a4-mxfp4-megamoe)"
    ),
}


class MegaMoELaunchError(ValueError):
    """This launch could miss the MegaMoE kernel on some batch (or cannot run it at all); raised before serving."""


# ---------------------------------------------------------------- expert quantisation

@dataclass(frozen=True)
class ExpertQuant:
    kind: str  # bf16 | fp8_block128 | fp8_other | nvfp4 | mxfp4 | other
    detail: str = ""


def classify_experts(quantization: Optional[str], hf_quant_config: Optional[Mapping[str, Any]]) -> ExpertQuant:
    """How a checkpoint's routed experts are stored, from `--quantization` and the HF quantization_config."""
    q = dict(hf_quant_config or {})
    inner = q.get("quantization") if isinstance(q.get("quantization"), Mapping) else {}
    method = str(quantization or q.get("quant_method") or "").lower()
    algo = str(q.get("quant_algo") or inner.get("quant_algo") or "").upper()
    if not method and not algo:
        return ExpertQuant("bf16", "unquantised checkpoint")
    if method == "modelopt_fp4" or "NVFP4" in algo or (method.startswith("modelopt") and "FP4" in algo):
        return ExpertQuant("nvfp4", f"{method} {algo}".strip())
    if method == "mxfp4" or "MXFP4" in algo:
        return ExpertQuant("mxfp4", method or algo)
    if method == "fp8":
        block = q.get("weight_block_size")
        if block is not None and [int(b) for b in block] == [128, 128]:
            return ExpertQuant("fp8_block128", "fp8, weight_block_size [128, 128]")
        return ExpertQuant("fp8_other", f"fp8, weight_block_size {block}")
    return ExpertQuant("other", method or algo)


# Which SGLang 0.5.23 code builds MegaMoE expert weights, per (expert format, SM major). Anything absent has no
# builder: its layers are never ready and every batch would miss.
_BUILDERS = {
    ("fp8_block128", 9): "Fp8MoEMethod -> build_sm90_mega_moe_experts_weights (quantization/fp8.py:2266-2272)",
    ("nvfp4", 10): "ModelOptNvFp4FusedMoEMethod._build_mega_moe_weights (quantization/modelopt_quant.py:2726-2728)",
    ("mxfp4", 10): "Mxfp4MoEMethod (quantization/mxfp4.py:694-725)",
}


def builder_for(quant: ExpertQuant, sm: int) -> Optional[str]:
    return _BUILDERS.get((quant.kind, sm // 10))


def quant_problem(quant: ExpertQuant, sm: Optional[int]) -> Optional[str]:
    if sm is None:
        return "no CUDA GPU is visible: the MegaMoE kernels need SM90 (block-FP8 experts) or SM100 (FP4 experts)"
    if builder_for(quant, sm) is not None:
        return None
    if quant.kind == "bf16":
        why = "bf16/fp16 experts have no MegaMoE kernel in SGLang 0.5.23 (DeepGEMM's bf16 MegaMoE is not wired)"
    elif quant.kind in ("nvfp4", "mxfp4") and sm // 10 == 9:
        why = (f"{quant.kind.upper()} experts need the FP4 MegaMoE kernels, which are SM100-only; this GPU is SM{sm} "
               "(on SM90 only block-FP8 experts run MegaMoE)")
    elif quant.kind == "fp8_block128":
        why = f"block-FP8 experts run MegaMoE on SM90 only; this GPU is SM{sm} (on SM100 MegaMoE needs FP4 experts)"
    elif quant.kind == "fp8_other":
        why = f"FP8 experts without 128x128 block scales ({quant.detail}) have no MegaMoE builder"
    else:
        why = f"quantisation {quant.detail!r} has no MegaMoE builder on SM{sm}"
    return why + "; use another --moe-a2a-backend for this checkpoint"


_EXCLUDE_KEYS = ("ignored_layers", "ignore", "modules_to_not_convert", "exclude_modules", "exclude_layers")
_LAYER_RE = re.compile(r"layers\.(\d+)\.mlp(?:\.experts\b|$)")


def excluded_moe_layers(hf_quant_config: Optional[Mapping[str, Any]]) -> dict[int, list[str]]:
    """Layer index -> the quantisation-exclusion entries that leave that layer's routed experts unquantised."""
    q = dict(hf_quant_config or {})
    inner = q.get("quantization") if isinstance(q.get("quantization"), Mapping) else {}
    out: dict[int, list[str]] = {}
    for key in _EXCLUDE_KEYS:
        for entry in list(q.get(key) or []) + list(inner.get(key) or []):
            m = _LAYER_RE.search(str(entry))
            if m:
                out.setdefault(int(m.group(1)), []).append(str(entry))
    return out


# ---------------------------------------------------------------- token budget: what SGLang's check leaves out

def decode_problems(*, cap: int, max_running_requests: Optional[int], attn_dp_size: int, tp_size: int,
                    tokens_per_request: int, disaggregation_mode: str, enable_mixed_chunk: bool,
                    chunked_prefill_size: Optional[int]) -> list[str]:
    """SGLang's `validate_mega_moe_token_budget` (arg_groups/mega_moe_hook.py:161-256) bounds decode by the
    largest CUDA-graph bucket, min'ed with the request cap (:94-106). A decode batch above the largest bucket runs
    eagerly with up to max_running_requests / attn_dp_size requests, so that product is the real bound; with
    --enable-mixed-chunk a prefill chunk also carries the running decode tokens."""
    if disaggregation_mode == "prefill":
        return []
    if max_running_requests is None:
        return [
            "--max-running-requests is not set, so nothing bounds an eager decode batch; set it to at most "
            f"{cap // max(tokens_per_request, 1) * max(attn_dp_size, 1)} (cap {cap} tokens per rank / "
            f"{tokens_per_request} tokens per request x {attn_dp_size} DP ranks)"
        ]
    per_rank = -(-max_running_requests // max(attn_dp_size, 1))
    decode_tokens = per_rank * tokens_per_request
    problems = []
    if decode_tokens > cap:
        problems.append(
            f"a decode batch can carry {per_rank} requests x {tokens_per_request} tokens = {decode_tokens} tokens "
            f"per rank (--max-running-requests {max_running_requests} over {attn_dp_size} DP ranks), above the cap "
            f"{cap}; lower --max-running-requests to {cap // tokens_per_request * attn_dp_size} or raise "
            "SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK"
        )
    if enable_mixed_chunk and chunked_prefill_size and disaggregation_mode != "decode":
        chunk = -(-chunked_prefill_size // max(attn_dp_size, 1))
        if chunk + decode_tokens > cap:
            problems.append(
                f"--enable-mixed-chunk: a prefill chunk ({chunk}) plus the running decode tokens ({decode_tokens}) "
                f"can reach {chunk + decode_tokens} tokens per rank, above the cap {cap}"
            )
    return problems


# ---------------------------------------------------------------- the launch check

@dataclass(frozen=True)
class LaunchFacts:
    arch: str
    quantization: Optional[str]
    hf_quant_config: Mapping[str, Any]
    sm: Optional[int]  # SM of this node's GPUs (90, 100, ...), None when none is visible
    num_hidden_layers: int
    speculative: bool
    enable_w4a4_mxfp4_megamoe: bool
    cap: int
    deep_gemm_api: frozenset[str]  # public names of the importable deep_gemm, empty when it does not import
    deep_gemm_error: str = ""
    retired_env: Mapping[str, str] = field(default_factory=dict)  # retired names that are set -> their value
    decode: tuple[str, ...] = ()  # decode_problems(...) for this launch


SM90_KERNEL_API = frozenset({"fp8_mega_moe", "mega_moe_pre_dispatch_sm90", "get_symm_buffer_for_mega_moe"})
SM100_KERNEL_API = frozenset({"fp8_fp4_mega_moe", "mega_moe_pre_dispatch", "get_symm_buffer_for_mega_moe"})


def kernel_api_problem(sm: int, api: Iterable[str], error: str = "") -> Optional[str]:
    api = frozenset(api)
    if not api:
        return f"deep_gemm does not import ({error or 'not installed'}); MegaMoE runs DeepGEMM's kernels"
    need = SM90_KERNEL_API if sm // 10 == 9 else SM100_KERNEL_API
    missing = sorted(need - api)
    if missing:
        return (f"the installed deep_gemm lacks {missing}, which MegaMoE on SM{sm} calls; install the sgl-deep-gemm "
                "SGLang pins")
    return None


def check_launch(f: LaunchFacts) -> list[str]:
    """Every reason this GLM launch could miss the MegaMoE kernel; [] when every batch of every layer takes it."""
    problems: list[str] = []
    for name, value in f.retired_env.items():
        problems.append(f"{name}={value!r} is retired and does nothing in SGLang 0.5.23; use {RETIRED_ENV[name]}")
    if f.arch in GLM_NO_MEGAMOE_ARCHS:
        problems.append(f"{f.arch}'s MoE block has no MegaMoE path in SGLang 0.5.23, so every batch would run the "
                        "stock fused MoE, which is wrong under megamoe for tp > 1; use another --moe-a2a-backend")
        return problems
    quant = classify_experts(f.quantization, f.hf_quant_config)
    qp = quant_problem(quant, f.sm)
    if qp:
        problems.append(qp)
    if f.sm is not None and f.sm // 10 == 9 and f.enable_w4a4_mxfp4_megamoe:
        problems.append("--enable-w4a4-mxfp4-megamoe selects an FP4 MegaMoE kernel, which is SM100-only; drop it "
                        "on SM90")
    for layer, entries in sorted(excluded_moe_layers(f.hf_quant_config).items()):
        if layer >= f.num_hidden_layers and not f.speculative:
            continue  # the MTP layer is only built for speculative decoding
        problems.append(f"layer {layer}'s experts are excluded from quantisation ({', '.join(entries[:3])}), so "
                        "they stay unquantised and have no MegaMoE builder; use another --moe-a2a-backend")
    if f.sm is not None and not qp:
        kp = kernel_api_problem(f.sm, f.deep_gemm_api, f.deep_gemm_error)
        if kp:
            problems.append(kp)
    problems.extend(f.decode)
    return problems


def launch_message(arch: str, problems: list[str]) -> str:
    return (f"sglang-glm-ext megamoe: {arch} with --moe-a2a-backend megamoe would return wrong tokens or fail on "
            "some batch, so the launch is refused:\n  - " + "\n  - ".join(problems))


# ---------------------------------------------------------------- load-time readiness (per layer)

def not_ready_reason(*, built: bool, sm: int, sm90_fp8_weights: bool, has_sm90_api: bool, quant_method: str) -> str:
    """Why SGLang's `is_mega_moe_experts_ready` (layers/moe/mega_moe.py:163-169) says no for one layer."""
    if not built:
        return f"its quant method {quant_method} built no MegaMoE weights on SM{sm}"
    if sm == 90 and not sm90_fp8_weights:
        return "its MegaMoE weights are not the SM90 block-FP8 kind, the only one SM90 runs"
    if sm == 90 and not has_sm90_api:
        return "deep_gemm lacks fp8_mega_moe / mega_moe_pre_dispatch_sm90"
    if sm // 10 != 10 and sm != 90:
        return f"SM{sm} runs no MegaMoE kernel"
    return "SGLang reports it not ready"
