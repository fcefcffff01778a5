"""DSA prefill CP with MoE on the standard path: the gather before the MoE and the scatter after it get equal shards.

Guards seed lines 561-584 (fork fix: with `--moe-a2a-backend none` / FlashInfer TRTLLM, NSA prefill CP gathers the
hidden states over attention CP before the MoE and reduce-scatters after it; both assumed equal per-rank shards,
and the fork's page-aligned shared-KV split made them uneven: "output tensor size must be equal to world_size times
input tensor size"; the fork padded each shard to the longest and sliced the real rows back out).

SGLang 0.5.23 is right: every split it can produce is padded to one physical length before any layer runs, so the
equal-shard collectives are correct. Its split modes give uneven logical shards (zigzag: `len % (2 * cp)` per
request, cp/zigzag.py:151-169; interleave: `sum(lens) % cp`, cp/interleave.py:191-199); `prepare_cp_forward`
(cp/utils.py:161-167) pads them right after building the metadata (`pad_logical_token_to_physical`,
cp/padding.py:34-43: every `per_rank_actual_token` becomes the longest shard rounded up to the CP alignment, the
real counts move to `per_rank_logical_token`), and the shard is padded with zero rows to that length
(`pad_local_rows`, cp/padding.py:46-61, called by each strategy's `shard_hidden_states`). The MoE stage GLM-5's
decoder layer declares then binds `_then_attn_cp_gather` (layer_boundary/prepare.py:554-571:
`attn_cp_interleave_gather`, cp/interleave.py:57-71, an all-gather sized from the shard) and, on exit,
`attn_cp_reduce_scatter_output` (layer_boundary/ops.py:440-447 -> :157-164, equal `tensor_split`) or, under
attention TP > 1, `attn_cp_take_back_output` (ops.py:428-437) after the sum; the choice is boundary.py:92-105 and
:764-779, the entry :563-581. The MoE routes every gathered row (`ForwardBatch.moe_num_token_non_padded` returns
no prefix bound under DSA/MLA CP, forward_batch_info.py:1409-1446), since the real rows are not a prefix there.
0.5.23 has no page-aligned split (nothing under layers/cp/ rounds to pages); the fork's trigger does not exist.

Three layers of proof:
1. In process: the GLM-5 sparse-FFN stage under DSA CP binds exactly that gather and scatter with backend none,
   and not with an a2a backend (DeepEP/megamoe keep the tokens on their shards; SGLang forces DeepEP for DSA
   zigzag, model_overrides/deepseek_v2.py:115-121, so GLM-5 on the standard path is interleave).
2. In process: SGLang's split of each request batch has uneven logical shards and equal physical ones, and the
   shard is padded to the physical length. Broken copy: `prepare_cp_forward` without `pad_logical_token_to_physical`.
3. Four gloo processes (`cp_moe_ranks.py`): SGLang's real split, shard, stage entry (add + norm, all-gather over
   a real `GroupCoordinator`) and exit (reduce-scatter, or sum + take-back) for CP 2, 3, 4 and CP2 x attention-TP2
   on uneven batches (zigzag and interleave) and two even controls (padding zero); every rank's real rows must
   equal a single-process MoE over the whole batch. Then the broken copy on both CP2 pairs: uneven shards reach
   the gather and the round trip fails (gloo aborts a rank on the size mismatch, its peer reads a reset
   connection).
"""

from __future__ import annotations

import json
import os
import time

import cp_moe_ranks as cr
import pytest
import regression_mutants as rm
import torch

from sglang.srt.layers.cp import base as cp_base
from sglang.srt.layers.cp import utils as cp_utils
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.runtime_context import get_parallel

RUN_TIMEOUT_S = 300  # 4 processes on 2 shared cores, once the zygote imported SGLang
HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cp_moe_ranks.py")
UNEVEN = [n for n in cr.SCENARIOS if not n.endswith("_even")]


def owned_tokens(strategy: str, lens: list, cp: int, cp_rank: int) -> list:
    """The batch's token indices a CP rank holds, in its shard's row order; written from the layouts' definitions
    (zigzag: one early and one late block of each request's 2*cp blocks, the first len % (2*cp) blocks one longer,
    early blocks of every request first; interleave: every cp-th token of the batch), not from SGLang's code."""
    if strategy == "interleave":
        return list(range(cp_rank, sum(lens), cp))
    early, late, start = [], [], 0
    for n in lens:
        base, rem = divmod(n, 2 * cp)
        bounds = [start]
        for b in range(2 * cp):
            bounds.append(bounds[-1] + base + (b < rem))
        early += range(bounds[cp_rank], bounds[cp_rank + 1])
        late += range(bounds[2 * cp - 1 - cp_rank], bounds[2 * cp - cp_rank])
        start += n
    return early + late


