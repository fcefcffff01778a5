"""Startup refusals for GLM models under --moe-a2a-backend megamoe. Pure; no SGLang import.

Every launch where some batch could miss the MegaMoE kernel is refused here with the fix in the message, because
the miss would run SGLang's stock fused-MoE path, which under megamoe computes each token with only its own
rank's experts (docs_internal/megamoe.md). What can miss, in SGLang 0.5.23:

- a GLM architecture whose MoE block has no MegaMoE branch at all (`Glm4MoeLiteSparseMoeBlock`);
- expert weights for which no MegaMoE builder exists on this SM (bf16 experts, experts excluded from
  quantisation, FP8 on SM100, NVFP4 / MXFP4 on SM90, any other method): the layer is never "ready";
- a batch above SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK on any rank: `budget_problems` bounds each
  rank's real largest prefill, decode, verify and draft batch (SGLang's own check divides a DP-attention chunk twice,
  skips PP dynamic chunking and misses the eager-decode padding and the adaptive / top-k draft width);
- GLM-4.x with redundant experts (its block builds none);
- a deep_gemm without the kernel this SM needs.

The hooks gather plain facts (`LaunchFacts`, `BudgetFacts`) from SGLang's resolved server arguments and the model
config, and raise `MegaMoELaunchError` with every problem found, one line each naming the fix.
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


# Which layout the miss path's runner reads, per expert format and SM (miss_hooks.fallback_kind checks each layer
# at load): the MegaMoE kernel cannot take a batch above the cap, or any batch of a layer it cannot read, and
# SGLang's own runner then serves it over the gathered rows (miss.py).
FALLBACKS = {
    "sm90_relayout": "block-FP8 experts on SM90: w13 is laid back to [gate; up] around SGLang's FP8 runner for the "
                     "miss, then interleaved again (no copy kept)",
    "stock": "experts MegaMoE does not read keep their checkpoint layout: SGLang's runner for it",
    "nvfp4_trtllm": "NVFP4 experts keep FlashInfer's TRTLLM layout (the kernel reads it too): SGLang's TRTLLM runner",
}


def fallback_for(quant: ExpertQuant, sm: Optional[int], *, keep_trtllm: bool = True) -> Optional[str]:
    """The layout kept for the miss path (a FALLBACKS key), or None when the layer keeps none SGLang can run here."""
    if sm is None or sm // 10 not in (9, 10):  # megamoe runs on SM90 / SM100 only (mega_moe_hook.py:38-48)
        return None
    major = sm // 10
    if quant.kind == "fp8_block128":
        return "sm90_relayout" if major == 9 else "stock"
    if quant.kind in ("bf16", "fp8_other"):
        return "stock"
    if quant.kind == "nvfp4" and major == 10 and keep_trtllm:
        return "nvfp4_trtllm"
    return None


def no_fallback_why(quant: ExpertQuant, sm: Optional[int]) -> str:
    if quant.kind == "mxfp4":
        return ("MXFP4 experts are repacked in place for the MegaMoE kernel and keep no layout another runner reads "
                "(deep_gemm's TRTLLM layout is NVFP4-only)")
    if quant.kind == "nvfp4":
        return ("NVFP4 experts keep FlashInfer's TRTLLM layout for the miss path only on SM100 with the TRTLLM runner "
                "and SGLANG_GLM_EXT_MEGAMOE_FP4_KEEP_TRTLLM=1")
    return f"quantisation {quant.detail!r} keeps no layout the plugin's miss path runs"


def quant_problem(quant: ExpertQuant, sm: Optional[int], *, keep_trtllm: bool = True) -> Optional[str]:
    """Why this GLM launch's experts can be served neither by the MegaMoE kernel nor by the miss path."""
    if sm is None:
        return "no CUDA GPU is visible: the MegaMoE kernels need SM90 (block-FP8 experts) or SM100 (FP4 experts)"
    if builder_for(quant, sm) is not None or fallback_for(quant, sm, keep_trtllm=keep_trtllm) is not None:
        return None
    if quant.kind in ("nvfp4", "mxfp4") and sm // 10 == 9:
        why = (f"{quant.kind.upper()} experts need the FP4 MegaMoE kernels, which are SM100-only; this GPU is SM{sm} "
               "(on SM90 only block-FP8 experts run MegaMoE), and under megamoe the plugin keeps no layout for "
               "SGLang's Marlin / Triton runner to serve them instead")
    elif quant.kind == "nvfp4":
        why = "NVFP4 experts here keep no layout the miss path runs (SGLANG_GLM_EXT_MEGAMOE_FP4_KEEP_TRTLLM=0?)"
    else:
        why = f"quantisation {quant.detail!r} has no MegaMoE builder on SM{sm} and no layout the miss path runs"
    return why + "; use another --moe-a2a-backend for this checkpoint"


