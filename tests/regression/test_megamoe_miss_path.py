"""Under --moe-a2a-backend megamoe, SGLang 0.5.23's stock MoE path is silently wrong for tp > 1, for the GLM-4.x
block and for GLM-5.x's DeepSeek-V2 MoE alike. This pins the upstream facts the plugin's refusals rest on
(docs_internal/megamoe.md has the file:line reading); when a later SGLang changes one of them, this module fails
and the megamoe patches' remove_when needs a look.

Facts, each checked on the installed code:
1. The layer-boundary contract that the models' own `stage_facts` declare: with megamoe the FFN input is this
   rank's slice of the rows (sharded over attention TP) and its output owes no sum (complete); with backend none
   the input is every row and the output is summed over the MoE output group (the control).
2. `StandardDispatcher` (megamoe's dispatcher) gathers nothing: it keeps the rank's rows and maps the other
   ranks' experts to -1, so the stock runner computes only local experts.
3. DeepSeek-V2's miss path adds its replicated (TP1) shared expert only where `adds_replicated_output_to_partial`
   says so, and under megamoe that is TP rank 0 only (megamoe is not among the "complete" backends).
Together: each token of a stock fallback gets only its own rank's experts (and, for DeepSeek-V2 on ranks != 0,
no shared expert), and nothing adds the rest. `test_stock_fallback_result_is_wrong_per_rank` does that arithmetic.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from sglang.srt.layers.layer_boundary.construction import BatchVariant
from sglang.srt.layers.layer_boundary.layout import SumGroup, TokenAxis
from sglang.srt.layers.moe import utils as moe_utils
from sglang.srt.layers.moe.utils import MoeA2ABackend
from sglang.test import boundary_fixtures as bf
from sglang.test.communicator_patch import patch_communicator

from sglang_glm_ext.megamoe import sm90_fp8

REAL_SCATTERED = inspect.unwrap(moe_utils.is_moe_input_scattered_across_dp_ranks)


def _layer_classes():
    from sglang.srt.models.deepseek_v2 import DeepseekV2DecoderLayer, DeepseekV2ForCausalLM
    from sglang.srt.models.glm4_moe import Glm4MoeDecoderLayer, GlmMoeDsaForCausalLM

    # GLM-5.x's model class is DeepSeek-V2's, so its sparse layers are DeepseekV2DecoderLayer + DeepseekV2MoE.
    assert issubclass(GlmMoeDsaForCausalLM, DeepseekV2ForCausalLM)
    return {"glm4": Glm4MoeDecoderLayer, "glm5_dsv2": DeepseekV2DecoderLayer}


def ffn_contract(layer_cls, backend: str, tp: int = 2, scattered=REAL_SCATTERED):
    """The ORDINARY-batch edge of the sparse FFN stage a layer of `layer_cls` declares, on a tp-rank attention-TP
    group, with the real `is_moe_input_scattered_across_dp_ranks` reading the a2a backend."""
    cfg = SimpleNamespace(n_routed_experts=8, first_k_dense_replace=1, moe_layer_freq=1)
    parallel = bf.parallel_of(attn_dp=1, attn_tp=tp, moe_ep_size=tp, moe_tp_size=1)
    with bf.planning(parallel, a2a=False), \
            mock.patch.object(moe_utils, "get_moe_a2a_backend", lambda: MoeA2ABackend(backend)), \
            patch_communicator("is_moe_input_scattered_across_dp_ranks", scattered):
        attn, ffn = layer_cls.stage_facts(cfg, 2)
        assert ffn.sparse, "layer 2 of this config must be a MoE layer"
        _, ffn_stage = bf.build_stages((attn, bf.Norm()), (ffn, bf.Norm()))
    return ffn_stage.plan.edges[BatchVariant.ORDINARY]


def check_megamoe_ffn_is_rank_local_and_complete(layer_cls, scattered=REAL_SCATTERED) -> None:
    mega = ffn_contract(layer_cls, "megamoe", scattered=scattered)
    assert TokenAxis.ATTN_TP in mega.incoming.need.layout.sharded, (
        "under megamoe the MoE input is no longer this rank's slice of the rows")
    assert mega.outgoing.produced.group is None, (
        f"under megamoe the MoE output now owes a sum ({mega.outgoing.produced.group}): the stock fallback may be "
        "correct now; revisit the plugin's refusals")
    none = ffn_contract(layer_cls, "none")  # control: the check can tell the two apart
    assert not none.incoming.need.layout.sharded and none.outgoing.produced.group is SumGroup.MOE_OUTPUT


@pytest.mark.parametrize("model", ["glm4", "glm5_dsv2"])
def test_megamoe_ffn_contract_is_rank_local_and_complete(model):
    check_megamoe_ffn_is_rank_local_and_complete(_layer_classes()[model])


def test_check_detects_a_contract_that_gathers():
    # A later SGLang that gave megamoe's MoE every row (and so owed a sum) must make the check fail.
    with pytest.raises(AssertionError):
        check_megamoe_ffn_is_rank_local_and_complete(_layer_classes()["glm4"], scattered=lambda: False)


def dispatch_on_rank(rank: int, ep: int, topk_ids: torch.Tensor, hidden: torch.Tensor, num_experts: int):
    import sglang.srt.layers.moe.token_dispatcher.standard as standard
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    with mock.patch.object(standard, "get_parallel", lambda: SimpleNamespace(moe_ep_size=ep, moe_ep_rank=rank)), \
            mock.patch.object(standard, "should_use_flashinfer_cutlass_moe_fp4_allgather", lambda: False), \
            mock.patch.object(standard, "get_device", lambda: "cpu"):
        config = SimpleNamespace(runner_backend=None, num_experts=num_experts, num_local_experts=num_experts // ep,
                                 num_fused_shared_experts=0)
        dispatcher = standard.StandardDispatcher(config)
        out = dispatcher.dispatch(hidden, StandardTopKOutput(torch.ones_like(topk_ids, dtype=torch.float32),
                                                             topk_ids, None))
    return out


def check_dispatcher_keeps_rows_and_drops_remote_experts() -> None:
    ids = torch.tensor([[0, 5], [3, 4], [6, 7]], dtype=torch.int32)  # experts 0-3 on rank 0, 4-7 on rank 1
    hidden = torch.randn(3, 16)
    out = dispatch_on_rank(0, 2, ids, hidden, 8)
    assert out.hidden_states is hidden or torch.equal(out.hidden_states, hidden), "the dispatcher moved rows"
    local = out.topk_output.topk_ids
    assert local.tolist() == [[0, -1], [3, -1], [-1, -1]], f"remote experts not dropped: {local.tolist()}"


def test_megamoe_dispatcher_gathers_nothing():
    check_dispatcher_keeps_rows_and_drops_remote_experts()


def check_dsv2_shared_added_on_rank0_only() -> None:
    for rank, adds in ((0, True), (1, False)):
        par = SimpleNamespace(tp_size=2, tp_rank=rank, dwdp_size=1)
        with mock.patch.object(moe_utils, "get_parallel", lambda: par), \
                mock.patch.object(moe_utils, "get_moe_a2a_backend", lambda: MoeA2ABackend.MEGAMOE), \
                mock.patch.object(moe_utils, "should_use_flashinfer_cutlass_moe_fp4_allgather", lambda: False):
            assert moe_utils.post_experts_output_is_complete(is_tp_path=True) is False
            assert moe_utils.adds_replicated_output_to_partial() is adds, f"tp rank {rank}"


def test_dsv2_miss_path_adds_replicated_shared_on_tp_rank0_only():
    check_dsv2_shared_added_on_rank0_only()
    # and DeepseekV2MoE's miss path does gate its TP1 shared add on that predicate
    from sglang.srt.models.deepseek_v2 import DeepseekV2MoE

    src = inspect.getsource(DeepseekV2MoE.forward_normal)
    assert "self._shared_expert_tp1" in src and "self._adds_replicated_output()" in src
    assert "adds_replicated_output_to_partial()" in inspect.getsource(DeepseekV2MoE._adds_replicated_output)


def _fp8_layer(num_experts, hidden, inter, seed=0):
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(num_experts, 2 * inter, hidden, generator=g) * 0.05).to(torch.float8_e4m3fn)
    w2 = (torch.randn(num_experts, hidden, inter, generator=g) * 0.05).to(torch.float8_e4m3fn)
    s13 = torch.rand(num_experts, 2 * inter // 128, hidden // 128, generator=g) + 0.5
    s2 = torch.rand(num_experts, hidden // 128, inter // 128, generator=g) + 0.5
    return w13, s13, w2, s2


def test_stock_fallback_result_is_wrong_per_rank():
    """Facts 1-3 composed on a tp=ep=2 layer: each rank's stock result for its own rows is the sum over its local
    experts only; the contract adds nothing; so it differs from the true MoE output, token by token."""
    check_megamoe_ffn_is_rank_local_and_complete(_layer_classes()["glm4"])
    check_dispatcher_keeps_rows_and_drops_remote_experts()
    experts, hidden, inter, tokens, ep = 8, 128, 128, 6, 2
    w13, s13, w2, s2 = _fp8_layer(experts, hidden, inter)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(1))
    # Every token has one expert on each rank, with equal weight: each stock row misses half its experts.
    ids = torch.tensor([[0, 5], [1, 6], [2, 7], [3, 4], [0, 7], [4, 3]], dtype=torch.int32)
    weights = torch.full((tokens, 2), 0.5)
    full = sm90_fp8.reference_moe(x, ids, weights, w13, s13, w2, s2, w13_interleaved=False)
    per = experts // ep
    for rank in range(ep):
        rows = slice(rank * tokens // ep, (rank + 1) * tokens // ep)  # this rank's slice (contract fact 1)
        local_ids = dispatch_on_rank(rank, ep, ids[rows], x[rows], experts).topk_output.topk_ids  # fact 2
        sl = slice(rank * per, (rank + 1) * per)
        stock = sm90_fp8.reference_moe(x[rows], local_ids, weights[rows], w13[sl], s13[sl], w2[sl], s2[sl],
                                       w13_interleaved=False)
        # No sum follows (fact 1), so `stock` is what the next layer reads for these rows.
        err = (stock - full[rows]).norm(dim=-1) / full[rows].norm(dim=-1)
        assert bool((err > 0.1).all()), f"rank {rank}: some token got all its experts locally: {err.tolist()}"
