"""l3/engine/committer.py: a batch is durable before its index commit (every write finished, one fdatasync per slab,
then ONE index transaction), a page whose write or sync failed or that was cancelled is never committed, and every
page of a batch comes back with an outcome that says whether its slot is referenced, also when the commit fails (a
failed commit frees its slots).

The committer on its own over a real LMDB index (fake slabs that record their fdatasync), then through the store
(the writer applies the outcomes to the pool)."""

import errno
import itertools
import threading
from concurrent.futures import Future
from types import SimpleNamespace

import numpy as np
import pytest

import l3kit
from l3kit import K, NS, key
from sglang_glm_ext.l3.disk.format import HEADER_SIZE, PayloadKind, slot_bytes_for
from sglang_glm_ext.l3.engine.committer import Committer
from sglang_glm_ext.l3.engine.index import IndexEntry, KeySpace, L3Index, Refusal, deployment_tag
from sglang_glm_ext.l3.engine.messages import PendingWrite, StagedPage, WriteOutcome, failure
from sglang_glm_ext.l3.engine.store import L3Store

PB = 3 * 4096 + 100
SLOT = slot_bytes_for(PB)
page = l3kit.pages_of(PB)
IDX = PayloadKind.INDEX_K
SPACE = KeySpace(deployment_tag("t"), NS.digest())


class Journal:
    """What happened, in order: each write awaited, each fdatasync (with the batch's entries in the index at that
    moment), each index transaction."""

    def __init__(self, index):
        self.events, self.get_many = [], index.get_many  # the real read, whatever a test injects later
        self.keys: list = []  # the batch's index keys

    def written(self, slot, fails=None):
        journal = self

        class Written(Future):
            def result(self, timeout=None):
                journal.events.append(("written", slot))
                return fails

        return Written()

    def slab(self, name, fails=False):
        def sync():
            self.events.append(("sync", name, sum(e is not None for e in self.get_many(self.keys))))
            if fails:
                raise OSError(errno.EIO, "injected fdatasync failure")

        return SimpleNamespace(sync=sync)


@pytest.fixture
def index(tmp_path):
    ix = L3Index.open(str(tmp_path / "index"), 2**24)
    yield ix
    ix.close()


def batch(journal, n, *, kind=K, slab=None, first=0, fails=(), cancelled=(), state=None):
    state = state or SimpleNamespace(kind=kind, slab=slab or journal.slab(kind.label))
    out = []
    for i in range(first, first + n):
        h = bytes.fromhex(key(i, kind.label))
        p = StagedPage(seq=i, kind=kind, content_hash=h, key=SPACE.key(kind, h), buf=None, cancelled=i in cancelled)
        journal.keys.append(p.key)
        fail = failure(OSError(errno.EIO, "injected write failure")) if i in fails else None
        out.append(PendingWrite(p, state, 100 + i, journal.written(100 + i, fail)))
    return out


class Delivered:
    """A committer's ``deliver``: each batch's results as (slot, outcome) pairs, in delivery order; ``done`` is set
    once ``n`` batches came back."""

    def __init__(self, n: int):
        self.got, self.done, self.n = [], threading.Event(), n

    def __call__(self, results) -> None:
        self.got.append([(r.slot, r.outcome) for r in results])
        if len(self.got) == self.n:
            self.done.set()


def committer(index, deliver=lambda results: None, group_max=1):
    return Committer(index, rank=0, disk=0, deliver=deliver, name="l3-commit-test", group_max=group_max)


def spy_commits(index, journal):
    real = index.commit_puts

    def commit_puts(items):
        journal.events.append(("commit", len(items)))
        return real(items)

    index.commit_puts = commit_puts


