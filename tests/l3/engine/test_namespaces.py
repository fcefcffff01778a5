"""Issue 20, item 6: several models (namespaces) and slab geometries under one deployment on one L3 directory.

* Two models with the same page geometry take turns on a rank (same deployment_id, different model names): each
  ``cold_start = "load"`` used to drop the other's entries, so they evicted each other's whole cache at every
  restart. A load keeps every entry it can prove valid, whatever its namespace; only ``clear`` and GC under
  pressure (coldest first, any namespace) remove another namespace's pages.
* A new slab geometry under the same deployment (a model upgrade to another layer count: another page size, so
  another slot size) used to stop the launch with SlabGeometryError until someone deleted slabs by hand. It is
  served: its own slab beside the old one, both within the budget (the new slab's capacity is what the old one does
  not hold), the old pages reclaimed by GC as the new model needs room, the old slab's space handed over as it is
  reclaimed and the file removed once empty. The old model coming back finds whatever GC left of its pages.
* A budget change with the same page size keeps the slot boundaries: the slab is resized in place and its
  entries that still fit are kept.
"""

from __future__ import annotations

import glob
import os

import numpy as np

import l3kit
from l3kit import K, key
from sglang_glm_ext.l3.disk.format import slot_bytes_for
from sglang_glm_ext.l3.engine.index import deployment_tag
from sglang_glm_ext.l3.engine.store import L3Store

PB = 8192 + 10
SLOT = slot_bytes_for(PB)
NS_A = l3kit.namespace(model="glm-a", kv_dtype="fp8", shard="replicated")
NS_B = l3kit.namespace(model="glm-b", kv_dtype="fp8", shard="replicated")  # another model, same geometry
NS_C = l3kit.namespace(model="glm-c", kv_dtype="fp8", layer_end=92, shard="replicated")  # an upgrade: bigger pages
PB_C = 3 * 8192 + 50
SLOT_C = slot_bytes_for(PB_C)


def page(i, salt, pb=PB):
    return l3kit.page(i, salt, nbytes=pb)


def cfg(tmp_path, budget=40 * SLOT, start=0.9, stop=0.5):
    return l3kit.config(tmp_path, budget=budget, deployment="dep", gc={"start": start, "stop": stop},
                        cold_start="load")


def opened(tmp_path, ns, pb=PB, mode="load", **kw):
    return L3Store.open(cfg(tmp_path, **kw), rank=0, namespace=ns, page_bytes={K: pb}, cold_start=mode)


def spill(s, idxs, salt, pb=PB):
    l3kit.spill_durable(s, idxs, salt, nbytes=pb)


def reads_back(s, idxs, salt, pb=PB):
    return l3kit.reads_back(s, idxs, salt, nbytes=pb)


def entries(s):
    return sum(1 for _, e in s.index.iter_prefix(deployment_tag("dep")) if e.rank == 0)


def held(tmp_path):
    return sum(os.stat(p).st_blocks * 512 for p in glob.glob(str(tmp_path / "disk" / "dep" / "rank0" / "*.slab")))


def test_two_models_taking_turns_keep_each_others_pages_across_load_restarts(tmp_path):
    s = opened(tmp_path, NS_A, mode="clear")
    spill(s, range(10), "a")
    s.close()
    s = opened(tmp_path, NS_B)
    try:
        assert s.stats()["slots"]["target_kv"]["used"] == 10  # A's pages hold their slots: nothing handed out twice
        spill(s, range(10), "b")
        assert reads_back(s, range(10), "b") and s.exists(K, [key(0, "a")]) == 0  # never each other's bytes
    finally:
        s.close()
    for ns, salt, other in ((NS_A, "a", "b"), (NS_B, "b", "a"), (NS_A, "a", "b")):
        s = opened(tmp_path, ns)
        try:
            assert s.stats()["cold_start_loaded_pages"] == 10, ns  # its own pages came back
            assert s.exists(K, [key(i, salt) for i in range(10)], include_staged=False) == 10
            assert reads_back(s, range(10), salt)
            assert entries(s) == 20 and s.stats()["slots"]["target_kv"]["used"] == 20  # and the other's stayed
        finally:
            s.close()
    # clear removes every namespace of the rank, as it always did
    s = opened(tmp_path, NS_A, mode="clear")
    try:
        assert entries(s) == 0 and s.stats()["slots"]["target_kv"]["used"] == 0
    finally:
        s.close()


