"""L3Store end to end on real files: spill -> durable -> exists -> reload byte-exact, dedup, free, clear, staging
bounds, fault injection (ENOSPC / EIO / stalled disk / index full / bit flips), open-time errors."""

import errno
import os
import threading

import numpy as np
import pytest

import l3kit
from l3kit import K, NS, key
from sglang_glm_ext.l3.config import L3Config, L3ConfigError
from sglang_glm_ext.l3.disk.slab import fail_write
from sglang_glm_ext.l3.disk.format import HEADER_SIZE, Namespace, PayloadKind, slot_bytes_for
from sglang_glm_ext.l3.disk.host_layout import PageLayout
from sglang_glm_ext.l3.engine.store import L3Store, L3StoreError

PB = 3 * 4096 + 100  # not a BLOCK multiple, like GLM-5's 3,274,752 B
SLOT = slot_bytes_for(PB)
page = l3kit.pages_of(PB)


def cfg(tmp_path, slots=64, **over):
    queues = {"staging_bytes": 32 * SLOT, "write_batch_pages": 8, "io_threads": 2, "reload_threads": 2}
    return l3kit.config(tmp_path, budget=slots * SLOT, map_size=64 * 2**20, **l3kit.merged({"queues": queues}, over))


def spill_durable(s, idxs, salt="k"):
    l3kit.spill_durable(s, idxs, salt, nbytes=PB)


def test_locate_names_where_a_durable_page_lives(store):
    assert store.spill(K, [key(0)], [page(0)]) == [True]
    assert store.flush(30)
    rank, disk, slot = store.locate(K, key(0))
    assert (rank, disk) == (0, 0) and 0 <= slot < store.stats()["slots"]["target_kv"]["total"]
    assert store.locate(K, key(1)) is None and store.locate(K, "nothex") is None and store.locate("bogus", key(0)) is None
    assert store.stats()["cold_start_loaded_pages"] == 0  # clear mode


def test_roundtrip_byte_exact_and_exists_prefix(store):
    spill_durable(store, range(10))
    keys = [key(i) for i in range(12)]
    assert store.exists(K, keys) == 10
    assert store.exists(K, [key(0), key(99), key(1)]) == 1  # contiguous prefix only
    dsts = [np.zeros(PB, np.uint8) for _ in range(12)]
    ok = store.reload_into(K, keys, dsts)
    assert ok == [True] * 10 + [False] * 2
    for i in range(10):
        assert np.array_equal(dsts[i], page(i))
    st = store.stats()
    assert st["spilled"] == 10 and st["reload_hits"] == 10 and st["reload_misses"] == 2
    assert st["slots"]["target_kv"]["used"] == 10


def test_spill_returns_before_durable_and_caller_may_reuse_its_buffer(store):
    buf = page(1)
    assert store.spill(K, [key(1)], [buf]) == [True]
    buf[:] = 0  # the caller releases / overwrites its host page right after spill returns
    assert store.flush(30)
    out = np.zeros(PB, np.uint8)
    assert store.reload_into(K, [key(1)], [out]) == [True]
    assert np.array_equal(out, page(1))


def test_reload_into_unaligned_and_oversized_destinations(store):
    spill_durable(store, [3])
    raw = bytearray(PB + 7)
    dst = memoryview(raw)[3:3 + PB]  # unaligned address
    assert store.reload_into(K, [key(3)], [dst]) == [True]
    assert bytes(dst) == page(3).tobytes()
    big = np.zeros(PB + 4096, np.uint8)
    assert store.reload_into(K, [key(3)], [big]) == [True]
    assert np.array_equal(big[:PB], page(3))
    assert store.reload_into(K, [key(3)], [np.zeros(PB - 1, np.uint8)]) == [False]  # too small: a miss


def test_dedup_by_content_hash_no_second_write(store):
    spill_durable(store, range(4))
    writes = store.slab(K).counters["writes"]
    assert store.spill(K, [key(i) for i in range(4)], [page(i) for i in range(4)]) == [True] * 4
    assert store.flush(30)
    assert store.slab(K).counters["writes"] == writes
    # Same key twice in one call: staged once.
    assert store.spill(K, [key(7), key(7)], [page(7), page(7)]) == [True, True]
    assert store.flush(30)
    st = store.stats()
    assert st["spilled"] == 5 and st["dedup"] == 5


