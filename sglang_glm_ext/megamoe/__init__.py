"""megamoe: DeepGEMM's fused MegaMoE kernels for GLM MoE layers, FP4 MegaMoE weights that keep the TRTLLM layout,
and no silent wrong answer when a batch cannot take the kernel.

Carries seed lines 1-30: 1-9 (FP4 scale group from the loaded tensors), 10-19 (GLM MoE MegaMoE fast path, shared
expert TP1), 20-29 (NVFP4 MegaMoE weights keep the TRTLLM layout; the model-agnostic forward is upstream) and 30
(`--moe-a2a-backend megamoe`, upstream since 0.5.20; the fork's env switches are retired: `guard.RETIRED_ENV`).
Switched on by SGLang's own `--moe-a2a-backend megamoe` (or its alias `--moe-runner-backend megamoe`), not by a
plugin flag (`feature.FEATURE.active_when`).

Under megamoe SGLang hands every rank's MoE block a different slice of the tokens and sums nothing afterwards
(docs_internal/megamoe.md), so SGLang's stock fused-MoE path is silently wrong there for tp > 1, for GLM-4.x's
`Glm4MoeSparseMoeBlock` and for GLM-5.x's `DeepseekV2MoE` alike. The plugin therefore never runs it: a batch takes
the MegaMoE kernel or, when the kernel cannot take it, the gathered miss path (`miss`, `miss_hooks`: rows and
routing all-gathered over the EP group, this rank's experts through SGLang's own runner, partial sums
reduce-scattered back), decided alike on every rank; only layers keeping no layout for the miss are held to the
cap at startup. FP4 experts (docs_internal/megamoe_fp4.md): ModelOpt
NVFP4 keeps FlashInfer's TRTLLM layout and MegaMoE reads the same storage (`weight_layout="trtllm"`); NVFP4 and
MXFP4 scale groups are checked against what the checkpoint loaded; MXFP4 says at startup it keeps no fallback.

Pure core (no SGLang, no deep_gemm at import): `select` (the per-batch decision), `routing` (router output -> the
kernel's ids and weights), `glm4` (a GLM-4 block's plan and the arguments handed to the kernel runner), `sm90_fp8`
(the SM90 FP8 weight layout and a dequantised reference of the kernel), `miss` (the miss path's collectives and
counters), `guard` (startup refusals and what the miss path serves), `fp4_layout`
(FP4 recipes and scale-group checks, the MegaMoE shape rule, NVFP4 alphas, the MegaMoE views of the TRTLLM
tensors, memory accounting), `hardware` (which MegaMoE kernels this machine and its deep_gemm can run).
The SGLang side: `reads` (what both hook files read off a layer: the switch, gate inputs, block plan; no SGLang
at import), `hooks` (GLM MoE layers, launch and load checks), `miss_hooks` (the miss path's layouts and
runner), `weight_update` (weight updates) and `fp4_hooks` (FP4 weights), declared in
`patches`; `feature` (FEATURE, its env vars); `doctor` (its part of `sglang-glm-ext doctor`).
"""