def test_gc_under_pressure_reclaims_the_coldest_pages_whatever_their_namespace(tmp_path):
    s = opened(tmp_path, NS_B, mode="clear")
    spill(s, range(20), "b")  # older: colder
    s.close()
    s = opened(tmp_path, NS_A)
    try:
        spill(s, range(30), "a")  # 50 pages for 40 slots: GC runs (start 0.9, stop 0.5)
        assert s.stats()["gc_reclaimed"] > 0
        b_left = s.exists(K, [key(i, "b") for i in range(20)], include_staged=False)
        assert entries(s) == s.stats()["slots"]["target_kv"]["used"] <= 40
        # B's 20 pages were colder than every page of A: they went first (an A page only once they were gone)
        a_left = sum(s.exists(K, [key(i, "a")], include_staged=False) for i in range(30))
        assert a_left == 30 or b_left == 0
    finally:
        s.close()


def test_a_new_page_geometry_is_served_beside_the_old_slab_within_the_budget(tmp_path):
    budget = 40 * SLOT
    s = opened(tmp_path, NS_A, mode="clear", budget=budget)
    spill(s, range(20), "a")
    s.close()
    # The upgrade: another page size under the same deployment. It opens (no SlabGeometryError) and serves at once.
    s = opened(tmp_path, NS_C, pb=PB_C, budget=budget)
    try:
        st = s.stats()["slots"]["target_kv"]
        assert 0 < st["total"] < budget // SLOT_C  # the capacity the old slab's 20 pages leave within the budget
        spill(s, range(3), "c", PB_C)
        assert reads_back(s, range(3), "c", PB_C)
        assert len(glob.glob(str(tmp_path / "disk" / "dep" / "rank0" / "*.slab"))) == 2
        assert held(tmp_path) <= budget + 64 * 1024
        assert entries(s) == 23  # A's pages are still there for A
    finally:
        s.close()
    s = opened(tmp_path, NS_A, budget=budget)  # the old model comes back: every page of it
    try:
        assert s.exists(K, [key(i, "a") for i in range(20)], include_staged=False) == 20
        assert reads_back(s, range(20), "a")
    finally:
        s.close()
    # The new model fills its slab: GC reclaims the old pages, hands their space over, removes the empty old slab.
    s = opened(tmp_path, NS_C, pb=PB_C, budget=budget)
    try:
        n = budget // SLOT_C
        for start in range(3, 2 * n, 4):
            spill(s, range(start, start + 4), "c", PB_C)
            assert held(tmp_path) <= budget + 64 * 1024  # never more than the budget on disk
        assert s.exists(K, [key(i, "a") for i in range(20)], include_staged=False) == 0
        assert glob.glob(str(tmp_path / "disk" / "dep" / "rank0" / "*.slab")) == [s.slab(K).path]
        assert s.stats()["slots"]["target_kv"]["total"] == n  # the whole budget is the new model's now
        assert entries(s) == s.stats()["slots"]["target_kv"]["used"]
        assert reads_back(s, range(2 * n - 8, 2 * n - 1), "c", PB_C)
    finally:
        s.close()