def test_layout_variants_gather_and_scatter(store):
    n_layers, sb, n_pages = 4, PB // 4, 6
    pb = n_layers * sb
    assert pb == PB
    host = np.random.default_rng(0).integers(0, 256, n_layers * sb * n_pages, dtype=np.uint8)
    lay = PageLayout.layer_first(host, n_layers=n_layers, slice_bytes=sb, num_pages=n_pages)
    keys = [key(i, "lay") for i in range(n_pages)]
    assert all(store.spill_from_layout(K, keys, lay, list(range(n_pages))))
    assert store.flush(30)
    want = host.copy()
    host[:] = 0
    assert store.reload_into_layout(K, keys, lay, list(range(n_pages))) == [True] * n_pages
    assert np.array_equal(host, want)


def test_free_removes_page_and_slot(store):
    spill_durable(store, range(3))
    store.free(K, [key(1)])
    assert store.flush(30)
    assert store.exists(K, [key(0), key(1)]) == 1
    assert store.reload_into(K, [key(1)], [np.zeros(PB, np.uint8)]) == [False]
    st = store.stats()
    assert st["slots"]["target_kv"]["used"] == 2 and st["freed"] == 1


def test_clear_empties_this_rank_and_keeps_counters(store):
    spill_durable(store, range(5))
    assert store.clear()
    assert store.exists(K, [key(0)]) == 0
    st = store.stats()
    assert st["slots"]["target_kv"]["used"] == 0 and st["spilled"] == 5  # counters are monotonic
    spill_durable(store, range(5, 8))
    assert store.exists(K, [key(5), key(6), key(7)]) == 3


def test_bad_keys_and_bad_pages_never_raise(store):
    assert store.spill(K, ["nothex", key(1)], [page(0), np.zeros(10, np.uint8)]) == [False, False]
    assert store.stats()["dropped_bad_input"] == 2
    assert store.exists(K, ["nothex"]) == 0
    assert store.reload_into(K, ["zz", key(5)], [np.zeros(PB, np.uint8)] * 2) == [False, False]
    assert store.spill("no_such_kind", [key(1)], [page(1)]) == [False]
    assert store.stats()["data_path_errors"] >= 1


def test_enospc_and_eio_on_write_are_counted_misses(store):
    for err in (errno.ENOSPC, errno.EIO):
        store.slab(K).inject_write_fault(fail_write(err))
        assert all(store.spill(K, [key(i, err) for i in range(3)], [page(i, err) for i in range(3)]))
        assert store.flush(30)
        assert store.exists(K, [key(0, err)]) == 0
    store.slab(K).inject_write_fault(None)
    st = store.stats()
    assert st["write_errors"] == 6 and st["spilled"] == 0
    assert st["slots"]["target_kv"]["used"] == 0  # every failed slot went back to the pool
    spill_durable(store, range(2))  # the store keeps working after the faults
    assert store.exists(K, [key(0), key(1)]) == 2


def test_stalled_disk_bounds_memory_and_drops_are_counted(tmp_path):
    s = L3Store.open(cfg(tmp_path, queues={"staging_bytes": 4 * SLOT, "write_batch_pages": 2}),
                     rank=0, namespace=NS, page_bytes={K: PB})
    try:
        gate = threading.Event()
        entered = threading.Event()

        def stalled(fd, data, offset):
            entered.set()
            gate.wait(30)
            return os.pwrite(fd, data, offset)

        s.slab(K).inject_write_fault(stalled)
        acc = []
        for i in range(40):
            acc += s.spill(K, [key(i)], [page(i)])
        assert entered.wait(10)
        st = s.stats()
        assert acc.count(True) <= 4 and acc.count(False) >= 36
        assert st["dropped_staging"] == acc.count(False)
        assert st["staging_allocated_bytes"] <= 4 * SLOT and st["staging_peak_bytes"] <= 4 * SLOT
        gate.set()
        s.slab(K).inject_write_fault(None)
        assert s.flush(30)
        accepted = [key(i) for i, a in enumerate(acc) if a]
        assert s.exists(K, accepted) == len(accepted)
    finally:
        gate.set()
        s.close()


