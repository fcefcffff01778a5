"""Cold start: clear (default) vs load; load rebuilds pools + GC LRU from the index entries alone (no slab read),
and every page it keeps is still verified on read."""

import numpy as np
import pytest

import l3kit
from l3kit import K, NS
from sglang_glm_ext.l3.config import L3ConfigError
from sglang_glm_ext.l3.disk.format import Namespace, slot_bytes_for
from sglang_glm_ext.l3.engine.index import IndexEntry, make_key
from sglang_glm_ext.l3.engine.store import L3Store

PB = 8192 + 10
SLOT = slot_bytes_for(PB)


def key(i, salt="c"):
    return l3kit.key(i, salt)


def page(i, salt="c"):
    return l3kit.page(i, salt, nbytes=PB)


def cfg(tmp_path, slots=40, dep="dep", ranks=1, **over):
    return l3kit.config(tmp_path, budget=slots * SLOT * ranks, deployment=dep,
                        **{"ranks": {"count": ranks}, "gc": {"start": 0.9, "stop": 0.5}, **over})


def opened(tmp_path, mode, rank=0, **kw):
    return L3Store.open(cfg(tmp_path, **kw), rank=rank, namespace=NS, page_bytes={K: PB}, cold_start=mode)


def spill(s, idxs, salt="c"):
    l3kit.spill_durable(s, idxs, salt, nbytes=PB)


def reads_back(s, idxs, salt="c"):
    return l3kit.reads_back(s, idxs, salt, nbytes=PB)


def test_load_keeps_durable_pages_and_never_reuses_their_slots(tmp_path):
    s = opened(tmp_path, "clear")
    spill(s, range(10))
    s.close()
    s = opened(tmp_path, "load")
    try:
        assert s.loaded_pages == 10 and s.stats()["cold_start_loaded_pages"] == 10
        assert s.stats()["slots"]["target_kv"]["used"] == 10
        assert s.exists(K, [key(i) for i in range(10)]) == 10
        spill(s, range(100, 125), salt="new")  # 35 / 40 used: below the start watermark, no GC
        assert s.stats()["gc_reclaimed"] == 0
        assert reads_back(s, range(10)) and reads_back(s, range(100, 125), salt="new")
        slots = [e.slot for _, e in s.index.iter_rank(s.dep, 0, s.ns)]
        assert len(slots) == len(set(slots)) == 35  # no two entries share a slot
    finally:
        s.close()


def test_clear_is_the_default_and_starts_empty(tmp_path):
    s = opened(tmp_path, None)
    spill(s, range(5))
    s.close()
    s = opened(tmp_path, None)
    try:
        assert s.cold_start == "clear"
        assert s.exists(K, [key(0)]) == 0 and s.stats()["slots"]["target_kv"]["used"] == 0
    finally:
        s.close()


def test_clear_touches_only_this_deployment_and_rank(tmp_path):
    r1 = opened(tmp_path, "clear", rank=1, ranks=2)
    spill(r1, range(3), salt="r1")
    other = L3Store.open(cfg(tmp_path, dep="other"), rank=0, namespace=NS, page_bytes={K: PB}, cold_start="clear")
    spill(other, range(3), salt="o")
    r0 = opened(tmp_path, "clear", rank=0, ranks=2)
    spill(r0, range(3), salt="r0")
    r0.close()
    r0 = opened(tmp_path, "clear", rank=0, ranks=2)  # restart rank 0 with clear
    try:
        assert r0.exists(K, [key(0, "r0")]) == 0
        assert r0.exists(K, [key(i, "r1") for i in range(3)]) == 3  # rank 1's pages, readable by rank 0
        assert reads_back(r0, range(3), salt="r1")
        assert other.exists(K, [key(i, "o") for i in range(3)]) == 3
        assert r0.clear()  # runtime clear: same scope
        assert r0.exists(K, [key(0, "r1")]) == 1
    finally:
        for s in (r0, r1, other):
            s.close()


def test_load_keeps_entries_without_reading_the_slab_and_a_bad_one_is_a_miss_reclaimed_at_first_read(tmp_path):
    s = opened(tmp_path, "clear")
    spill(s, range(4))
    # An entry the slab cannot back (a slot never written: a disk that lost an acknowledged write) and one beyond
    # the slab. The second goes at load; the first is kept (load reads no slab), its slot stays allocated, and
    # its first reload is a miss that reclaims entry and slot: never wrong bytes.
    dep, ns = s.dep, s.ns
    s.index.put(make_key(dep, ns, K, bytes.fromhex(key(50))), IndexEntry(0, 0, 30, 1))
    s.index.put(make_key(dep, ns, K, bytes.fromhex(key(51))), IndexEntry(0, 0, 10_000, 1))
    s.close()
    s = opened(tmp_path, "load")
    try:
        assert s.loaded_pages == 5 and s.stale_dropped == 1
        assert s.exists(K, [key(51)]) == 0 and s.stats()["slots"]["target_kv"]["used"] == 5
        assert s.reload_into(K, [key(50)], [np.zeros(PB, np.uint8)]) == [False]
        assert s.flush(30)
        assert s.exists(K, [key(50)]) == 0 and s.stats()["slots"]["target_kv"]["used"] == 4
        assert s.stats()["verify_failures"] == 1 and reads_back(s, range(4))
    finally:
        s.close()


