"""megamoe: DeepGEMM's MegaMoE kernel for GLM MoE layers.

FP4 weights (seed lines 1-9 and 20-29): `fp4_layout` is the pure core (FP4 recipes and scale-group checks,
the MegaMoE shape rule, NVFP4 alphas, the MegaMoE views of FlashInfer's TRTLLM tensors, memory accounting);
it imports no SGLang. `fp4_hooks` is the thin SGLang side, declared in sglang_glm_ext/patches.py: under
`--moe-a2a-backend megamoe`, ModelOpt NVFP4 experts keep FlashInfer's TRTLLM layout and MegaMoE reads the same
storage (`weight_layout="trtllm"`); MXFP4 experts are validated and say at startup that they keep no fallback.
`fp4_doctor` is doctor's part. docs_internal/megamoe_fp4.md has the layouts, the memory and what is unverified.
"""