def test_pool_full_drops_and_counts_never_blocks(tmp_path):
    # 4 slots, one write batch of 8 pages: the last 4 find every slot in flight (nothing committed that GC could
    # reclaim), so they are dropped and counted; spill itself returned at once.
    s = L3Store.open(cfg(tmp_path, slots=4, queues={"write_batch_pages": 8}), rank=0, namespace=NS,
                     page_bytes={K: PB})
    try:
        assert all(s.spill(K, [key(i) for i in range(8)], [page(i) for i in range(8)]))
        assert s.flush(30)
        st = s.stats()
        assert st["dropped_pool_full"] == 4 and st["spilled"] == 4
        assert st["slots"]["target_kv"]["used"] == 4 - st["gc_reclaimed"]
        # Later spills make room by reclaiming the coldest durable pages on the write path.
        spill_durable(s, [10])
        assert s.exists(K, [key(10)]) == 1
    finally:
        s.close()


def _flip(path, offset, bit):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ (1 << bit)]))
        f.flush()
        os.fsync(f.fileno())


@pytest.mark.slow
def test_random_bit_flips_are_misses_never_wrong_bytes(store):
    rng = np.random.default_rng(1234)
    path = store.slab(K).path
    dst = np.zeros(PB, np.uint8)
    wrong = 0
    trials = 400
    for t in range(trials):
        spill_durable(store, [t], salt="bf")
        slot = store.locate(K, key(t, "bf"))[2]
        off = int(rng.integers(0, PB + HEADER_SIZE))  # payload or header, never the unread pad
        if off >= PB:  # format v2: the header is the slot's last HEADER_SIZE bytes
            off += SLOT - HEADER_SIZE - PB
        _flip(path, slot * SLOT + off, int(rng.integers(0, 8)))
        ok = store.reload_into(K, [key(t, "bf")], [dst])
        if ok[0]:
            wrong += 1
    assert wrong == 0
    assert store.stats()["verify_failures"] == trials
    assert store.flush(30)
    # Failed verification reclaims the entry: the page is now a plain miss and its slot went back to the pool.
    assert store.exists(K, [key(0, "bf")]) == 0