def test_load_reads_no_slab_bytes_so_its_cost_does_not_grow_with_the_pages(tmp_path, monkeypatch):
    """Issue 13, item 5: restart cost grows with the index, not with slab reads."""
    import os

    s = opened(tmp_path, "clear")
    spill(s, range(30))
    s.close()
    reads = []
    real = os.preadv

    def counting(fd, bufs, offset):
        reads.append(offset)
        return real(fd, bufs, offset)

    monkeypatch.setattr(os, "preadv", counting)
    s = opened(tmp_path, "load")
    monkeypatch.undo()
    try:
        assert s.loaded_pages == 30
        assert len(reads) <= 1  # the O_DIRECT probe of the slab at open; nothing per page
    finally:
        s.close()


def test_two_entries_naming_one_slot_keep_only_the_newest(tmp_path):
    s = opened(tmp_path, "clear")
    spill(s, range(3))
    e = s.diagnostics().entry(K, key(0))
    ghost = make_key(s.dep, s.ns, K, bytes.fromhex(key(60)))  # a delete that never landed: an older commit
    s.index.put(ghost, IndexEntry(0, 0, e.slot, e.last_access - 1))
    s.close()
    s = opened(tmp_path, "load")
    try:
        assert s.loaded_pages == 3 and s.stale_dropped == 1 and s.index.get(ghost) is None
        assert reads_back(s, range(3))
    finally:
        s.close()


def test_load_drops_every_entry_of_a_slab_it_cannot_vouch_for(tmp_path):
    """Entries naming a slab that was created by this open (the file was deleted), or whose sidecar is gone or
    names other geometry (another slot size, or a slot count the file does not have), are all dropped: their slots
    are free, their pages misses. (The sidecar's page size is only its last owner's: since issue 20 it does not
    decide, every namespace's entries are kept and verified on read.)"""
    import json
    import os

    from sglang_glm_ext.l3.engine.store import slab_path

    for damage in ("deleted", "no_sidecar", "other_slot_bytes", "other_num_slots"):
        root = tmp_path / damage
        s = opened(root, "clear")
        spill(s, range(5))
        path = slab_path(s.config, 0, K)
        s.close()
        if damage == "deleted":
            os.unlink(path)
        elif damage == "no_sidecar":
            os.unlink(path + ".meta.json")
        else:
            meta = json.loads(open(path + ".meta.json").read())
            if damage == "other_slot_bytes":
                meta["slot_bytes"] = SLOT + 4096
            else:
                meta["num_slots"] += 1
            open(path + ".meta.json", "w").write(json.dumps(meta))
        s = opened(root, "load")
        try:
            assert s.loaded_pages == 0 and s.stale_dropped == 5, damage
            assert s.stats()["slots"]["target_kv"]["used"] == 0 and s.index.count() == 0, damage
        finally:
            s.close()


def test_a_v1_slab_is_discarded_at_load_and_a_v1_blob_is_a_miss_never_served(tmp_path):
    """The upgrade policy (l3_format.md): a slab whose sidecar says format v1 keeps none of its entries at a load
    cold start; a v1 blob an entry still names (a sidecar rewritten before the drop committed) reads as
    old_version, is never served, and its entry is reclaimed."""
    import json

    from sglang_glm_ext.l3.engine.store import slab_path

    s = opened(tmp_path, "clear")
    spill(s, range(6))
    path = slab_path(s.config, 0, K)
    slot = s.diagnostics().entry(K, key(0)).slot
    s.close()
    _write_v1_blob(path, slot, key(0), s.ns, page(0))  # slot 0 now holds page 0 as a v1 build wrote it
    meta = json.loads(open(path + ".meta.json").read())
    open(path + ".meta.json", "w").write(json.dumps({**meta, "format_version": 1}))
    s = opened(tmp_path, "load")
    try:
        assert s.loaded_pages == 0 and s.stale_dropped == 6 and s.index.count() == 0
    finally:
        s.close()
    # The crash window: entries kept (sidecar already says v2) while a slot still holds a v1 blob.
    s = opened(tmp_path, "clear")
    spill(s, range(6))
    slot = s.diagnostics().entry(K, key(0)).slot
    s.close()
    _write_v1_blob(path, slot, key(0), s.ns, page(0))
    s = opened(tmp_path, "load")
    try:
        assert s.loaded_pages == 6
        dst = np.zeros(PB, np.uint8)
        assert s.reload_into(K, [key(0)], [dst]) == [False]
        assert s.flush(30) and s.exists(K, [key(0)]) == 0 and s.stats()["verify_failures"] == 1
        assert reads_back(s, range(1, 6))
    finally:
        s.close()


