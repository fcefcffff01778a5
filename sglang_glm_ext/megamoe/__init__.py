"""megamoe: DeepGEMM's fused MegaMoE kernel for GLM MoE layers, and no silent wrong answer when a batch cannot take it.

Carries seed lines 10-19 (GLM MoE MegaMoE fast path, shared expert TP1) and 30 (`--moe-a2a-backend megamoe`,
upstream since 0.5.20; the fork's env switches are retired, see `retired.py`). Switched on by SGLang's own
`--moe-a2a-backend megamoe` (or its alias `--moe-runner-backend megamoe`), not by a plugin flag.

Under megamoe SGLang hands every rank's MoE block a different slice of the tokens and sums nothing afterwards
(docs_internal/megamoe.md), so SGLang's stock fused-MoE path is silently wrong there for tp > 1, for
GLM-4.x's `Glm4MoeSparseMoeBlock` and for GLM-5.x's `DeepseekV2MoE` alike. The plugin therefore makes every GLM
MoE layer take the MegaMoE kernel, refuses at startup every configuration where a batch could miss it, and
raises (on every rank alike) rather than run the stock path if one ever does.

Pure core (no SGLang, no deep_gemm at import): `select` (the per-batch decision), `routing` (router output ->
the kernel's ids and weights), `glm4` (a GLM-4 block's plan and the arguments handed to the kernel runner),
`sm90_fp8` (the SM90 FP8 weight layout and a dequantised reference of the kernel), `guard` (startup refusals),
`hardware` (which MegaMoE kernels this machine can run; doctor's part). `hooks` is the thin SGLang side,
declared in sglang_glm_ext/patches.py.
"""