def test_unusable_disk_path_is_a_clear_error_at_open(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")  # a file where a directory should be: fails even for root
    with pytest.raises(L3StoreError, match=r"disks\[0\].path: cannot create slab directory"):
        L3Store.open(L3Config.from_dict({"disks": [{"path": str(blocker / "d"), "budget": 10 * SLOT}],
                                         "index": {"path": str(tmp_path / "i")}}),
                     rank=0, namespace=NS, page_bytes={K: PB})


def test_open_errors_are_clear(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as a user that ignores permissions")
        with pytest.raises(L3StoreError, match=r"disks\[0\]"):
            L3Store.open(L3Config.from_dict({"disks": [{"path": str(ro / "d"), "budget": 10 * SLOT}],
                                             "index": {"path": str(tmp_path / "i")}}),
                         rank=0, namespace=NS, page_bytes={K: PB})
    finally:
        os.chmod(ro, 0o700)


def test_bad_open_arguments_are_loud(tmp_path):
    c = cfg(tmp_path)
    with pytest.raises(L3ConfigError, match="rank 3"):
        L3Store.open(c, rank=3, namespace=NS, page_bytes={K: PB})
    with pytest.raises(L3ConfigError, match="page_bytes"):
        L3Store.open(c, rank=0, namespace=NS, page_bytes={"bogus": PB})
    with pytest.raises(L3ConfigError, match="cold_start"):
        L3Store.open(c, rank=0, namespace=NS, page_bytes={K: PB}, cold_start="warm")
    with pytest.raises(L3ConfigError, match="budget"):
        L3Store.open(cfg(tmp_path, slots=1), rank=0, namespace=NS, page_bytes={K: 10 * PB})


def test_second_opener_of_the_same_rank_shares_or_gets_a_clear_error(tmp_path, store):
    # Issue 10 (N2): the same config, namespace and kinds share the one store of this process...
    again = L3Store.open(cfg(tmp_path), rank=0, namespace=NS, page_bytes={K: PB})
    assert again.shared is store.shared
    again.close()
    # ...anything else is refused, loudly, before it can touch the live store's slabs or entries.
    other = Namespace("glm5", "fp8", "page_first", 64, 0, 78, "tp0")
    with pytest.raises(L3StoreError, match="open in this process with another namespace"):
        L3Store.open(cfg(tmp_path), rank=0, namespace=other, page_bytes={K: PB})


def test_plp_required_refuses_an_unsafe_disk(tmp_path):
    with pytest.raises(L3StoreError, match="power-loss"):
        L3Store.open(cfg(tmp_path, require_plp=True, plp="assume_unsafe"), rank=0, namespace=NS,
                     page_bytes={K: PB})
    s = L3Store.open(cfg(tmp_path, require_plp=True, plp="assume_safe"), rank=0, namespace=NS, page_bytes={K: PB})
    assert s.plp.safe is True
    s.close()


def test_slab_and_dirs_are_owner_only(tmp_path, store):
    p = store.slab(K).path
    assert oct(os.stat(p).st_mode & 0o777) == oct(0o600)
    assert oct(os.stat(os.path.dirname(p)).st_mode & 0o777) == oct(0o700)


def test_namespace_mismatch_is_a_miss(tmp_path):
    s = L3Store.open(cfg(tmp_path), rank=0, namespace=NS, page_bytes={K: PB})
    spill_durable(s, [1])
    s.close()
    other = Namespace("glm5", "fp8", "page_first", 64, 0, 78, "tp0")
    s = L3Store.open(cfg(tmp_path, cold_start="load"), rank=0, namespace=other, page_bytes={K: PB})
    try:
        assert s.exists(K, [key(1)]) == 0
        assert s.reload_into(K, [key(1)], [np.zeros(PB, np.uint8)]) == [False]
    finally:
        s.close()


# ---------------------------------------------------------------------------------------------------------------
# Issue 7, item 1: a destination (or source) whose memory is not the page in order is refused, never acknowledged.
def test_reload_into_a_destination_it_cannot_write_in_place_is_a_counted_miss(store):
    spill_durable(store, [2])
    rows = PB // 4  # PB = 4 x 3097
    fortran = np.zeros((rows, 4), np.uint8, order="F")        # reshape(-1) of this is a C-order copy
    sliced = np.zeros((4, 2 * rows), np.uint8)[:, :rows]      # 2-D slice: not contiguous either
    readonly = np.zeros(PB, np.uint8)
    readonly.flags.writeable = False
    for dst in (fortran, sliced, readonly):
        assert store.reload_into(K, [key(2)], [dst]) == [False]
        assert not dst.any()  # untouched, and not acknowledged
    assert store.reload_into(K, [key(2)], [bytes(PB)]) == [False]  # an immutable buffer
    st = store.stats()
    assert st["reload_bad_dst"] == 4 and st["verify_failures"] == 0  # the page itself is fine: no reclaim
    # The same bytes into a C-contiguous 2-D array are fine, and the page is still there.
    ok = np.zeros((4, rows), np.uint8)
    assert store.reload_into(K, [key(2)], [ok]) == [True]
    assert np.array_equal(ok.reshape(-1), page(2))


def test_spill_refuses_a_source_whose_memory_order_is_not_the_page(store):
    rows = PB // 4
    src = np.asfortranarray(page(5).reshape(rows, 4))
    assert store.spill(K, [key(5)], [src]) == [False]
    assert store.spill(K, [key(6)], [np.zeros((4, 2 * rows), np.uint8)[:, :rows]]) == [False]
    assert store.stats()["dropped_bad_input"] == 2
    assert store.flush(30) and store.exists(K, [key(5)]) == 0


# Issue 7, item 8 and its class: one bad element of a batch (key, destination, index value) costs only its page.
def test_one_malformed_key_in_a_reload_batch_costs_only_its_own_page(store):
    spill_durable(store, range(3))
    keys = [key(0), "not-a-key", key(1), b"short", key(2)]
    dsts = [np.zeros(PB, np.uint8) for _ in keys]
    assert store.reload_into(K, keys, dsts) == [True, False, True, False, True]
    for j, i in ((0, 0), (2, 1), (4, 2)):
        assert np.array_equal(dsts[j], page(i))
    # A destination list shorter than the key list: the pages without a destination are misses, the rest hit.
    assert store.reload_into(K, [key(0), key(1)], [np.zeros(PB, np.uint8)]) == [True, False]
    assert store.stats()["data_path_errors"] == 0


def test_a_malformed_index_value_costs_only_its_own_page(store):
    spill_durable(store, range(3))
    bad = store.diagnostics().index_key(K, key(1))
    with store.index.env.begin(db=store.index.db, write=True) as txn:
        txn.put(bad, b"\x01" * 15)  # a damaged value: not the 16-byte entry layout
    dsts = [np.zeros(PB, np.uint8) for _ in range(3)]
    assert store.reload_into(K, [key(i) for i in range(3)], dsts) == [True, False, True]
    assert store.exists(K, [key(0), key(1), key(2)]) == 1  # the damaged entry is not a present page
    # Spilling a batch that contains the damaged key: the others are stored, and the damaged value is replaced.
    assert all(store.spill(K, [key(i) for i in range(1, 5)], [page(i) for i in range(1, 5)]))
    assert store.flush(30)
    assert store.exists(K, [key(i) for i in range(5)]) == 5
    out = np.zeros(PB, np.uint8)
    assert store.reload_into(K, [key(1)], [out]) == [True] and np.array_equal(out, page(1))
    st = store.stats()
    assert st["data_path_errors"] == 0 and st["write_errors"] == 0


def test_non_sequence_arguments_on_the_data_path_never_raise(store):
    spill_durable(store, [0])
    assert store.reload_into(K, None, None) == []
    assert store.reload_into(K, iter([key(0)]), [np.zeros(PB, np.uint8)]) == [True]
    assert store.spill(K, None, None) == []
    assert store.exists(K, None) == 0
    store.free(K, None)
    assert store.flush(30) and store.exists(K, [key(0)]) == 1


# Issue 7, item 2: deployments never share bytes; operator-configured directories keep their permissions.
def _dep_cfg(tmp_path, dep, disk, **over):
    return cfg(tmp_path, deployment_id=dep, disks=[{"path": str(disk), "budget": 64 * SLOT}], **over)


def test_a_blob_written_by_one_deployment_never_verifies_for_another(tmp_path):
    from sglang_glm_ext.l3.disk.format import verify_blob_reason

    a = L3Store.open(_dep_cfg(tmp_path, "a", tmp_path / "da"), rank=0, namespace=NS, page_bytes={K: PB})
    b = L3Store.open(_dep_cfg(tmp_path, "b", tmp_path / "db"), rank=0, namespace=NS, page_bytes={K: PB})
    try:
        spill_durable(a, [1])
        slot = a.locate(K, key(1))[2]
        with open(a.slab(K).path, "rb") as f:
            f.seek(slot * SLOT)
            blob = f.read(SLOT)
        assert verify_blob_reason(blob, kind=K, content_hash=key(1), ns_digest=a.ns)[1] == "ok"
        assert verify_blob_reason(blob, kind=K, content_hash=key(1), ns_digest=b.ns)[1] == "namespace_mismatch"
    finally:
        a.close()
        b.close()


def _alias_b_onto_a(tmp_path):
    """Deployment b's slab directory resolves to deployment a's (a symlink an operator made by mistake)."""
    (tmp_path / "db").mkdir()
    os.symlink(tmp_path / "da" / "a", tmp_path / "db" / "b")


def test_deployments_that_share_slab_files_are_refused_or_miss_never_served_each_others_bytes(tmp_path):
    a_cfg = _dep_cfg(tmp_path, "a", tmp_path / "da")
    b_cfg = _dep_cfg(tmp_path, "b", tmp_path / "db")
    a = L3Store.open(a_cfg, rank=0, namespace=NS, page_bytes={K: PB})
    spill_durable(a, [1])  # the page as deployment a computed it
    a.close()
    _alias_b_onto_a(tmp_path)
    # 1. The slab's sidecar names its owner: the aliased open is refused, naming both deployments.
    with pytest.raises(L3StoreError, match=r"belongs to deployment 'a'.*'b'"):
        L3Store.open(b_cfg, rank=0, namespace=NS, page_bytes={K: PB})
    # 2. Even without the sidecar (deleted), b's blobs never verify for a: the deployment is in every blob's digest.
    os.unlink(a_cfg.slab_dir(0) + "/target_kv.slab.meta.json")
    b = L3Store.open(b_cfg, rank=0, namespace=NS, page_bytes={K: PB})
    assert b.spill(K, [key(1)], [page(1, "other-weights")]) == [True]  # same key, deployment b's bytes
    assert b.flush(30)
    b.close()
    with pytest.raises(L3StoreError, match=r"belongs to deployment 'b'"):  # b's sidecar now names b
        L3Store.open(a_cfg, rank=0, namespace=NS, page_bytes={K: PB}, cold_start="load")
    os.unlink(a_cfg.slab_dir(0) + "/target_kv.slab.meta.json")
    a = L3Store.open(a_cfg, rank=0, namespace=NS, page_bytes={K: PB}, cold_start="load")
    try:
        out = np.zeros(PB, np.uint8)
        got = a.reload_into(K, [key(1)], [out])
        assert not np.array_equal(out, page(1, "other-weights"))
        assert got == [False]
    finally:
        a.close()


def test_open_never_changes_the_mode_of_an_existing_directory(tmp_path):
    disk, dep_dir, index = tmp_path / "disk", tmp_path / "disk" / "t", tmp_path / "index"
    for d, mode in ((disk, 0o755), (dep_dir, 0o750), (index, 0o750)):
        d.mkdir()
        os.chmod(d, mode)
    s = L3Store.open(cfg(tmp_path), rank=0, namespace=NS, page_bytes={K: PB})
    try:
        spill_durable(s, [0])
        for d, mode in ((disk, 0o755), (dep_dir, 0o750), (index, 0o750)):
            assert oct(os.stat(d).st_mode & 0o777) == oct(mode), d
        # What the store created itself is owner-only.
        assert oct(os.stat(os.path.dirname(s.slab(K).path)).st_mode & 0o777) == oct(0o700)
    finally:
        s.close()


def test_missing_directories_are_created_owner_only_whatever_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        s = L3Store.open(cfg(tmp_path), rank=0, namespace=NS, page_bytes={K: PB})
    finally:
        os.umask(old)
    try:
        for d in (tmp_path / "disk", tmp_path / "disk" / "t", tmp_path / "disk" / "t" / "rank0", tmp_path / "index"):
            assert oct(os.stat(d).st_mode & 0o777) == oct(0o700), d
    finally:
        s.close()


# Issue 7, item 7: a failed slab write must not pin a staging buffer, nor leave the staging accounting wrong.
@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC])
def test_after_one_failed_write_later_spills_of_every_kind_succeed(tmp_path, err):
    from sglang_glm_ext.l3.disk.slab import fail_write as _fail

    ik, ipb = PayloadKind.INDEX_K, 4096
    c = cfg(tmp_path, disks=[{"path": str(tmp_path / "disk"), "budget": 40 * (SLOT + slot_bytes_for(ipb))}],
            queues={"staging_bytes": 4 * SLOT, "write_batch_pages": 4})
    s = L3Store.open(c, rank=0, namespace=NS, page_bytes={K: PB, ik: ipb})
    try:
        s.slab(K).inject_write_fault(_fail(err))
        assert all(s.spill(K, [key(i, "a") for i in range(4)], [page(i, "a") for i in range(4)]))
        assert s.flush(30)
        s.slab(K).inject_write_fault(None)
        assert s.stats()["write_errors"] == 4
        # The four idle target_kv buffers fill the staging cap: an index_k spill must give one back (unmap it).
        small = [np.full(ipb, i, np.uint8) for i in range(4)]
        assert s.spill(ik, [key(i, "b") for i in range(4)], small) == [True] * 4
        assert s.flush(30)
        assert all(s.spill(K, [key(i, "c") for i in range(4)], [page(i, "c") for i in range(4)]))
        assert s.flush(30)
        assert s.exists(ik, [key(i, "b") for i in range(4)]) == 4
        assert s.exists(K, [key(i, "c") for i in range(4)]) == 4
        st = s.stats()
        assert st["data_path_errors"] == 0 and st["dropped_staging"] == 0
        assert st["staging_bytes"] == 0 and st["staging_allocated_bytes"] <= st["staging_cap_bytes"]
        # Accounting matches the buffers that really exist.
        pool = s.diagnostics().staging
        assert pool.allocated == sum(len(v) * pool.sizes[k] for k, v in pool._free.items())
    finally:
        s.close()


