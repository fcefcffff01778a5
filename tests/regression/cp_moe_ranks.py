"""One attention-CP rank of the MoE round trip under DSA prefill CP, run by `test_cp_moe_gather_uneven_shards.py`.

``python cp_moe_ranks.py PLAN RANK``: ``PLAN`` is a JSON file (world size, gloo init file, output directory). Every
rank joins one gloo world of 4 processes and builds SGLang's real ``GroupCoordinator`` groups over it: CP groups of
2 (two pairs), 3 and 4 ranks, and a CP2 x attention-TP2 layout. For each scenario the ranks of its group stamp that
topology on SGLang's real ``get_parallel()``, bind the sparse-FFN stage GLM-5's decoder layer declares
(``DeepseekV2DecoderLayer.stage_facts``, the class ``GlmMoeDsaForCausalLM`` builds) under DSA prefill CP with
``--moe-a2a-backend none``, and run one request batch through SGLang's own code: ``prepare_cp_forward`` (the CP
split and its padding), ``cp_shard_hidden_states`` (this rank's shard), the stage's bound entry (residual add +
norm on the shard, then the all-gather over attention CP), an expert-parallel MoE stand-in on the gathered rows, and
the stage's bound exit (reduce-scatter, or sum + take-back under attention TP), to this rank's output rows. The
rows are saved for the test to compare with a single-process reference.

Then the mutant phase: both CP2 pairs run again with ``prepare_cp_forward`` rebuilt from its own source without
``pad_logical_token_to_physical`` (``regression_mutants``), zigzag on ranks 0-1 and interleave on ranks 2-3. Each
rank records its shard before the gather, so the test can see uneven shards reached the collective; what happens
next (gloo aborts a process on a size mismatch, a peer reads a reset connection) is the failure the test expects.

The module's top level imports only torch: the test imports it for the inputs and the MoE stand-in.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import torch

HIDDEN = 8
EXPERTS = 12  # divides over 2, 3 and 4 expert-parallel ranks
TOPK = 2
DTYPE = torch.float64  # sums in another order stay within 1e-12 of the reference

# name: strategy, CP size, attention-TP size, request lengths. Uneven unless named "even": the remainder of
# len % (2 * cp) per request (zigzag) or of sum(lens) % cp (interleave) gives some ranks one row more.
SCENARIOS = {
    "zigzag_cp2": ("zigzag", 2, 1, [9, 13]),
    "zigzag_cp3": ("zigzag", 3, 1, [7, 10, 6]),
    "zigzag_cp4": ("zigzag", 4, 1, [19, 8, 11]),
    "interleave_cp2": ("interleave", 2, 1, [5, 6]),
    "interleave_cp3": ("interleave", 3, 1, [4, 9, 9]),
    "interleave_cp4": ("interleave", 4, 1, [17, 12, 6]),
    "interleave_cp2_attn_tp2": ("interleave", 2, 2, [6, 7, 8]),
    "zigzag_cp2_even": ("zigzag", 2, 1, [8, 8]),
    "interleave_cp4_even": ("interleave", 4, 1, [16, 16]),
}
# Run on both CP2 pairs at once with the padding removed; each must fail.
MUTANT_SCENARIOS = {0: "zigzag_cp2", 1: "interleave_cp2"}
MUTATION_NEEDLE = "pad_logical_token_to_physical"
WORLD = 4
COLLECTIVE_TIMEOUT_S = 60  # a peer that never arrives fails the collective instead of hanging it


def inputs(name: str):
    """The batch's hidden states (attention output, already summed) and residual, in token order."""
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    n = sum(SCENARIOS[name][3])
    return torch.randn(n, HIDDEN, generator=g, dtype=DTYPE), torch.randn(n, HIDDEN, generator=g, dtype=DTYPE)


def _weights():
    g = torch.Generator().manual_seed(25)
    return (torch.randn(HIDDEN, EXPERTS, generator=g, dtype=DTYPE),
            torch.randn(EXPERTS, HIDDEN, HIDDEN, generator=g, dtype=DTYPE) / HIDDEN)


def moe(h: torch.Tensor, *, ep_rank: int = 0, ep_size: int = 1, bound=None) -> torch.Tensor:
    """A top-2 MoE over ``EXPERTS`` experts; with ``ep_size`` > 1 only this rank's experts contribute (their sum
    over ranks is the whole MoE, as SGLang's EP dispatch leaves it). Rows at or past ``bound`` route to no expert,
    as SGLang's top-k masks rows past ``num_token_non_padded``."""
    router, experts = _weights()
    weights, ids = torch.topk(h @ router, TOPK, dim=-1)
    weights = torch.softmax(weights, dim=-1)
    per = EXPERTS // ep_size
    out = torch.zeros_like(h)
    for k in range(TOPK):
        for e in range(ep_rank * per, (ep_rank + 1) * per):
            rows = ids[:, k] == e
            if bound is not None:
                rows &= torch.arange(h.shape[0]) < int(bound)
            out[rows] += weights[rows, k, None] * (h[rows] @ experts[e])
    return out


