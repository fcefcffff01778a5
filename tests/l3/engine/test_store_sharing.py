"""One store per (index, deployment, rank) per process, shared: L3Store.open returns a counted handle onto the store
this process already has open when namespace, payload kinds and config match; cold start runs once, at the first
open; the last close closes. A mismatch is refused, naming both sides. Another process is refused as before
(disk/test_owner_lock.py)."""

import threading

import numpy as np
import pytest

import l3kit
from l3kit import K
from sglang_glm_ext.l3.errors import L3OwnerLockedError, L3StoreError
from sglang_glm_ext.l3.disk.format import Namespace, slot_bytes_for
from sglang_glm_ext.l3.disk.owner_lock import OwnerLock
from sglang_glm_ext.l3.engine.store import L3Store

PB = 4096 + 500
SLOT = slot_bytes_for(PB)
NS = l3kit.namespace(layer_end=4)


def key(i):
    return l3kit.key(i, "share")


def page(i):
    return l3kit.page(i, "share", nbytes=PB)


def cfg(tmp_path, disk="disk", **top):
    return l3kit.config(tmp_path, budget=32 * SLOT, deployment="sh", map_size=16 * 2**20, disk=disk, **{
        "queues": {"staging_bytes": 8 * SLOT, "write_batch_pages": 4, "io_threads": 1, "reload_threads": 1}, **top})


def open_store(config, ns=NS, pb=PB, **kw):
    return L3Store.open(config, rank=0, namespace=ns, page_bytes={K: pb}, **kw)


def writer_threads():
    return [t for t in threading.enumerate() if t.name == "l3-writer-r0"]


def test_two_opens_share_one_store_one_writer_one_lock(tmp_path):
    before = len(writer_threads())
    a = open_store(cfg(tmp_path))
    b = open_store(cfg(tmp_path))  # a second controller of the same (config, rank): no lock error
    try:
        assert a is not b and a.shared is b.shared and a.shared.refs == 2
        assert len(writer_threads()) == before + 1
        assert OwnerLock.find(str(tmp_path / "index"), "sh", 0).owner is a.shared
        assert a.spill(K, [key(0)], [page(0)]) == [True]
        assert b.exists(K, [key(0)]) == 1  # what one handle wrote the other sees at once
        a.close()
        a.close()  # a handle closes once: the second close drops no other handle's reference
        assert b.shared.refs == 1 and not b.shared.closed
        assert a.spill(K, [key(1)], [page(1)]) == [False] and a.exists(K, [key(0)]) == 0  # closed: misses
        assert b.flush(30) and b.exists(K, [key(0)], include_staged=False) == 1
        out = np.zeros(PB, np.uint8)
        assert b.reload_into(K, [key(0)], [out]) == [True] and np.array_equal(out, page(0))
    finally:
        a.close()
        b.close()
    assert b.shared.closed and L3Store.find_open(cfg(tmp_path), 0) is None
    assert len(writer_threads()) == before
    c = open_store(cfg(tmp_path))  # after the last close: a fresh store, locks free
    try:
        assert c.shared is not b.shared and c.shared.refs == 1
    finally:
        c.close()


def test_cold_start_runs_once_at_the_first_open(tmp_path):
    a = open_store(cfg(tmp_path, cold_start="clear"))
    try:
        assert all(a.spill(K, [key(i) for i in range(3)], [page(i) for i in range(3)])) and a.flush(30)
        b = open_store(cfg(tmp_path, cold_start="clear"), cold_start="clear")  # joins: no second clear
        try:
            assert b.exists(K, [key(i) for i in range(3)], include_staged=False) == 3
            assert b.stats()["cold_start"] == "clear"
        finally:
            b.close()
    finally:
        a.close()


def test_find_open_returns_the_shared_store_without_taking_a_reference(tmp_path):
    a = open_store(cfg(tmp_path))
    try:
        found = L3Store.find_open(cfg(tmp_path), 0)
        assert found is a.shared and found.refs == 1
    finally:
        a.close()
    assert L3Store.find_open(cfg(tmp_path), 0) is None


@pytest.mark.parametrize("what", ["namespace", "page_bytes", "config"])
def test_a_mismatching_open_is_refused_naming_both(tmp_path, what):
    a = open_store(cfg(tmp_path))
    try:
        with pytest.raises(L3OwnerLockedError) as ei:
            if what == "namespace":
                open_store(cfg(tmp_path), ns=Namespace("glm5", "fp8", "page_first", 64, 0, 4, "tp0"))
            elif what == "page_bytes":
                open_store(cfg(tmp_path), pb=PB + 64)
            else:
                open_store(cfg(tmp_path, disk="other_disk"))
        err = ei.value
        assert err.in_this_process and isinstance(err, L3StoreError)
        msg = str(err)
        if what == "namespace":
            other = Namespace("glm5", "fp8", "page_first", 64, 0, 4, "tp0").digest_for("sh").hex()
            assert a.shared.ns.hex() in msg and other in msg
        elif what == "page_bytes":
            assert str(PB) in msg and str(PB + 64) in msg
        else:
            assert "disk" in msg and "other_disk" in msg
        assert a.shared.refs == 1  # the refused open took no reference
        assert a.spill(K, [key(5)], [page(5)]) == [True]  # and the live store is untouched
    finally:
        a.close()


def test_handles_work_as_context_managers_and_share_counters(tmp_path):
    with open_store(cfg(tmp_path)) as a, open_store(cfg(tmp_path)) as b:
        assert all(a.spill(K, [key(7)], [page(7)])) and b.flush(30)
        assert a.stats()["spilled"] == 1 == b.stats()["spilled"]
    assert L3Store.find_open(cfg(tmp_path), 0) is None