def _write_v1_blob(path, slot, key_hex, ns, payload):
    """Slot ``slot`` as a format-v1 build wrote it: header at the slot's start, payload behind, zero pad."""
    import struct

    import xxhash

    raw = bytearray(SLOT)
    struct.pack_into("<8sHBBI32sQQ16s40s", raw, 0, b"GLML3BLB", 1, int(K), 0, 0, bytes.fromhex(key_hex),
                     len(payload), xxhash.xxh3_64_intdigest(payload.tobytes()), ns, bytes(40))
    struct.pack_into("<Q", raw, 120, xxhash.xxh3_64_intdigest(bytes(raw[:120])))
    raw[128:128 + len(payload)] = payload.tobytes()
    with open(path, "r+b") as f:
        f.seek(slot * SLOT)
        f.write(raw)


def test_load_rebuilds_the_gc_lru_from_durable_last_access(tmp_path):
    s = opened(tmp_path, "clear")
    spill(s, range(10))
    assert s.reload_into(K, [key(0)], [np.zeros(PB, np.uint8)]) == [True]  # page 0 is the hottest
    s.close()  # close persists pending touches to the shared index
    s = opened(tmp_path, "load", gc={"start": 0.9, "stop": 0.8})
    try:
        spill(s, range(10, 36), salt="n")  # 36 / 40 = 0.9 -> GC down to 32: 4 pages go
        assert s.stats()["gc_reclaimed"] == 4
        assert s.exists(K, [key(0)]) == 1  # survived: its touched last_access came back with `load`
        # The 4 victims are carried-over cold pages (1..9), never the new ones nor the touched page 0.
        assert s.exists(K, [key(i, "n") for i in range(10, 36)]) == 26
        assert sum(s.exists(K, [key(i)]) for i in range(1, 10)) == 5
    finally:
        s.close()


def test_unknown_mode_is_loud(tmp_path):
    with pytest.raises(L3ConfigError, match="cold_start"):
        opened(tmp_path, "warm")


def test_load_under_a_new_namespace_keeps_the_old_namespace_pages_in_their_slots(tmp_path):
    """Issue 20, item 6 (it used to drop them): the old namespace's entries stay, their slots stay allocated (never
    handed out again) and in the GC LRU; the new namespace never sees them."""
    s = opened(tmp_path, "clear")
    spill(s, range(3))
    s.close()
    other = Namespace("glm5", "fp8", "page_first", 64, 0, 78, "tp0")
    s = L3Store.open(cfg(tmp_path), rank=0, namespace=other, page_bytes={K: PB}, cold_start="load")
    try:
        assert s.index.count() == 3 and s.stats()["slots"]["target_kv"]["used"] == 3
        assert s.loaded_pages == 0 and s.stats()["cold_start_other_namespace_pages"] == 3
        assert s.exists(K, [key(0)]) == 0 and s.reload_into(K, [key(0)], [np.zeros(PB, np.uint8)]) == [False]
        spill(s, range(10, 14))
        assert s.stats()["slots"]["target_kv"]["used"] == 7  # new pages took free slots, not the old pages' ones
    finally:
        s.close()


def test_env_var_overrides_the_config_mode_for_one_launch(tmp_path, monkeypatch):
    s = opened(tmp_path, "clear")
    spill(s, range(5))
    s.close()
    monkeypatch.setenv("SGLANG_CP_L3_COLD_START", "load")
    s = opened(tmp_path, None)  # config says clear (the default); the env var says load
    try:
        assert s.cold_start == "load" and s.exists(K, [key(i) for i in range(5)]) == 5
    finally:
        s.close()
    monkeypatch.setenv("SGLANG_CP_L3_COLD_START", "reload")
    with pytest.raises(L3ConfigError, match="unknown mode 'reload'"):
        opened(tmp_path, None)