def _group(ps, rank, ranks, name):
    # No NCCL on a CPU: SGLang's coordinator over gloo groups only.
    return ps.init_model_parallel_group(ranks, rank, "gloo", use_pynccl=False, use_custom_allreduce=False,
                                        use_mscclpp=False, use_torch_symm_mem_allreduce=False, group_name=name)


def _layouts(ps, rank):
    """Every group is built by every rank, in one order (new_group is collective over the world)."""
    solo = _group(ps, rank, [[r] for r in range(WORLD)], "solo")
    pairs = _group(ps, rank, [[0, 1], [2, 3]], "cp2")
    cp3 = _group(ps, rank, [[0, 1, 2], [3]], "cp3")
    cp4 = _group(ps, rank, [list(range(WORLD))], "cp4")
    # CP2 x attention TP2: tp_rank = cp_rank * attn_tp_size + attn_tp_rank, as SGLang lays ranks out.
    cp_of_tp = _group(ps, rank, [[0, 2], [1, 3]], "cp2_tp2_cp")
    attn_tp = _group(ps, rank, [[0, 1], [2, 3]], "cp2_tp2_attn_tp")

    def layout(cp, attn_tp_size):
        """This rank's stamp of the scenario's topology, or None when it sits this one out."""
        if attn_tp_size == 2:
            return dict(tp_size=4, tp_rank=rank, tp_group=cp4, attn_cp_size=2, attn_cp_rank=rank // 2,
                        attn_cp_group=cp_of_tp, attn_tp_size=2, attn_tp_rank=rank % 2, attn_tp_group=attn_tp,
                        moe_ep_size=4, moe_ep_rank=rank, moe_ep_group=cp4)
        group = {2: pairs, 3: cp3, 4: cp4}[cp]
        if group.world_size != cp:
            return None
        return dict(tp_size=cp, tp_rank=group.rank_in_group, tp_group=group, attn_cp_size=cp,
                    attn_cp_rank=group.rank_in_group, attn_cp_group=group, attn_tp_size=1, attn_tp_rank=0,
                    attn_tp_group=solo, moe_ep_size=cp, moe_ep_rank=group.rank_in_group, moe_ep_group=group)

    return layout


def _run_scenario(name: str, stamp: dict, report=None) -> dict:
    """One batch through SGLang's split, shard, FFN-stage entry and exit on this rank; the rows it ends with."""
    from types import SimpleNamespace

    from sglang.srt.layers.cp import base as cp_base
    from sglang.srt.layers.cp import utils as cp_utils
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.models.deepseek_v2 import DeepseekV2DecoderLayer
    from sglang.srt.runtime_context import get_parallel
    from sglang.test import boundary_fixtures as bf

    strategy, cp, attn_tp, lens = SCENARIOS[name]
    x, residual = inputs(name)
    n = x.shape[0]
    with get_parallel().override(cp_strategy=strategy, moe_tp_size=1, moe_dp_size=1, **stamp) as par, \
            bf.planning(par, dsa_cp=True):  # SGLang's own kit: DSA's CP, no a2a MoE backend
        cp_base.init_cp_strategy(enable_prefill_cp=True, cp_size=cp, cp_strategy=strategy)
        config = SimpleNamespace(n_routed_experts=EXPERTS, first_k_dense_replace=1, moe_layer_freq=1)
        attn_decl, ffn_decl = DeepseekV2DecoderLayer.stage_facts(config, 2)
        _, ffn = bf.build_stages((attn_decl, bf.Norm()), (ffn_decl, bf.Norm()))
        fb = ForwardBatch(forward_mode=ForwardMode.EXTEND, batch_size=len(lens), input_ids=torch.arange(n),
                          req_pool_indices=torch.arange(len(lens)), seq_lens=torch.tensor(lens), out_cache_loc=None,
                          seq_lens_sum=n, seq_lens_cpu=torch.tensor(lens), extend_seq_lens_cpu=list(lens))
        # What a real batch carries when the MoE may mask padded rows: every token is real.
        fb.num_token_non_padded = fb.global_num_token_non_padded = torch.tensor(n)
        assert cp_utils.is_cp_active(fb), "SGLang does not take this batch onto its CP path"
        cp_utils.prepare_cp_forward(fb)  # looked up on the module: the mutant phase replaces it there
        meta = fb.attn_cp_metadata
        # The attention output each attention-TP rank hands on is its part of the sum the FFN entry completes.
        local_x = cp_utils.cp_shard_hidden_states(x, fb) / attn_tp
        local_residual = cp_utils.cp_shard_hidden_states(residual, fb)
        out = {"per_rank_actual_token": list(meta.per_rank_actual_token),
               "per_rank_logical_token": meta.per_rank_logical_token and list(meta.per_rank_logical_token),
               "cp_rank": par.attn_cp_rank, "local_rows": local_x.shape[0],
               "entry": ffn.plan.path_for(fb).entry.prepare.keywords["step"].func.__name__,
               "exit": ffn.plan.path_for(fb).output_move.__name__}
        if report is not None:
            report(out)
        gathered, stream = bf.prepare_input(ffn, local_x, local_residual, fb)
        fb.residual_stream = stream
        bound = fb.moe_num_token_non_padded()
        partial = moe(gathered, ep_rank=par.tp_rank, ep_size=par.tp_size, bound=bound)
        with ffn.exit(fb) as scope:
            handle = scope.finish(partial)
        hidden, new_residual = stream.input(handle)
        out.update(gathered_rows=gathered.shape[0], moe_bound=None if bound is None else int(bound),
                   hidden=hidden.clone(), residual=new_residual.clone())
        return out