def test_open_fsyncs_every_directory_whose_entries_it_created(tmp_path, monkeypatch):
    """Found by reading: a new slab, sidecar, index file or directory is durable only once its parent directory
    is fsynced; index entries that point into a slab whose name a power cut lost would be lost pages."""
    import stat as _stat

    synced = []
    real = os.fsync

    def spy(fd):
        if _stat.S_ISDIR(os.fstat(fd).st_mode):
            synced.append(os.path.realpath(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    s = L3Store.open(cfg(tmp_path), rank=0, namespace=NS, page_bytes={K: PB})
    try:
        spill_durable(s, [0])
    finally:
        s.close()
    root = os.path.realpath(tmp_path)
    want = {root,                                   # disk/ and index/ were created in it
            f"{root}/disk", f"{root}/disk/t",       # the deployment and rank directories
            f"{root}/disk/t/rank0",                 # the slab file and its sidecar (renamed into place)
            f"{root}/index"}                        # data.mdb and lock.mdb
    assert want <= set(synced), sorted(want - set(synced))


def test_the_read_only_slab_falls_back_from_o_direct_without_closing_a_descriptor_in_use(tmp_path, monkeypatch):
    """Found by reading: on EINVAL the read-only slab closed its O_DIRECT descriptor and reopened it while other
    reader threads might be inside a read on it. Between the close and the reopen any other open in the process
    can take the freed number, so a reader in flight reads some other file."""
    import errno as _errno

    from sglang_glm_ext.l3.disk.aligned import AlignedBuffer
    from sglang_glm_ext.l3.disk.slab_reader import SlabReader as ReadOnlySlab

    slab = tmp_path / "x.slab"
    want = np.random.default_rng(3).integers(0, 256, 2 * 4096, dtype=np.uint8)
    slab.write_bytes(want.tobytes())
    decoy = tmp_path / "decoy"
    decoy.write_bytes(b"\xee" * 2 * 4096)
    rd = ReadOnlySlab(str(slab), 4096)
    if not rd.direct:
        rd.close()
        pytest.skip("this file system refuses O_DIRECT at open; the fallback race needs it to accept the flag")
    direct_fd = rd.fd
    b_inside, a_done = threading.Event(), threading.Event()
    real_preadv, real_open = os.preadv, os.open
    decoys = []

    def preadv(fd, bufs, offset):
        me = threading.current_thread().name
        if me == "B" and fd == direct_fd:
            b_inside.set()
            met["B waited for A's fallback"] = a_done.wait(60)
            return real_preadv(fd, bufs, offset)  # the number B took before A's fallback
        if me == "A" and fd == direct_fd:
            raise OSError(_errno.EINVAL, "injected: O_DIRECT transfer refused")
        return real_preadv(fd, bufs, offset)

    def open_(path, flags, *a):
        if threading.current_thread().name == "A" and os.fspath(path) == str(slab):
            decoys.append(real_open(str(decoy), os.O_RDONLY))  # another thread's open lands in between
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "preadv", preadv)
    monkeypatch.setattr(os, "open", open_)
    got, met = {}, {}

    def reader(name, slot):
        buf = AlignedBuffer(4096)
        if name == "A":
            met["A started with B's read in flight"] = b_inside.wait(60)
        rd.read_slot_into(slot, buf, 4096)
        got[name] = bytes(buf.view)
        if name == "A":
            a_done.set()

    ta = threading.Thread(target=reader, args=("A", 0), name="A")
    tb = threading.Thread(target=reader, args=("B", 1), name="B")
    tb.start()
    ta.start()
    ta.join(60)
    tb.join(60)
    monkeypatch.undo()
    try:
        assert not ta.is_alive() and not tb.is_alive(), "hang guard: a reader did not finish in 60 s"
        # the race happened as staged (not each read alone, which a loaded machine could make of two 10 s waits)
        assert met == {"A started with B's read in flight": True, "B waited for A's fallback": True}, met
        assert got["A"] == want[:4096].tobytes() and not rd.direct  # A fell back to buffered reads
        assert got["B"] == want[4096:].tobytes()  # B's read in flight still read the slab, not the decoy
    finally:
        rd.close()
        for fd in decoys:
            os.close(fd)