def served_by_miss_path(quant: ExpertQuant, sm: Optional[int], *, keep_trtllm: bool = True) -> Optional[str]:
    """A layer kind MegaMoE cannot read on this GPU but the miss path serves: every batch takes it (said at
    startup). None when the kernel reads these experts."""
    if sm is None or builder_for(quant, sm) is not None:
        return None
    kind = fallback_for(quant, sm, keep_trtllm=keep_trtllm)
    if kind is None:
        return None
    if quant.kind == "bf16":
        what = "bf16/fp16 experts (no MegaMoE kernel reads them)"
    elif quant.kind == "fp8_block128":
        what = f"block-FP8 experts on SM{sm} (MegaMoE runs FP8 on SM90 only)"
    else:
        what = f"{quant.detail or quant.kind} experts (no MegaMoE builder)"
    return f"every MoE layer takes the gathered miss path on every batch: {what}; {FALLBACKS[kind]}"


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


# ---------------------------------------------------------------- token budget: each rank's real largest batch

CAP_ENV = "SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK"


def ceil_align(n: int, a: int) -> int:
    a = max(int(a), 1)
    return -(-int(n) // a) * a


@dataclass(frozen=True)
class BudgetFacts:
    """What bounds the token count a GLM MoE layer's MegaMoE gate compares with the cap, read from SGLang's
    resolved arguments by the launch hook (`hooks.budget_facts`). The gate compares `max(get_dp_global_num_tokens())`
    (each DP rank's padded batch) or, under DSA prefill CP, the rank's own rows (mega_moe.py:186-191)."""

    cap: int
    disaggregation_mode: str = "null"  # null | prefill | decode
    # Prefill. `chunked_prefill_size` is SGLang's resolved value: already per DP rank (parallel_hook.py:327-331
    # divides the operator's value by attn_dp_size); `chunk_asked` is the operator's --chunked-prefill-size.
    chunked_prefill_size: Optional[int] = None
    chunk_asked: Optional[int] = None
    # SGLang's `overrides.max_prefill_buffer_tokens`: the chunk, or under PP dynamic chunking
    # max(chunk, --max-prefill-tokens, 1.25 x chunk) (the dynamic sizer grows chunks towards the former).
    prefill_ceiling: int = 0
    dynamic_chunking: bool = False  # --pp-size > 1 with --enable-dynamic-chunking
    max_prefill_tokens: Optional[int] = None
    prefill_graph_bs: tuple[int, ...] = ()  # captured prefill CUDA-graph sizes; () when prefill graphs are off
    enable_prefill_cp: bool = False  # DSA prefill context parallelism: the gate reads the rank's own rows
    attn_cp_size: int = 1
    # Parallel widths.
    tp_size: int = 1
    attn_tp_size: int = 1
    attn_dp_size: int = 1
    # Decode / verify / draft.
    max_running_requests: Optional[int] = None  # the operator's (global) request cap
    speculative: Optional[str] = None  # the algorithm, None without speculative decoding
    num_draft_tokens: int = 1  # the largest draft width speculative decoding may use (adaptive included)
    static_draft_tokens: int = 1  # --speculative-num-draft-tokens
    eagle_topk: int = 1
    num_steps: int = 0
    multi_layer_eagle: bool = False
    frozen_kv_mtp: bool = False
    decode_graph_bs: tuple[int, ...] = ()  # captured decode CUDA-graph sizes; () when decode graphs are off
    # Every MoE layer keeps a layout SGLang's own runner reads (`fallback_for`): an eager batch above the cap takes
    # the gathered miss path (miss.py) instead of being refused. Captured graphs always run the kernel.
    miss_path: bool = False


@dataclass(frozen=True)
class BudgetResult:
    problems: list[str]  # refusals, one line each with the fix
    served: list[str]  # eager batches above the cap that the miss path serves (logged at startup)


def per_worker_requests(f: BudgetFacts) -> int:
    """Requests one DP rank's scheduler runs at once: max(1, --max-running-requests // attn_dp_size)
    (`KVCacheConfigurator.resolve_max_num_reqs`, mem_cache/kv_cache_configurator.py:3126-3129)."""
    return max(1, int(f.max_running_requests) // max(f.attn_dp_size, 1))


def eager_batch(requests: int, f: BudgetFacts) -> int:
    """SGLang's `get_eager_max_batch_size` (utils/common.py:4188-4195) under megamoe, where MLP sync is always on
    (a2a backend not none: require_attn_tp_gather): aligned to attention TP, then to the CP padding (attn_cp_size,
    twice that for zigzag CP; the larger is taken). The largest decode CUDA-graph bucket is at most the request
    pool aligned to attention TP (`get_batch_sizes_to_capture`), so it is never above this."""
    cp_align = 2 * f.attn_cp_size if f.attn_cp_size > 1 else 1
    return ceil_align(ceil_align(requests, f.attn_tp_size), cp_align)


def decode_width(f: BudgetFacts) -> tuple[int, str]:
    """Rows per request of the widest decode-time forward (target verify, draft decode, draft extend) and why:
    EagerRunner's num_tokens_per_req (model_executor/runner/eager_runner.py:88-104): the target verifies
    max_speculative_num_draft_tokens rows (adaptive speculative decoding sizes to its largest state,
    spec_info.py:268-289); the draft worker runs max(top-k, draft tokens, 2 x steps with multi-layer EAGLE)."""
    if not f.speculative:
        return 1, "1 token per request"
    width, why = f.num_draft_tokens, f"--speculative-num-draft-tokens {f.static_draft_tokens}"
    if f.num_draft_tokens > f.static_draft_tokens:
        why = (f"adaptive speculative decoding can grow to {f.num_draft_tokens} draft tokens "
               "(--speculative-adaptive-config's largest candidate step + 1)")
    if f.eagle_topk > width:
        width, why = f.eagle_topk, f"the draft model decodes --speculative-eagle-topk {f.eagle_topk} rows per request"
    if f.multi_layer_eagle and 2 * f.num_steps > width:
        width, why = 2 * f.num_steps, f"multi-layer EAGLE runs 2 x --speculative-num-steps {f.num_steps} rows"
    return width, why


def budget_problems(f: BudgetFacts) -> list[str]:
    return budget_check(f).problems


def budget_check(f: BudgetFacts) -> BudgetResult:
    """Every batch SGLang's scheduler bounds allow on one rank that would exceed the cap. An eager one is a refusal
    naming the flag to change, or, with the miss path (`f.miss_path`), served by it (`served`). A captured CUDA
    graph always runs the MegaMoE kernel (the gate says yes under capture, mega_moe.py:184), so a captured size
    above the cap is a refusal either way."""
    eager: list[str] = []
    cap = f.cap
    if f.disaggregation_mode != "decode":
        chunk = f.chunked_prefill_size
        if chunk is None or chunk <= 0:
            eager.append(f"chunked prefill is off (--chunked-prefill-size {f.chunk_asked}), so nothing bounds a "
                         f"prefill batch; set --chunked-prefill-size to at most {cap * max(f.attn_dp_size, 1)}")
        else:
            eager.extend(_prefill_problems(f, chunk))
    if f.disaggregation_mode != "prefill":
        eager.extend(_decode_problems(f))
    captured = _captured_problems(f)
    if f.miss_path:
        return BudgetResult(captured, eager)
    return BudgetResult(eager + [p for p in captured if p not in eager], [])


def _captured_problems(f: BudgetFacts) -> list[str]:
    cap, out = f.cap, []
    if f.prefill_graph_bs and f.disaggregation_mode != "decode" and max(f.prefill_graph_bs) > cap:
        out.append(f"a prefill CUDA graph is captured at {max(f.prefill_graph_bs)} tokens per rank, above the cap "
                   f"{cap}, and a captured graph always runs the MegaMoE kernel; lower --cuda-graph-max-bs-prefill "
                   f"to {cap} (or --cuda-graph-backend-prefill disabled) or raise {CAP_ENV} to "
                   f"{max(f.prefill_graph_bs)}")
    if f.decode_graph_bs and f.disaggregation_mode != "prefill":
        width, why = decode_width(f)
        top = max(f.decode_graph_bs)
        if f.max_running_requests is not None:
            top = min(top, ceil_align(per_worker_requests(f), f.attn_tp_size))  # get_batch_sizes_to_capture
        bs = top * (f.eagle_topk if f.frozen_kv_mtp and f.eagle_topk > 1 else 1)
        tokens = ceil_align(bs * width, f.attn_tp_size)
        if tokens > cap:
            fit = (cap // width) // max(f.attn_tp_size, 1) * max(f.attn_tp_size, 1)
            out.append(f"a decode CUDA graph is captured at {top} requests x {width} tokens ({why}) = {tokens} "
                       f"tokens per rank, above the cap {cap}, and a captured graph always runs the MegaMoE kernel; "
                       + (f"lower --cuda-graph-max-bs-decode to {fit}" if fit else "no decode graph size fits")
                       + f" or raise {CAP_ENV} to {tokens}")
    return out


def _prefill_problems(f: BudgetFacts, chunk: int) -> list[str]:
    cap, dp = f.cap, max(f.attn_dp_size, 1)
    ceiling = max(int(f.prefill_ceiling or 0), chunk)
    if f.enable_prefill_cp and f.attn_cp_size > 1:
        tokens, how = -(-ceiling // f.attn_cp_size), f"over {f.attn_cp_size} prefill-CP ranks"
    else:
        tokens = ceil_align(ceiling, f.attn_tp_size)
        how = f"padded to a multiple of attention TP {f.attn_tp_size}" if tokens != ceiling else ""
        over = [b for b in f.prefill_graph_bs if b >= tokens]
        if over and min(over) > tokens:
            tokens, how = min(over), f"padded to the prefill CUDA-graph size {min(over)}"
    if tokens <= cap:
        return []
    source = f"--chunked-prefill-size {f.chunk_asked if f.chunk_asked is not None else chunk}"
    if dp > 1:
        source += f" over {dp} DP ranks = {chunk} per rank"
    if f.dynamic_chunking and ceiling > chunk:
        return [f"with --pp-size > 1 and --enable-dynamic-chunking a prefill chunk can grow to {ceiling} tokens per "
                f"rank (max of the chunk, --max-prefill-tokens {f.max_prefill_tokens} and 1.25 x the chunk), above "
                f"the cap {cap}; drop --enable-dynamic-chunking, or lower --max-prefill-tokens and "
                f"--chunked-prefill-size to {_max_chunk(f, 4 * cap // 5) // dp * dp or dp} tokens, or raise "
                f"{CAP_ENV} to {tokens}"]
    fix = _max_chunk(f, cap)
    lower = (f"lower --chunked-prefill-size to {fix}" if fix > 0 else "no --chunked-prefill-size fits")
    return [f"a prefill batch can reach {tokens} tokens per rank ({source}{', ' + how if how else ''}), above the "
            f"cap {cap}; {lower} or raise {CAP_ENV} to {tokens}"]


def _max_chunk(f: BudgetFacts, cap: int) -> int:
    """The largest operator --chunked-prefill-size whose per-rank batch fits `cap` (graph padding aside)."""
    dp = max(f.attn_dp_size, 1)
    if f.enable_prefill_cp and f.attn_cp_size > 1:
        return cap * f.attn_cp_size
    return (cap // max(f.attn_tp_size, 1)) * max(f.attn_tp_size, 1) * dp


def _decode_problems(f: BudgetFacts) -> list[str]:
    cap, dp = f.cap, max(f.attn_dp_size, 1)
    width, why = decode_width(f)
    lcm_align = _lcm(f.attn_tp_size, 2 * f.attn_cp_size if f.attn_cp_size > 1 else 1)
    fit_per_worker = (cap // width) // lcm_align * lcm_align
    if f.max_running_requests is None:
        return [f"--max-running-requests is not set, so nothing bounds a decode batch; set it to at most "
                f"{fit_per_worker * dp} (cap {cap} tokens per rank / {width} per request ({why}) x {dp} DP ranks)"
                if fit_per_worker else
                f"--max-running-requests is not set, and even one request per rank ({why}) exceeds the cap {cap}; "
                f"raise {CAP_ENV}"]
    per_worker = per_worker_requests(f)
    bs = eager_batch(per_worker, f)
    if f.frozen_kv_mtp and f.eagle_topk > 1:  # the draft batch is expanded by top-k on the bs axis
        bs, why = bs * f.eagle_topk, why + f"; frozen-KV MTP expands the draft batch by top-k {f.eagle_topk}"
    tokens = ceil_align(bs * width, f.attn_tp_size)
    if tokens <= cap:
        return []
    padded = f", padded to {bs} (a multiple of attention TP {f.attn_tp_size})" if bs != per_worker else ""
    fix = (f"lower --max-running-requests to {fit_per_worker * dp}" if fit_per_worker
           else "no --max-running-requests fits")
    return [f"a decode batch can carry {per_worker} requests per rank (--max-running-requests "
            f"{f.max_running_requests} over {dp} DP ranks{padded}) x {width} tokens ({why}) = {tokens} tokens, above "
            f"the cap {cap}; {fix} or raise {CAP_ENV} to {tokens}"]


def _lcm(a: int, b: int) -> int:
    import math

    a, b = max(int(a), 1), max(int(b), 1)
    return a * b // math.gcd(a, b)


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
    budget: tuple[str, ...] = ()  # budget_check(...).problems for this launch
    ep_num_redundant_experts: int = 0
    keep_trtllm: bool = True  # SGLANG_GLM_EXT_MEGAMOE_FP4_KEEP_TRTLLM, with the TRTLLM runner the layer would get


def miss_path_available(f: LaunchFacts) -> bool:
    """Every GLM MoE layer of this launch keeps a layout the miss path runs (excluded layers stay unquantised:
    their checkpoint layout, SGLang's unquantised runner), so an eager batch above the cap can be served."""
    if f.arch in GLM_NO_MEGAMOE_ARCHS:
        return False
    quant = classify_experts(f.quantization, f.hf_quant_config)
    return fallback_for(quant, f.sm, keep_trtllm=f.keep_trtllm) is not None


def served_notes(f: LaunchFacts, budget_served: list[str] = ()) -> list[str]:
    """What this launch serves through the miss path, for the startup log (a default that changes what a launch
    does is said when it starts)."""
    quant = classify_experts(f.quantization, f.hf_quant_config)
    notes = []
    every = served_by_miss_path(quant, f.sm, keep_trtllm=f.keep_trtllm)
    if every:
        notes.append(every)
    for layer, entries in sorted(excluded_moe_layers(f.hf_quant_config).items()):
        if layer >= f.num_hidden_layers and not f.speculative:
            continue
        notes.append(f"layer {layer}'s experts are excluded from quantisation ({', '.join(entries[:3])}): every batch "
                     "of that layer takes the gathered miss path on SGLang's unquantised runner")
    kind = fallback_for(quant, f.sm, keep_trtllm=f.keep_trtllm)
    for line in budget_served:
        notes.append("a batch above the cap takes the gathered miss path (" + FALLBACKS.get(kind or "", "") + "): "
                     + line.split("; ")[0])
    return notes


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
    qp = quant_problem(quant, f.sm, keep_trtllm=f.keep_trtllm)
    if qp:
        problems.append(qp)
    if f.sm is not None and f.sm // 10 == 9 and f.enable_w4a4_mxfp4_megamoe:
        problems.append("--enable-w4a4-mxfp4-megamoe selects an FP4 MegaMoE kernel, which is SM100-only; drop it "
                        "on SM90")
    # Layers excluded from quantisation stay unquantised: SGLang's unquantised runner serves them through the miss
    # path on every batch (served_notes says so at startup); nothing to refuse.
    if f.sm is not None and not qp and builder_for(quant, f.sm) is not None:
        kp = kernel_api_problem(f.sm, f.deep_gemm_api, f.deep_gemm_error)
        if kp:
            problems.append(kp)
    if f.ep_num_redundant_experts > 0 and f.arch in GLM4_BLOCK_ARCHS:
        # SGLang sizes the expert location map for logical + redundant experts (eplb/expert_location.py:236) and
        # DeepseekV2MoE builds that many (deepseek_v2.py:750-755), but Glm4MoeSparseMoeBlock builds only the
        # routed ones (glm4_moe.py:436-446): TopK would route to physical ids no rank holds.
        problems.append(f"--ep-num-redundant-experts {f.ep_num_redundant_experts}: SGLang 0.5.23's GLM-4 MoE block "
                        "builds no redundant expert slots, so tokens would be routed to experts no rank holds; set "
                        "--ep-num-redundant-experts 0 (EPLB without redundant experts still rebalances)")
    problems.extend(f.budget)
    return problems


PREFIX = "sglang-glm-ext megamoe"


def launch_message(arch: str, problems: list[str]) -> str:
    """One line per refusal, each naming the fix (as the plugin's other launch refusals are)."""
    return "\n".join(f"{PREFIX}: {arch}: {p}" for p in problems)


def retired_message(retired: Mapping[str, str]) -> str:
    """The fork's switches set on a launch that did not ask for megamoe: they do nothing, so say what replaces
    them (and nothing about megamoe's results)."""
    return "\n".join(f"sglang-glm-ext: {n}={v!r} is a retired fork switch that SGLang 0.5.23 ignores; unset it "
                     f"(use {RETIRED_ENV[n]})" for n, v in retired.items())


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