def main(plan_path: str, rank: int) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    plan = json.loads(open(plan_path).read())
    out_dir = plan["out"]

    def save(phase, results):
        path = os.path.join(out_dir, f"rank{rank}.{phase}.pt")
        torch.save(results, path + ".tmp")
        os.replace(path + ".tmp", path)

    dist.init_process_group("gloo", init_method=f"file://{plan['init_file']}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    from unittest import mock

    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.layers.attention.dsa import utils as dsa_utils
    from sglang.srt.layers.cp import utils as cp_utils
    from sglang.srt.runtime_context import get_parallel

    ps._MODEL_PARALLEL_GROUP_TIMEOUT = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    # GroupCoordinator's CPU branch: it calls the same _all_gather_into_tensor / _reduce_scatter_tensor that its
    # CUDA-only custom op (reg_all_gather_into_tensor, ...) wraps on a GPU. Nothing else in the module reads it
    # but the world-group init, which already ran.
    ps._is_cpu = True
    layout = _layouts(ps, rank)
    get_parallel().override_permanently(
        attn_dp_size=1, attn_dp_rank=0, attn_dp_enabled=False, enable_prefill_cp=True,
        enable_cp_tp_group_sharing=False, moe_dense_tp_size=None, dwdp_size=1,
        enable_attn_tp_input_scattered=False, disable_attn_tp_gather=False)
    # GLM-5 is a DSA model: is_dsa_enable_prefill_cp reads that from the published model config, of which a rank
    # here has none (SGLang's boundary kit, bf.planning(dsa_cp=True), says the same to the communicator modules).
    dsa = mock.patch.object(dsa_utils, "is_dsa_enable_prefill_cp", lambda: True)
    dsa.start()

    results = {}
    for name, (_, cp, attn_tp, _) in SCENARIOS.items():
        stamp = layout(cp, attn_tp)
        if stamp is None:
            continue
        try:
            results[name] = _run_scenario(name, stamp)
        except BaseException:  # noqa: BLE001 - the test judges; a peer's collective then times out, not hangs
            results[name] = {"error": traceback.format_exc()}
    save("real", results)
    dist.barrier()  # every rank's real results are on disk before any rank runs a mutant

    mutant = {"pair": rank // 2, "scenario": MUTANT_SCENARIOS[rank // 2]}
    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import regression_mutants as rm

        try:
            broken = rm.mutant(cp_utils, "prepare_cp_forward", rm.DropStatements(MUTATION_NEEDLE))
        except rm.MutationNotApplied as exc:
            mutant["mutation_not_applied"] = str(exc)
            save("mutant", mutant)
            os._exit(0)
        cp_utils.prepare_cp_forward = broken

        def before_gather(state):
            mutant["before_gather"] = state
            save("mutant", mutant)

        mutant["result"] = _run_scenario(mutant["scenario"], layout(2, 1), report=before_gather)
    except BaseException:  # noqa: BLE001
        mutant["error"] = traceback.format_exc()
    save("mutant", mutant)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (SGLang's atexit hooks, gloo) once the results are on disk


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