def test_every_write_then_one_fdatasync_per_slab_then_one_index_transaction(index):
    j = Journal(index)
    spy_commits(index, j)
    b = batch(j, 3) + batch(j, 2, kind=IDX, first=10)
    res = committer(index).commit(b)
    assert [r.outcome for r in res] == [WriteOutcome.OK] * 5
    ev = j.events
    assert ev[:5] == [("written", s) for s in (100, 101, 102, 110, 111)]  # no sync before every write finished
    assert sorted(ev[5:7]) == [("sync", "index_k", 0), ("sync", "target_kv", 0)]  # one each, nothing indexed yet
    assert ev[7:] == [("commit", 5)]  # the whole batch in one transaction, after both syncs
    entries = index.get_many(j.keys)
    assert [e.slot for e in entries] == [100, 101, 102, 110, 111] and all(e.rank == 0 and e.disk == 0
                                                                           for e in entries)
    assert all(r.last_access == entries[0].last_access > 0 for r in res)  # the entry's time, for the LRU


def test_a_slab_whose_fdatasync_failed_has_none_of_its_pages_committed(index):
    j = Journal(index)
    b = batch(j, 2, slab=j.slab("kv", fails=True)) + batch(j, 2, kind=IDX, first=10)
    res = committer(index).commit(b)
    by = {r.slot: r for r in res}
    assert [by[s].outcome for s in (100, 101)] == [WriteOutcome.WRITE_ERROR] * 2
    assert "fdatasync" in str(by[100].failure)
    assert [by[s].outcome for s in (110, 111)] == [WriteOutcome.OK] * 2  # the other slab's pages are durable
    assert [e is not None for e in index.get_many(j.keys)] == [False, False, True, True]


def test_a_failed_write_and_a_cancelled_page_are_never_committed(index):
    j = Journal(index)
    res = committer(index).commit(batch(j, 4, fails={1}, cancelled={2}))
    assert {r.slot: r.outcome for r in res} == {100: WriteOutcome.OK, 101: WriteOutcome.WRITE_ERROR,
                                                102: WriteOutcome.CANCELLED, 103: WriteOutcome.OK}
    assert [e is not None for e in index.get_many(j.keys)] == [True, False, False, True]


def test_a_page_another_spill_committed_first_is_a_dedup_and_its_entry_stays(index):
    j = Journal(index)
    b = batch(j, 2)
    first = IndexEntry(3, 1, 7, 42)  # another rank stored the same page first
    index.put(b[1].page.key, first)
    res = committer(index).commit(b)
    assert [r.outcome for r in res] == [WriteOutcome.OK, WriteOutcome.DEDUP]  # the writer frees the DEDUP slot
    assert index.get(b[1].page.key) == first


def test_a_full_map_commits_nothing_and_says_so_for_every_page(index, monkeypatch):
    j = Journal(index)

    def full(items):
        index.last_refusal = Refusal(True, "MapFullError: injected")
        return None

    monkeypatch.setattr(index, "commit_puts", full)
    res = committer(index).commit(batch(j, 3))
    assert [r.outcome for r in res] == [WriteOutcome.INDEX_FULL] * 3  # the writer frees these slots
    assert index.get_many(j.keys) == [None] * 3


def test_a_commit_the_file_system_refused_is_resolved_page_by_page_against_the_index(index, monkeypatch):
    """Only a page whose entry names its own slot landed (OK); for every other page no entry names its slot, so the
    writer may free it (INDEX_ERROR), also where an entry of the same page names another rank's slot."""
    j = Journal(index)
    b = batch(j, 3)
    index.put(b[0].page.key, IndexEntry(0, 0, b[0].slot, 1))  # landed before the failure was reported
    index.put(b[1].page.key, IndexEntry(1, 0, b[1].slot, 1))  # the same page, another rank's slot

    def refused(items):
        index.last_refusal = Refusal(False, "Error: mdb_txn_commit: Input/output error")
        return None

    monkeypatch.setattr(index, "commit_puts", refused)
    res = committer(index).commit(b)
    assert [r.outcome for r in res] == [WriteOutcome.OK, WriteOutcome.INDEX_ERROR, WriteOutcome.INDEX_ERROR]
    assert "Input/output error" in str(res[1].failure)