def _batch(name: str) -> ForwardBatch:
    lens = cr.SCENARIOS[name][3]
    n = sum(lens)
    return ForwardBatch(forward_mode=ForwardMode.EXTEND, batch_size=len(lens), input_ids=torch.arange(n),
                        req_pool_indices=torch.arange(len(lens)), seq_lens=torch.tensor(lens), out_cache_loc=None,
                        seq_lens_sum=n, seq_lens_cpu=torch.tensor(lens), extend_seq_lens_cpu=list(lens))


# ---- 1. the stage GLM-5 declares binds the attention-CP gather and scatter on the standard MoE path ----

def _ffn_cp_path(a2a: bool, cp: int = 4):
    from types import SimpleNamespace

    from sglang.srt.layers.layer_boundary.construction import BatchVariant
    from sglang.srt.models.deepseek_v2 import DeepseekV2DecoderLayer
    from sglang.test import boundary_fixtures as bf

    parallel = bf.parallel_of(attn_dp=1, attn_tp=1, attn_cp=cp, enable_prefill_cp=True, moe_ep_size=cp,
                              moe_tp_size=1)
    config = SimpleNamespace(n_routed_experts=cr.EXPERTS, first_k_dense_replace=1, moe_layer_freq=1)
    with bf.planning(parallel, dsa_cp=True, a2a=a2a):
        attn, ffn = DeepseekV2DecoderLayer.stage_facts(config, 2)
        assert ffn.sparse
        _, stage = bf.build_stages((attn, bf.Norm()), (ffn, bf.Norm()))
    path = stage.plan.paths[BatchVariant.CONTEXT_PARALLEL]
    return path.entry.prepare.keywords["step"], path


def check_standard_moe_gathers_over_attn_cp() -> None:
    from sglang.srt.layers.layer_boundary import ops, prepare

    step, path = _ffn_cp_path(a2a=False)
    assert getattr(step, "func", None) is prepare._then_attn_cp_gather, f"MoE input is no longer gathered there: {step}"
    assert path.output_move is ops.attn_cp_reduce_scatter_output and path.output_move_completes_sum, (
        f"MoE output no longer comes back by the attention-CP reduce-scatter: {path.output_move}")
    # Control: with an a2a backend (DeepEP, megamoe) the tokens stay on their shards, nothing gathers over CP.
    a2a_step, a2a_path = _ffn_cp_path(a2a=True)
    assert getattr(a2a_step, "func", a2a_step) is not prepare._then_attn_cp_gather
    assert a2a_path.output_move is not ops.attn_cp_reduce_scatter_output


def test_glm5_moe_stage_gathers_over_attn_cp_on_the_standard_path():
    check_standard_moe_gathers_over_attn_cp()


# ---- 2. SGLang's split: uneven logical shards, one physical length, padded shards ----

@pytest.fixture
def cp_parallel(monkeypatch):
    """Stamp a CP topology on SGLang's real get_parallel() for one split, with the strategy singleton restored."""
    monkeypatch.setattr(cp_base, "_STRATEGY", None)

    def stamp(strategy: str, cp: int, cp_rank: int = 0):
        cp_base.init_cp_strategy(enable_prefill_cp=True, cp_size=cp, cp_strategy=strategy)
        # The whole topology, MoE widths included: SGLang checks tp_size against every published width, so a
        # partial override holds only while nothing else has been published.
        return get_parallel().override(
            tp_size=cp, tp_rank=cp_rank, attn_cp_size=cp, attn_cp_rank=cp_rank, attn_tp_size=1, attn_tp_rank=0,
            attn_dp_size=1, attn_dp_rank=0, moe_tp_size=cp, moe_ep_size=1, moe_dp_size=1,
            enable_prefill_cp=True, cp_strategy=strategy, enable_cp_tp_group_sharing=False)

    return stamp