def test_a_new_geometry_under_clear_replaces_the_old_slab(tmp_path):
    s = opened(tmp_path, NS_A, mode="clear")
    spill(s, range(5), "a")
    s.close()
    s = opened(tmp_path, NS_C, pb=PB_C, mode="clear")
    try:
        assert s.stats()["slots"]["target_kv"]["total"] == (40 * SLOT) // SLOT_C and entries(s) == 0
        assert len(glob.glob(str(tmp_path / "disk" / "dep" / "rank0" / "*.slab"))) == 1
        spill(s, range(3), "c", PB_C)
        assert reads_back(s, range(3), "c", PB_C)
    finally:
        s.close()


def test_a_budget_change_resizes_the_slab_in_place_and_keeps_what_still_fits(tmp_path):
    s = opened(tmp_path, NS_A, mode="clear", budget=16 * SLOT)
    spill(s, range(12), "a")
    slots = {i: s.locate(K, key(i, "a"))[2] for i in range(12)}
    s.close()
    s = opened(tmp_path, NS_A, budget=32 * SLOT)  # raised: every page kept
    try:
        st = s.stats()["slots"]["target_kv"]
        assert (st["used"], st["total"]) == (12, 32) and reads_back(s, range(12), "a")
        spill(s, range(12, 20), "a")
        slots.update({i: s.locate(K, key(i, "a"))[2] for i in range(12, 20)})
        # Two of the first eight slots freed: what the lowered slab keeps then cannot fill it, so its GC (start =
        # 1.0: only when full) never runs and the kept pages are exactly what the resize kept (it used to race).
        gone = [i for i, sl in sorted(slots.items(), key=lambda x: x[1]) if sl < 8][:2]
        s.free(K, [key(i, "a") for i in gone])
        assert s.flush(30)
        for i in gone:
            del slots[i]
    finally:
        s.close()
    s = opened(tmp_path, NS_A, budget=8 * SLOT, start=1.0, stop=0.99)  # lowered: what still has its slot stays
    try:
        keep = sorted(i for i, sl in slots.items() if sl < 8)
        assert len(keep) == 6
        st = s.stats()["slots"]["target_kv"]
        assert (st["used"], st["total"]) == (len(keep), 8)
        assert reads_back(s, keep, "a") and entries(s) == len(keep)
        assert os.path.getsize(s.slab(K).path) == 8 * SLOT
    finally:
        s.close()


def test_fsck_places_every_entry_on_its_own_slab_and_repair_keeps_them(tmp_path):
    from sglang_glm_ext.l3.tools.fsck import fsck

    s = opened(tmp_path, NS_A, mode="clear")
    spill(s, range(6), "a")
    s.close()
    s = opened(tmp_path, NS_B)
    spill(s, range(4), "b")
    s.close()
    s = opened(tmp_path, NS_C, pb=PB_C)  # beside them, another slot size
    spill(s, range(3), "c", PB_C)
    config = s.config
    s.close()
    rep = fsck(config, repair=True)
    assert (rep.live, rep.orphan_index, rep.corrupt, rep.repaired, rep.exit_code) == (13, 0, 0, 0, 0), rep.render()
    assert rep.slabs_scanned == 2


def test_a_slab_cut_short_opens_and_only_its_cut_page_is_a_miss(tmp_path):
    s = opened(tmp_path, NS_A, mode="clear", budget=9 * SLOT, start=1.0, stop=0.99)
    spill(s, range(8), "a")
    last = max(range(8), key=lambda i: s.locate(K, key(i, "a"))[2])
    slot_of_last = s.locate(K, key(last, "a"))[2]
    path = s.slab(K).path
    s.close()
    cut = (slot_of_last + 1) * SLOT - 100
    os.truncate(path, cut)  # the file lost its tail, into the last used slot (not a whole slot)
    s = opened(tmp_path, NS_A, budget=9 * SLOT, start=1.0, stop=0.99)  # no SlabGeometryError: it opens
    try:
        assert os.path.getsize(path) == 9 * SLOT
        assert reads_back(s, [i for i in range(8) if i != last], "a")
        assert s.reload_into(K, [key(last, "a")], [np.zeros(PB, np.uint8)]) == [False]  # the cut page: a miss
    finally:
        s.close()
