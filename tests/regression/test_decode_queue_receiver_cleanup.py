"""PD decode queues clear kv_receiver on abort and transfer failure; the idle check counts retracted requests.

Guards seed lines 52-61 (fork port of upstream 18989f3d48 / PR #28022; 0.5.23 disaggregation/decode.py
`DecodePreallocQueue.pop_preallocated`, `DecodeTransferQueue.pop_transferred`, managers/scheduler.py
`Scheduler.is_fully_idle`). The fork's directive: "Any path that removes a DecodeRequest from prealloc or transfer
ownership must clear its kv_receiver unless ownership is explicitly transferred." A receiver left behind keeps the
backend's per-request tracking alive; an idle check that misses retracted requests lets idle housekeeping (cache
flush, health probes) run while decode hand-off state still exists.

Builds the installed queues with __new__ and fakes, the way upstream's test_decode_queue_cleanup.py does.
"""

from __future__ import annotations

import ast
from types import SimpleNamespace
from unittest.mock import MagicMock

import regression_mutants as rm

import sglang.srt.disaggregation.decode as decode_mod
from sglang.srt.disaggregation.base import KVPoll
from sglang.srt.disaggregation.decode import DecodePreallocQueue, DecodeTransferQueue, HiCacheRestoreResult
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.managers.schedule_batch import FINISH_ABORT
from sglang.srt.managers.scheduler import Scheduler


class _Receiver:
    def __init__(self):
        self.cleared = 0
        self.abort_notified = False
        self.kv_mgr = SimpleNamespace(enable_deferred_decode_kv_release=False)

    def clear(self):
        self.cleared += 1

    def failure_exception(self):
        return None


def _prealloc_queue_with_aborted_request():
    receiver = _Receiver()
    req = SimpleNamespace(rid="aborted", bootstrap_room=1, finished_reason=FINISH_ABORT("client went away"),
                          return_logprob=False, priority=0,
                          kv=SimpleNamespace(holds_mamba=False, holds_kv=False))
    decode_req = SimpleNamespace(req=req, kv_receiver=receiver, waiting_for_input=True, is_rebootstrap=False)
    q = DecodePreallocQueue.__new__(DecodePreallocQueue)
    q.pp_size = 1
    q.queue = [decode_req]
    q.pending_reqs = [decode_req]  # the add() slow path leaves it in both lists
    q.retracted_queue = []
    q.num_reserved_decode_tokens = 0
    q._resolve_pending_reqs = MagicMock()
    q._update_handshake_waiters = MagicMock()
    q._uses_swa_tail_prealloc = MagicMock(return_value=False)
    q._uses_swa_reservation = MagicMock(return_value=False)
    q._allocatable_token_budgets = MagicMock(return_value=0)
    q._hicache_pending_restore_tokens = MagicMock(return_value=0)
    q._pre_alloc = MagicMock()
    scheduler = MagicMock()
    scheduler.running_batch.reqs = []
    scheduler.enable_priority_scheduling = False
    scheduler.enable_hisparse = False
    scheduler.enable_lora = False
    q.scheduler = scheduler
    # Nothing is left to preallocate once the aborted request is gone; an empty metadata allocator ends that loop.
    q.req_to_metadata_buffer_idx_allocator = SimpleNamespace(available_size=lambda: 0)
    return q, decode_req, receiver


def check_prealloc_abort_clears_receiver() -> None:
    q, decode_req, receiver = _prealloc_queue_with_aborted_request()
    preallocated, failed = q.pop_preallocated()
    assert preallocated == [] and failed == [decode_req]
    assert q.queue == [] and all(r is not decode_req for r in q.pending_reqs), "aborted request still queued"
    assert receiver.cleared == 1, "aborted prealloc request left its kv_receiver un-cleared"
    assert decode_req.kv_receiver is None, "aborted prealloc request still owns a kv_receiver"