def check_split_pads_to_one_length(name: str, stamp) -> None:
    strategy, cp, _, lens = cr.SCENARIOS[name]
    logical = [len(owned_tokens(strategy, lens, cp, r)) for r in range(cp)]
    for rank in range(cp):
        with stamp(strategy, cp, rank):
            fb = _batch(name)
            assert cp_utils.is_cp_active(fb)
            cp_utils.prepare_cp_forward(fb)
            meta = fb.attn_cp_metadata
            shard = cp_utils.cp_shard_hidden_states(torch.arange(1, fb.seq_lens_sum + 1)[:, None], fb)
        assert meta.per_rank_logical_token == logical, (
            f"{name}: real rows per rank {meta.per_rank_logical_token}, expected {logical} (None: never padded)")
        physical = meta.per_rank_actual_token
        assert len(set(physical)) == 1 and physical[0] >= max(logical), (
            f"{name}: the CP collectives would get uneven shards: per_rank_actual_token={physical}")
        assert meta.max_rank_len == physical
        assert shard.shape[0] == physical[0], f"{name} rank {rank}: shard of {shard.shape[0]}, not {physical[0]} rows"
        real = owned_tokens(strategy, lens, cp, rank)
        assert shard[: len(real), 0].tolist() == [t + 1 for t in real] and not shard[len(real):].any(), (
            f"{name} rank {rank}: the shard is not its tokens followed by zero rows")


@pytest.mark.parametrize("name", list(cr.SCENARIOS))
def test_split_pads_shards_to_one_length(name, cp_parallel):
    strategy, cp, _, lens = cr.SCENARIOS[name]
    logical = [len(owned_tokens(strategy, lens, cp, r)) for r in range(cp)]
    assert (len(set(logical)) > 1) == (name in UNEVEN), f"{name}: not the shard shape its name says"
    check_split_pads_to_one_length(name, cp_parallel)


@pytest.mark.parametrize("name", ["zigzag_cp4", "interleave_cp3"])
def test_split_check_detects_missing_padding(name, cp_parallel, monkeypatch):
    rm.check_catches_mutant(monkeypatch, cp_utils, "prepare_cp_forward", rm.DropStatements(cr.MUTATION_NEEDLE),
                            check_split_pads_to_one_length, name, cp_parallel)


# ---- 3. four gloo processes: SGLang's round trip against a single-process reference ----

class RankRuns:
    """What the four rank processes left: results per phase, exit codes, logs."""

    def __init__(self, out, procs, timed_out):
        self.out, self.timed_out = out, timed_out
        self.returncodes = [p.returncode for p in procs]

    def log(self, rank: int) -> str:
        lines = (self.out / f"log{rank}").read_text(errors="replace").splitlines()
        # SGLang's CPU import warnings and torch's dispatcher dumps say nothing about the run.
        keep = [ln for ln in lines if "registered at" not in ln and "fallthrough" not in ln and "warn" not in ln]
        return "\n".join(keep[-25:])

    def load(self, rank: int, phase: str):
        path = self.out / f"rank{rank}.{phase}.pt"
        return torch.load(path, weights_only=False) if path.exists() else None

    def real(self, rank: int) -> dict:
        results = self.load(rank, "real")
        if results is None:
            why = "timed out" if self.timed_out else f"exit status {self.returncodes[rank]}"
            raise AssertionError(f"rank {rank} left no results ({why}):\n{self.log(rank)}")
        return results