def test_when_the_index_cannot_even_be_read_back_every_slot_is_kept(index, monkeypatch):
    """Unknown whether the entries landed: ERROR, which the writer never frees (a leak until the next cold start,
    never a slot an entry may still name)."""
    j = Journal(index)

    def refused(items):
        index.last_refusal = Refusal(False, "Error: injected")
        return None

    def unreadable(keys):
        raise OSError(errno.EIO, "injected: the index cannot be read")

    monkeypatch.setattr(index, "commit_puts", refused)
    monkeypatch.setattr(index, "get_many", unreadable)
    res = committer(index).commit(batch(j, 2))
    assert [r.outcome for r in res] == [WriteOutcome.ERROR] * 2
    assert "cannot be read back" in str(res[0].failure)


def test_a_batch_is_never_lost_when_its_commit_raises_and_batches_come_back_in_order(index, monkeypatch):
    j = Journal(index)
    deliver = Delivered(3)
    got, done = deliver.got, deliver.done

    c = committer(index, deliver)
    real = c.commit
    calls = itertools.count()

    def commit(b):
        if next(calls) == 1:
            raise RuntimeError("injected: a bug inside commit")
        return real(b)

    monkeypatch.setattr(c, "commit", commit)
    c.start()
    try:
        for first in (0, 10, 20):
            c.submit(batch(j, 2, first=first))
        assert done.wait(10)
    finally:
        c.stop()
    assert [[s for s, _ in g] for g in got] == [[100, 101], [110, 111], [120, 121]]
    assert got[0] == [(100, WriteOutcome.OK), (101, WriteOutcome.OK)]
    assert got[1] == [(110, WriteOutcome.INDEX_ERROR), (111, WriteOutcome.INDEX_ERROR)]  # nothing landed: freed
    assert got[2] == [(120, WriteOutcome.OK), (121, WriteOutcome.OK)]


def _grouped(index, j, deliver, n_batches, *, commit=None):
    """A committer given ``n_batches`` of two pages before it starts: they all wait, so one commit takes them."""
    c = committer(index, deliver, group_max=8)
    if commit is not None:
        real = c.commit
        c.commit = lambda b: commit(real, b)
    state = SimpleNamespace(kind=K, slab=j.slab(K.label))  # one kind on one disk: one slab, as in the store
    for k in range(n_batches):
        c.submit(batch(j, 2, first=10 * k, state=state))
    c.start()
    return c


def test_batches_waiting_together_share_one_fdatasync_and_one_index_transaction_and_come_back_per_batch(index):
    j = Journal(index)
    spy_commits(index, j)
    deliver = Delivered(3)
    got, done = deliver.got, deliver.done

    c = _grouped(index, j, deliver, 3)
    try:
        assert done.wait(10)
    finally:
        c.stop()
    assert c.commits == 1
    assert [e[0] for e in j.events] == ["written"] * 6 + ["sync", "commit"]  # every write, ONE sync, ONE transaction
    assert j.events[-1] == ("commit", 6) and j.events[-2][2] == 0  # nothing in the index before the fdatasync
    assert got == [[(100, WriteOutcome.OK), (101, WriteOutcome.OK)], [(110, WriteOutcome.OK), (111, WriteOutcome.OK)],
                   [(120, WriteOutcome.OK), (121, WriteOutcome.OK)]]
    slots = (100, 101, 110, 111, 120, 121)
    assert [(e.rank, e.disk, e.slot) for e in index.get_many(j.keys)] == [(0, 0, s) for s in slots]


@pytest.mark.parametrize("landed", [False, True], ids=["raised-before-the-commit", "raised-after-the-commit"])
def test_a_grouped_commit_that_raises_resolves_every_page_of_every_batch_against_the_index(index, landed):
    """A bug inside a grouped commit: every batch still comes back, in order, each page with the outcome the index
    says (landed: OK, its slot kept; not landed: INDEX_ERROR, its slot freed) -- never a page acknowledged that is
    not there, never one lost that is."""
    j = Journal(index)
    deliver = Delivered(3)
    got, done = deliver.got, deliver.done

    def commit(real, b):
        if landed:
            real(b)
        raise RuntimeError("injected: a bug inside commit")

    c = _grouped(index, j, deliver, 3, commit=commit)
    try:
        assert done.wait(10)
    finally:
        c.stop()
    want = WriteOutcome.OK if landed else WriteOutcome.INDEX_ERROR
    assert got == [[(s, want), (s + 1, want)] for s in (100, 110, 120)]
    assert all((e is not None) == landed for e in index.get_many(j.keys))