def _transfer_queue_with_failed_transfer(monkeypatch):
    receiver = _Receiver()
    req = SimpleNamespace(rid="failed", bootstrap_room=7, return_logprob=False)
    decode_req = SimpleNamespace(req=req, kv_receiver=receiver, metadata_buffer_index=3,
                                 hicache_restore_status=HiCacheRestoreResult.READY, host_staged=False)
    q = DecodeTransferQueue.__new__(DecodeTransferQueue)
    q.queue = [decode_req]
    q.enable_staging = False
    q.enable_host_receive = False
    q.enable_deferred_kv_release = False
    q.gloo_group = MagicMock()
    q.req_to_metadata_buffer_idx_allocator = MagicMock()
    q.metadata_buffers = MagicMock()
    q.tp_rank = 0
    q.tree_cache = MagicMock()
    q._clean_hicache_prefetch_resources = MagicMock()
    q._release_request = MagicMock()
    scheduler = MagicMock()
    scheduler.enable_decode_hicache = False
    scheduler.metrics_reporter.enable_metrics = False
    q.scheduler = scheduler
    monkeypatch.setattr(q, "_poll_with_metadata_gate", lambda: [KVPoll.Failed], raising=False)
    # Single rank: nobody else holds the failed transfer, so the MAX-reduce returns our own flags.
    monkeypatch.setattr(decode_mod, "all_reduce_flags", lambda flags, group, op: list(flags))
    monkeypatch.setattr(decode_mod, "prepare_abort", MagicMock())
    return q, decode_req, receiver


def check_transfer_failure_clears_receiver(monkeypatch) -> None:
    q, decode_req, receiver = _transfer_queue_with_failed_transfer(monkeypatch)
    assert q.pop_transferred() == []
    assert q.queue == [], "failed transfer still queued"
    assert receiver.cleared == 1, "failed transfer left its kv_receiver un-cleared"
    assert decode_req.kv_receiver is None, "failed transfer still owns a kv_receiver"
    q.req_to_metadata_buffer_idx_allocator.free.assert_called_once_with(3)


def _idle_decode_scheduler(retracted):
    s = Scheduler.__new__(Scheduler)
    s.running_batch = MagicMock()
    s.running_batch.is_empty.return_value = True
    s.chunked_req = None
    s.dllm_manager = MagicMock()
    s.dllm_manager.any_staging_reqs.return_value = False
    s.last_batch = None
    s.enable_overlap = False
    s._pp_microbatches_drained = lambda: True
    s.waiting_queue = []
    s.grammar_manager = SimpleNamespace(grammar_queue=[])
    s.disaggregation_mode = DisaggregationMode.DECODE
    s.disagg_decode_prealloc_queue = SimpleNamespace(queue=[], retracted_queue=list(retracted))
    s.disagg_decode_transfer_queue = SimpleNamespace(queue=[], has_pending_deferred_releases=lambda: False)
    s.decode_offload_manager = None
    s.enable_hisparse = False
    s.enable_hierarchical_cache = False
    s.enable_lmcache = False
    s._engine_paused = False
    return s


def check_idle_counts_retracted() -> None:
    try:
        empty = _idle_decode_scheduler([]).is_fully_idle()
    except AttributeError as exc:  # the fake lacks something a newer is_fully_idle reads: say so
        raise AssertionError(f"is_fully_idle needs more scheduler state than this test fakes: {exc}") from exc
    assert empty, "baseline: a decode scheduler with nothing queued must be idle (else the check below is vacuous)"
    assert not _idle_decode_scheduler([object()]).is_fully_idle(), "retracted decode requests must keep it non-idle"


def test_installed_prealloc_abort_clears_receiver():
    check_prealloc_abort_clears_receiver()


def test_installed_transfer_failure_clears_receiver(monkeypatch):
    check_transfer_failure_clears_receiver(monkeypatch)


def test_installed_idle_check_counts_retracted():
    check_idle_counts_retracted()


def test_check_detects_prealloc_abort_keeping_receiver(monkeypatch):
    rm.check_catches_mutant(
        monkeypatch, DecodePreallocQueue, "pop_preallocated",
        rm.DropStatements("decode_req.kv_receiver"),
        check_prealloc_abort_clears_receiver,
    )


def test_check_detects_transfer_failure_keeping_receiver(monkeypatch):
    # Only the failure path's clear (the `else` of the deferred-release hold) is removed.
    rm.check_catches_mutant(
        monkeypatch, DecodeTransferQueue, "pop_transferred",
        rm.DropStatements("decode_req.kv_receiver",
                          only=lambda s: "clear" in ast.unparse(s) or "= None" in ast.unparse(s)),
        check_transfer_failure_clears_receiver, monkeypatch,
    )


def test_check_detects_idle_ignoring_retracted(monkeypatch):
    rm.check_catches_mutant(
        monkeypatch, Scheduler, "is_fully_idle",
        rm.DropStatements("retracted_queue"),
        check_idle_counts_retracted,
    )

