"""MegaMoE: DeepGEMM's fused FP4/FP8 MoE kernels for GLM MoE layers (seed lines 1-29; line 30, the
`--moe-a2a-backend megamoe` choice, is upstream and guarded by tests/regression/test_megamoe_a2a_backend.py).

Today this folder holds only its part of `doctor` (can this node run FP4 MegaMoE?). Its Feature, flags and
patches arrive with the MegaMoE issues, in the same shape as every other feature folder.
"""