# Issue 7, item 5: one damaged key in the index (a flipped byte in an LMDB leaf) must not end the cold-start scan.
def _damage_middle_key(tmp_path, s):
    import re

    ours = sorted(k for k, e in s.index.iter_rank(s.dep, 0, s.ns))
    victim = ours[len(ours) // 2]
    path = tmp_path / "index" / "data.mdb"
    raw = path.read_bytes()
    with open(path, "r+b") as f:
        for m in re.finditer(re.escape(victim), raw):
            f.seek(m.start())
            f.write(bytes([raw[m.start()] ^ 0xFF]))  # the deployment tag: now a foreign key amid ours
    return set(ours) - {victim}


def _records(s):
    with s.index.env.begin(db=s.index.db) as txn:
        return {bytes(k) for k, _ in txn.cursor()}


def _three_deployments(tmp_path, n=30):
    keep = {}
    for dep in ("aaa", "dep", "zzz"):
        st = L3Store.open(cfg(tmp_path, dep=dep), rank=0, namespace=NS, page_bytes={K: PB}, cold_start="clear")
        spill(st, range(n), salt=dep)
        keep[dep] = {k for k, _ in st.index.iter_rank(st.dep, 0, st.ns)}
        if dep == "dep":
            ours = _damage_middle_key(tmp_path, st)
        st.close()
    return keep, ours


def test_clear_removes_every_entry_of_the_rank_despite_a_damaged_key(tmp_path):
    keep, ours = _three_deployments(tmp_path)
    s = opened(tmp_path, "clear", dep="dep")
    try:
        left = _records(s)
        assert not ours & left  # before the fix the scan stopped at the damaged key and left the rest
        assert keep["aaa"] <= left and keep["zzz"] <= left  # other deployments untouched
    finally:
        s.close()


def test_load_accounts_for_every_entry_after_a_damaged_key(tmp_path):
    keep, ours = _three_deployments(tmp_path)
    s = opened(tmp_path, "load", dep="dep")
    try:
        assert s.loaded_pages == len(ours) == 29  # every undamaged entry: its slot is allocated, never reused
        assert s.stats()["slots"]["target_kv"]["used"] == 29
        spill(s, range(4), salt="new")  # new pages go to free slots only
        assert reads_back(s, range(4), salt="new")
        reachable = [i for i in range(30) if s.exists(K, [key(i, "dep")])]
        assert len(reachable) >= 25 and reads_back(s, reachable, salt="dep")
    finally:
        s.close()


def test_slabs_of_a_build_without_deployment_identity_become_misses_and_are_reclaimed(tmp_path, monkeypatch):
    """The upgrade policy in l3_format.md: blobs sealed with the namespace digest alone (earlier builds) never
    verify now; the first cold start drops their entries and gives their slots back."""
    monkeypatch.setattr(Namespace, "digest_for", lambda self, dep: self.digest())  # the previous build
    old = opened(tmp_path, "clear")
    spill(old, range(6))
    old.close()
    monkeypatch.undo()
    for mode in ("load", "clear"):
        s = opened(tmp_path, mode)
        try:
            assert s.loaded_pages == 0 and s.exists(K, [key(0)]) == 0
            assert s.reload_into(K, [key(0)], [np.zeros(PB, np.uint8)]) == [False]
            if mode == "load":
                # Keyed under another digest, they are another namespace's pages to this store (issue 20, item 6):
                # kept in their slots until GC or a clear (in reality such slabs are also format v1: dropped).
                assert s.index.count() == 6 and s.stats()["slots"]["target_kv"]["used"] == 6
            else:
                assert s.index.count() == 0 and s.stats()["slots"]["target_kv"]["used"] == 0
        finally:
            s.close()


def test_load_pauses_the_cyclic_gc_only_while_it_runs_and_restores_it_as_it_was(tmp_path, monkeypatch):
    """The load builds a few tuples per entry with the cyclic GC paused (its passes were most of the load's time);
    the process's GC state is what it was before, whichever it was, even when the load fails."""
    import gc

    from sglang_glm_ext.l3.engine import coldstart

    s = opened(tmp_path, "clear")
    spill(s, range(3))
    s.close()
    seen = []
    real = coldstart._keep

    def spy(*a, **k):
        seen.append(gc.isenabled())
        return real(*a, **k)

    monkeypatch.setattr(coldstart, "_keep", spy)
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            gc.enable() if enabled else gc.disable()
            opened(tmp_path, "load").close()
            assert gc.isenabled() is enabled and seen[-1] is False
        gc.enable()
        monkeypatch.setattr(coldstart, "_keep", lambda *a, **k: 1 / 0)
        with pytest.raises(Exception):
            opened(tmp_path, "load")
        assert gc.isenabled()
    finally:
        gc.enable() if was else gc.disable()