# What each rank imports (its argv names its plan; nothing here reads a rank's own settings).
PRELOAD = ["torch", "torch.distributed", "sglang.srt.layers.cp.base", "sglang.srt.layers.cp.utils",
           "sglang.srt.model_executor.forward_batch_info", "sglang.srt.models.deepseek_v2",
           "sglang.srt.runtime_context", "sglang.test.boundary_fixtures", "sglang.srt.distributed.parallel_state",
           "sglang.srt.layers.attention.dsa.utils"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """One group of 4 processes for every scenario and both mutants, forked from a zygote that imported SGLang once
    (tests/rank_zygote.py): four OS processes, four gloo peers, one import."""
    from rank_zygote import Zygote

    out = tmp_path_factory.mktemp("cp_moe_ranks")
    (out / "plan.json").write_text(json.dumps({"init_file": str(out / "gloo-init"), "out": str(out)}))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with Zygote(PRELOAD, env=env) as z:
        procs = [z.spawn(path=HARNESS, argv=[out / "plan.json", r], log=out / f"log{r}") for r in range(cr.WORLD)]
        deadline, timed_out = time.monotonic() + RUN_TIMEOUT_S, False
        try:
            for p in procs:
                try:
                    p.wait(timeout=max(deadline - time.monotonic(), 0.1))
                except TimeoutError:
                    timed_out = True
                    break
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait(30)
    return RankRuns(out, procs, timed_out)


def _participants(name: str) -> dict:
    """rank -> cp_rank of every process that runs `name` (both pairs run a CP2 scenario)."""
    _, cp, attn_tp, _ = cr.SCENARIOS[name]
    if attn_tp == 2:
        return {r: r // 2 for r in range(cr.WORLD)}
    if cp == 2:
        return {r: r % 2 for r in range(cr.WORLD)}
    return {r: r for r in range(cp)}


def check_round_trip(name: str, results: dict) -> None:
    """Each rank's rows after the MoE round trip are the single-process MoE's rows for its tokens.

    ``results``: rank -> what `cp_moe_ranks._run_scenario` returned there (or {"error": ...}), for some of the
    ranks that run `name`."""
    strategy, cp, _, lens = cr.SCENARIOS[name]
    x, residual = cr.inputs(name)
    summed = x + residual
    reference = cr.moe(2 * summed)  # bf.Norm reads 2 * (h + r); one process, every expert, token order
    logical = [len(owned_tokens(strategy, lens, cp, r)) for r in range(cp)]
    participants = _participants(name)
    assert results and set(results) <= set(participants), (name, sorted(results))
    failed = {r: got["error"] if got else "no result" for r, got in results.items() if not got or "error" in got}
    assert not failed, f"{name}: " + "\n".join(f"rank {r} failed:\n{e[-1500:]}" for r, e in sorted(failed.items()))
    for rank, got in results.items():
        cp_rank = participants[rank]
        assert got["cp_rank"] == cp_rank
        assert got["per_rank_logical_token"] == logical, (name, rank, got["per_rank_logical_token"], logical)
        physical = got["per_rank_actual_token"]
        assert len(set(physical)) == 1, f"{name}: rank {rank} gathered uneven shards {physical}"
        assert got["local_rows"] == physical[0] and got["gathered_rows"] == cp * physical[0], (name, rank, got)
        tokens = owned_tokens(strategy, lens, cp, cp_rank)
        hidden, new_residual = got["hidden"], got["residual"]
        assert hidden.shape[0] == physical[0], f"{name}: rank {rank} got {hidden.shape[0]} rows back"
        err = (hidden[: len(tokens)] - reference[tokens]).abs().max().item()
        assert err < 1e-9, f"{name}: rank {rank}'s MoE rows differ from the single-process MoE by {err:.3g}"
        assert torch.allclose(new_residual[: len(tokens)], summed[tokens], rtol=0, atol=1e-12), (
            f"{name}: rank {rank}'s residual is not its tokens' h + r")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(cr.SCENARIOS))
def test_moe_round_trip_matches_single_process(name, ranks):
    results = {r: ranks.real(r).get(name) for r in _participants(name)}
    check_round_trip(name, results)
    if name.endswith("_even"):  # even shards: the padding is zero
        got = results[0]
        assert got["per_rank_actual_token"] == got["per_rank_logical_token"]


@pytest.mark.slow
@pytest.mark.parametrize("pair", sorted(cr.MUTANT_SCENARIOS))
def test_round_trip_check_detects_missing_padding(pair, ranks):
    name = cr.MUTANT_SCENARIOS[pair]
    members = [r for r in range(cr.WORLD) if r // 2 == pair]
    runs = {r: ranks.load(r, "mutant") or {} for r in members}
    for r, run in runs.items():
        if "mutation_not_applied" in run:
            raise rm.MutationNotApplied(run["mutation_not_applied"])
        assert "before_gather" in run, f"rank {r} never reached the gather with the broken copy:\n{ranks.log(r)}"
    # The broken copy took effect: the shards that reached the equal-shard gather are uneven.
    shards = [runs[r]["before_gather"]["local_rows"] for r in members]
    assert len(set(shards)) > 1, f"{name}: the broken copy left even shards {shards}; it tests nothing"
    results = {}
    for r, run in runs.items():
        if "result" in run:
            results[r] = run["result"]
        else:
            how = "killed at the run timeout" if ranks.timed_out else f"died (exit {ranks.returncodes[r]})"
            results[r] = {"error": run.get("error") or f"process {how}:\n{ranks.log(r)}"}
    with pytest.raises(AssertionError):
        check_round_trip(name, results)
