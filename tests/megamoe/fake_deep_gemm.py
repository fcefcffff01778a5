"""A fake `deep_gemm` for CPU tests, in SGLang's own test style (test_mega_moe_deepgemm_api.py puts a ModuleType
in sys.modules): it records every call with its arguments, and its SM90 MegaMoE kernel computes what the real one
does, in torch.

The SM90 path SGLang 0.5.23 drives (`run_mega_routed_experts` -> `run_sm90_mega_routed`): a symmetric buffer from
`get_symm_buffer_for_mega_moe`, `mega_moe_pre_dispatch_sm90` copies this rank's rows, ids and weights (scaled by
the routed-scaling factor) into it, `fp8_mega_moe` dispatches every token to the ranks holding its experts, runs
them and combines the weighted outputs back to the token's own rank. Here the buffer keeps rows unquantised, and
with a torch.distributed group of several ranks the "kernel" all-gathers the buffers, runs this rank's experts
(`sglang_glm_ext.megamoe.sm90_fp8.reference_moe` on the interleaved weights) and all-reduces: the same combine.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from sglang_glm_ext.megamoe import sm90_fp8


class Buffer:
    def __init__(self, group, num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden,
                 num_shared_experts, mma_type, activation):
        self.group = group
        self.num_experts = num_experts
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.num_topk = num_topk
        self.hidden = hidden
        self.intermediate_hidden = intermediate_hidden
        self.num_shared_experts = num_shared_experts
        self.mma_type = mma_type
        self.activation = activation
        self.x = torch.zeros(num_max_tokens_per_rank, hidden, dtype=torch.float32)
        self.x_sf = torch.ones(num_max_tokens_per_rank, hidden // 128, dtype=torch.float32)
        self.topk_idx = torch.full((num_max_tokens_per_rank, num_topk), -1, dtype=torch.int32)
        self.topk_weights = torch.zeros(num_max_tokens_per_rank, num_topk, dtype=torch.float32)
        self.x_scales = torch.ones(num_max_tokens_per_rank, dtype=torch.float32)
        self.num_tokens = 0


class FakeDeepGemm(types.ModuleType):
    def __init__(self):
        super().__init__("deep_gemm")
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.buffers: list[Buffer] = []
        self._num_sms = 132
        # A module's dir() is its __dict__: put the API there, as the real module has it (probes list dir()).
        for name in ("get_num_sms", "set_num_sms", "get_symm_buffer_for_mega_moe", "mega_moe_pre_dispatch_sm90",
                     "fp8_mega_moe", "get_block_m_for_mega_moe", "mega_moe_pre_dispatch", "fp8_fp4_mega_moe"):
            setattr(self, name, getattr(self, name))
        # The SM100 FP4 kernel's expert math, set by a test: fn(x fp32 [T, H], ids [T, k] (global, -1 = none),
        # weights fp32 [T, k], rank, num_local) -> fp32 [T, H], this rank's experts only. The fake does the
        # dispatch and the combine around it, as for SM90.
        self.fp4_experts = None

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def get_num_sms(self):
        return self._num_sms

    def set_num_sms(self, n):
        self.calls.append(("set_num_sms", {"n": n}))
        self._num_sms = n

    def get_symm_buffer_for_mega_moe(self, group, num_experts, num_max_tokens_per_rank, num_topk, hidden,
                                     intermediate_hidden, num_shared_experts=0, mma_type="fp8xfp4",
                                     activation="swiglu"):
        self.calls.append(("get_symm_buffer_for_mega_moe", dict(
            num_experts=num_experts, num_max_tokens_per_rank=num_max_tokens_per_rank, num_topk=num_topk,
            hidden=hidden, intermediate_hidden=intermediate_hidden, num_shared_experts=num_shared_experts,
            mma_type=mma_type, activation=activation)))
        buf = Buffer(group, num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden,
                     num_shared_experts, mma_type, activation)
        self.buffers.append(buf)
        return buf

    def mega_moe_pre_dispatch_sm90(self, x, topk_ids, topk_weights, buf_x, buf_x_sf, buf_topk_idx,
                                   buf_topk_weights, num_tokens, group_size=128, routed_scaling_factor=1.0):
        self.calls.append(("mega_moe_pre_dispatch_sm90", dict(
            num_tokens=num_tokens, group_size=group_size, routed_scaling_factor=routed_scaling_factor,
            x_shape=tuple(x.shape), ids_dtype=topk_ids.dtype, weights_dtype=topk_weights.dtype,
            ids_shape=tuple(topk_ids.shape), ids=topk_ids.clone(), weights=topk_weights.clone())))
        assert num_tokens <= buf_x.shape[0]
        buf_x[:num_tokens] = x[:num_tokens].float()
        buf_topk_idx[:num_tokens] = topk_ids[:num_tokens]
        buf_topk_weights[:num_tokens] = topk_weights[:num_tokens] * routed_scaling_factor
        owner = next(b for b in self.buffers if b.x is buf_x)
        owner.num_tokens = num_tokens

    def fp8_mega_moe(self, y, l1_weights, l2_weights, sym_buffer, cumulative_local_expert_recv_stats=None,
                     recipe=(128, 128, 128), activation="swiglu", activation_clamp=None, fast_math=True):
        buf = sym_buffer
        self.calls.append(("fp8_mega_moe", dict(
            recipe=recipe, activation=activation, activation_clamp=activation_clamp, fast_math=fast_math,
            y_shape=tuple(y.shape), l1=l1_weights, l2=l2_weights, num_tokens=buf.num_tokens)))
        (w13, s13), (w2, s2) = l1_weights, l2_weights
        local = w13.shape[0]

        def experts(x, ids, w, rank):
            return sm90_fp8.reference_moe(x, ids, w, w13, s13, w2, s2, routed_scaling_factor=1.0,
                                          w13_interleaved=True, activation_clamp=activation_clamp,
                                          expert_offset=rank * local)
        self._dispatch_combine(y, buf, experts)

    def mega_moe_pre_dispatch(self, x, topk_idx, topk_weights, buf_x, buf_x_sf, buf_topk_idx, buf_topk_weights,
                              num_tokens, group_size=32, mma_type="fp8xfp4", buf_x_scales=None, expert_scales=None):
        self.calls.append(("mega_moe_pre_dispatch", dict(
            num_tokens=num_tokens, group_size=group_size, mma_type=mma_type, x_scales=buf_x_scales is not None,
            ids=topk_idx.clone(), weights=topk_weights.clone())))
        assert num_tokens <= buf_x.shape[0]
        buf_x[:num_tokens] = x[:num_tokens].float()
        buf_topk_idx[:num_tokens] = topk_idx[:num_tokens]
        buf_topk_weights[:num_tokens] = topk_weights[:num_tokens]  # routed scaling already folded by SGLang
        next(b for b in self.buffers if b.x is buf_x).num_tokens = num_tokens

    def fp8_fp4_mega_moe(self, y, l1_weights, l2_weights, sym_buffer, shared_l1_weights=None,
                         shared_l2_weights=None, cumulative_local_expert_recv_stats=None, recipe=(1, 1, 32),
                         activation="swiglu", activation_clamp=None, fast_math=True, use_x_scales=False,
                         l1_alphas=None, l2_alphas=None, l2_act_scales=None, weight_layout="megamoe", **kwargs):
        buf = sym_buffer
        self.calls.append(("fp8_fp4_mega_moe", dict(
            recipe=recipe, activation=activation, use_x_scales=use_x_scales, weight_layout=weight_layout,
            l1=l1_weights, l2=l2_weights, l1_alphas=l1_alphas, l2_alphas=l2_alphas, l2_act_scales=l2_act_scales,
            shared=shared_l1_weights is not None, y_shape=tuple(y.shape), num_tokens=buf.num_tokens)))
        assert self.fp4_experts is not None, "the test gives the fake FP4 kernel its expert math (fp4_experts)"
        local = l1_weights[0].shape[0]
        self._dispatch_combine(y, buf, lambda x, ids, w, rank: self.fp4_experts(x, ids, w, rank, local))

    def _dispatch_combine(self, y, buf, experts):
        """Every rank's buffered rows to every rank, this rank's experts on them, the weighted outputs summed back
        to each token's own rank (an all-reduce here): what the fused kernel's dispatch and combine do."""
        n = buf.num_tokens
        x, ids, w = buf.x[:n], buf.topk_idx[:n], buf.topk_weights[:n]
        group = buf.group
        world = group.size() if group is not None else 1
        rank = group.rank() if group is not None else 0
        if world > 1:
            import torch.distributed as dist

            counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
            dist.all_gather(counts, torch.tensor([n], dtype=torch.int64), group=group)
            cap = buf.num_max_tokens_per_rank
            gx = [torch.zeros(cap, buf.hidden) for _ in range(world)]
            gi = [torch.full((cap, buf.num_topk), -1, dtype=torch.int32) for _ in range(world)]
            gw = [torch.zeros(cap, buf.num_topk) for _ in range(world)]
            dist.all_gather(gx, buf.x, group=group)
            dist.all_gather(gi, buf.topk_idx, group=group)
            dist.all_gather(gw, buf.topk_weights, group=group)
            sizes = [int(c.item()) for c in counts]
            x = torch.cat([gx[r][:sizes[r]] for r in range(world)])
            ids = torch.cat([gi[r][:sizes[r]] for r in range(world)])
            w = torch.cat([gw[r][:sizes[r]] for r in range(world)])
        out = experts(x, ids, w, rank)
        if world > 1:
            import torch.distributed as dist

            dist.all_reduce(out, group=group)  # the combine: every expert's weighted output back to its token
            start = sum(sizes[:rank])
            out = out[start:start + n]
        y[:n] = out.to(y.dtype)

    def get_block_m_for_mega_moe(self, **kwargs):
        self.calls.append(("get_block_m_for_mega_moe", kwargs))
        return 64


def install(monkeypatch) -> FakeDeepGemm:
    import sys

    fake = FakeDeepGemm()
    monkeypatch.setitem(sys.modules, "deep_gemm", fake)
    return fake