# ---------------------------------------------------------------------------------------------- through the store
def cfg(tmp_path, slots=64, **over):
    queues = {"staging_bytes": 32 * SLOT, "write_batch_pages": 8, "io_threads": 2, "reload_threads": 2}
    return l3kit.config(tmp_path, budget=slots * SLOT, map_size=64 * 2**20, **l3kit.merged({"queues": queues}, over))


def test_failed_fdatasync_fails_the_batch(store, monkeypatch):
    def bad_sync():
        raise OSError(errno.EIO, "injected fdatasync failure")

    monkeypatch.setattr(store.slab(K), "sync", bad_sync)
    assert all(store.spill(K, [key(i) for i in range(4)], [page(i) for i in range(4)]))
    assert store.flush(30)
    assert store.exists(K, [key(0)]) == 0
    assert store.stats()["write_errors"] == 4 and store.stats()["slots"]["target_kv"]["used"] == 0


def test_index_map_full_is_a_counted_miss(tmp_path, monkeypatch):
    s = L3Store.open(cfg(tmp_path), rank=0, namespace=NS, page_bytes={K: PB})
    try:
        monkeypatch.setattr(s.index, "commit_puts", lambda items: None)  # what L3Index returns on MapFullError
        assert all(s.spill(K, [key(i) for i in range(3)], [page(i) for i in range(3)]))
        assert s.flush(30)
        st = s.stats()
        assert st["index_full"] == 3 and st["spilled"] == 0 and st["slots"]["target_kv"]["used"] == 0
        assert s.exists(K, [key(0)]) == 0
    finally:
        monkeypatch.undo()
        s.close()


@pytest.mark.parametrize("readable", [True, False], ids=["resolved", "unreadable"])
def test_a_refused_commit_frees_exactly_the_slots_no_entry_names(tmp_path, monkeypatch, readable):
    """A commit the file system refused (INDEX_ERROR) returns its slots to the pool; one whose outcome is unknown
    because the index cannot be read back either (ERROR) keeps them."""
    s = L3Store.open(cfg(tmp_path), rank=0, namespace=NS, page_bytes={K: PB})
    try:
        def refused(items):
            s.index.last_refusal = Refusal(False, "Error: injected mdb_txn_commit failure")
            return None

        real_get_many = s.index.get_many

        def unreadable(keys):  # on the committer's read-back only (a spill reads the index too)
            if threading.current_thread().name.startswith("l3-commit"):
                raise OSError(errno.EIO, "injected: the index cannot be read")
            return real_get_many(keys)

        monkeypatch.setattr(s.index, "commit_puts", refused)
        if not readable:
            monkeypatch.setattr(s.index, "get_many", unreadable)
        assert all(s.spill(K, [key(i) for i in range(3)], [page(i) for i in range(3)]))
        assert s.flush(30)
        monkeypatch.setattr(s.index, "get_many", real_get_many)
        st = s.stats()
        assert st["write_errors"] == 3 and st["spilled"] == 0
        assert st["slots"]["target_kv"]["used"] == (0 if readable else 3)
        assert s.exists(K, [key(0)]) == 0
    finally:
        monkeypatch.undo()
        s.close()


def test_real_lmdb_map_full_through_the_store(tmp_path):
    s = L3Store.open(cfg(tmp_path, slots=4000, index={"map_size": 2**20}),
                     rank=0, namespace=NS, page_bytes={K: 4096 - HEADER_SIZE})
    try:
        n, full = 0, False
        small = np.zeros(4096 - HEADER_SIZE, np.uint8)
        while n < 20000 and not full:
            ks = [key(i, "mf") for i in range(n, n + 256)]
            s.spill(K, ks, [small] * 256)
            assert s.flush(60)
            n += 256
            full = s.stats()["index_full"] > 0
        assert full
        st = s.stats()
        assert st["slots"]["target_kv"]["used"] == st["spilled"] - st["gc_reclaimed"]
    finally:
        s.close()
