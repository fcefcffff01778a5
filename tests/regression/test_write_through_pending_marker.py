"""Replicated write-through pending marker, and `writing_check` entering its all-reduce on every rank.

Guards seed lines 140-151 and 522-560 (fork commits "backup-pending state now lives on the replicated radix node"
and the symmetric-attach NCCL-deadlock fix: a strict subset of CP ranks entered `writing_check_min` while the rest
went on to the next broadcast on the same group). 0.5.23 carries the upstream equivalent: `UnifiedTreeNode.
write_through_pending_id` set on the scheduler thread at attach (`UnifiedRadixCache._track_write_through_node` ->
`UnifiedTreeCore.mark_write_through_pending`), cleared only when the MIN-agreed ack count reaches it
(`writing_check` -> `_finish_write_through_ack` -> `finish_write_through`), and a `writing_check` that always
all-reduces ("Every rank must enter the all_reduce below").

Two simulated ranks run the installed code in lock-step: both attach the same backup; rank A's D2H finishes before
rank B's. The rank-local ack queues differ, yet both ranks must enter the same collectives and keep identical
markers; the marker clears on both once both have finished.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import regression_mutants as rm

from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore, UnifiedTreeNode
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache


class _Event:
    def __init__(self, done):
        self.done = done

    def query(self):
        return self.done

    def synchronize(self):
        assert self.done, "an ack was consumed before its D2H copy finished"


class _Rank:
    """One rank's UnifiedRadixCache (built with __new__) over its own replica of a two-node path."""

    def __init__(self, name, peers):
        self.name, self.peers = name, peers
        self.allreduce_calls = 0
        # Replicated trees: every rank performs the same tree operations, so node ids agree across ranks.
        UnifiedTreeNode.counter = 10_000
        nodes = [UnifiedTreeNode(tree_components=()) for _ in range(2)]
        self.node_ids = [n.id for n in nodes]
        core = UnifiedTreeCore.__new__(UnifiedTreeCore)
        core._node_arena = {n.id: n for n in nodes}
        core._update_duplicate_tracking = lambda node: None
        core.kv_events = SimpleNamespace(record_store=lambda node, medium: None)
        self.core = core
        cache = UnifiedRadixCache.__new__(UnifiedRadixCache)
        cache.tree_core = core
        cache.pp_rank = 0
        cache.buffer_pipeline = None
        cache.enable_storage = False
        cache.metrics_collector = None
        cache.ongoing_write_through = {}
        cache.cache_controller = SimpleNamespace(ack_write_queue=[])
        cache._all_reduce = self._all_reduce
        self.cache = cache

    def _all_reduce(self, tensor, op):
        # MIN across ranks: every rank's locally-ready count was published before the lock-step round started.
        self.allreduce_calls += 1
        tensor.fill_(min(self.peers.ready_counts.values()))

    def attach_backup(self):
        ack_id = self.node_ids[-1]
        self.cache._track_write_through_node(ack_id, None, list(self.node_ids))
        self.cache.cache_controller.ack_write_queue.append(SimpleNamespace(finish_event=_Event(False),
                                                                           node_ids=[ack_id]))

    def finish_d2h(self):
        for ack in self.cache.cache_controller.ack_write_queue:
            ack.finish_event.done = True

    def markers(self):
        return [self.core.node_by_id(i).write_through_pending_id for i in self.node_ids]


def _lockstep_writing_check(ranks, peers):
    peers.ready_counts = {r.name: r.cache._count_ready_acks(r.cache.cache_controller.ack_write_queue) for r in ranks}
    for r in ranks:
        r.cache.writing_check()


def check_marker_replicated_and_collective_symmetric() -> None:
    peers = SimpleNamespace(ready_counts={})
    saved = UnifiedTreeNode.counter
    try:
        a, b = _Rank("A", peers), _Rank("B", peers)
    finally:
        UnifiedTreeNode.counter = max(saved, UnifiedTreeNode.counter)
    for r in (a, b):
        r.attach_backup()
    assert a.markers() == b.markers() and None not in a.markers(), "attach must mark every covered node on every rank"

    a.finish_d2h()  # rank A's copy finished, rank B's has not: the rank-local ack queues now differ
    _lockstep_writing_check((a, b), peers)
    assert a.markers() == b.markers() and None not in a.markers(), (
        f"pending markers diverged across ranks after a rank-local ack drain: A={a.markers()} B={b.markers()}"
    )
    assert a.allreduce_calls == b.allreduce_calls == 1, (
        f"every rank must enter writing_check's all-reduce (A={a.allreduce_calls}, B={b.allreduce_calls}); a rank "
        "skipping it desyncs the collective sequence (the fork's NCCL deadlock)"
    )

    _lockstep_writing_check((a, b), peers)  # nothing new on either rank: both must still enter the collective
    assert a.allreduce_calls == b.allreduce_calls == 2, "an idle writing_check must still enter the all-reduce"

    b.finish_d2h()
    _lockstep_writing_check((a, b), peers)
    assert a.markers() == b.markers() == [None, None], "the marker must clear on every rank once all have finished"
    assert not a.cache.ongoing_write_through and not b.cache.ongoing_write_through


def test_installed_marker_replicated_and_writing_check_symmetric():
    check_marker_replicated_and_collective_symmetric()


def _skip_when_nothing_ready(original):
    # The fork's pre-fix shape: a rank whose ack queue has nothing ready returns before the all-reduce.
    def writing_check(self, write_back=False, finish_count=None):
        if not write_back and finish_count is None and self._count_ready_acks(self.cache_controller.ack_write_queue) == 0:
            return None
        return original(self, write_back=write_back, finish_count=finish_count)

    return writing_check


def test_check_detects_conditional_all_reduce(monkeypatch):
    monkeypatch.setattr(UnifiedRadixCache, "writing_check", _skip_when_nothing_ready(UnifiedRadixCache.writing_check))
    with pytest.raises(AssertionError):
        check_marker_replicated_and_collective_symmetric()


def test_check_detects_rank_local_ack_commit(monkeypatch):
    # Acks committed on the local count (no MIN): rank A clears its marker while rank B still holds it.
    rm.check_catches_mutant(
        monkeypatch, UnifiedRadixCache, "writing_check",
        rm.DropStatements("self._all_reduce("),
        check_marker_replicated_and_collective_symmetric,
    )
