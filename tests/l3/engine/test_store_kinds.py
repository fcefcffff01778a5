"""A payload kind added after open (SGLang registers sidecar DRAFT / DRAFT_INDEXER host pools after the storage
attach): its slab sized by the config alone, served like the kinds opened first, kept across a `load` restart
whether it is opened with the others or added again later; refused, naming the fix, where the budget rule cannot
size it alone."""

import threading

import numpy as np
import pytest

import l3kit
from l3kit import key
from sglang_glm_ext.l3.config import L3ConfigError
from sglang_glm_ext.l3.errors import L3StoreError
from sglang_glm_ext.l3.disk.format import PayloadKind, slot_bytes_for
from sglang_glm_ext.l3.engine.store import L3Store

KV, IDX, DRAFT = PayloadKind.TARGET_KV, PayloadKind.INDEX_K, PayloadKind.DRAFT_KV
PB = {KV: 2 * 4096 + 100, IDX: 1000, DRAFT: 4096 + 7}
NS = l3kit.namespace(kv_dtype="fp8", layer_end=4, shard="replicated")
WEIGHTS = {"target_kv": 4, "index_k": 1, "draft_kv": 2}
BUDGET = 40 * (sum(slot_bytes_for(n) for n in PB.values()))


def page(kind, i):
    return l3kit.page(i, kind.label, nbytes=PB[kind])


def cfg(tmp_path, cold_start="load", weights=True):
    split = {"payload_split": "weights", "payload_weights": WEIGHTS} if weights else {}
    return l3kit.config(tmp_path, budget=BUDGET, deployment="kinds", map_size=16 * 2**20, cold_start=cold_start,
                        queues={"staging_bytes": 16 * slot_bytes_for(PB[KV]), "write_batch_pages": 4,
                                "io_threads": 1, "reload_threads": 1}, **split)


def open_store(c, kinds):
    return L3Store.open(c, rank=0, namespace=NS, page_bytes={k: PB[k] for k in kinds})


def spill(s, kind, idxs):
    assert s.spill(kind, [key(i) for i in idxs], [page(kind, i) for i in idxs]) == [True] * len(idxs)


def served(s, kind, idxs):
    dsts = [np.zeros(PB[kind], np.uint8) for _ in idxs]
    ok = s.reload_into(kind, [key(i) for i in idxs], dsts)
    return ok == [True] * len(idxs) and all(np.array_equal(d, page(kind, i)) for i, d in zip(idxs, dsts))


def test_a_kind_added_after_open_is_served_like_the_others(tmp_path):
    c = cfg(tmp_path)
    with open_store(c, (KV, IDX)) as s:
        spill(s, KV, range(3))
        s.add_kind(DRAFT, PB[DRAFT])
        s.add_kind(DRAFT, PB[DRAFT])  # idempotent for the same geometry
        for kind in (KV, IDX, DRAFT):
            spill(s, kind, range(3, 6))
        assert s.flush(30)
        for kind in (KV, IDX, DRAFT):
            assert s.exists(kind, [key(i) for i in range(3, 6)], include_staged=False) == 3 and served(s, kind, [3, 4, 5])
        total = s.stats()["slots"]["draft_kv"]["total"]
        assert total == c.slots_for_kind(0, "draft_kv", slot_bytes_for(PB[DRAFT]))
        assert s.slab(DRAFT).num_slots == total
        with pytest.raises(L3StoreError, match="draft_kv is open with"):
            s.add_kind(DRAFT, PB[DRAFT] + 1)


@pytest.mark.parametrize("restart", ["all_at_once", "added_again"])
def test_a_load_restart_keeps_the_late_kind_s_pages(tmp_path, restart):
    c = cfg(tmp_path)
    with open_store(c, (KV, IDX)) as s:
        s.add_kind(DRAFT, PB[DRAFT])
        for kind in (KV, IDX, DRAFT):
            spill(s, kind, range(4))
        assert s.flush(30)
        geometry = {k: (v["total"]) for k, v in s.stats()["slots"].items()}
    kinds = (KV, IDX, DRAFT) if restart == "all_at_once" else (KV, IDX)
    with open_store(cfg(tmp_path), kinds) as s2:  # the same slab sizes: no SlabGeometryError either way
        if restart == "added_again":
            assert s2.stats()["cold_start_loaded_pages"] == 8  # the draft entries wait for their kind...
            s2.add_kind(DRAFT, PB[DRAFT])
        assert s2.stats()["cold_start_loaded_pages"] == 12  # ...and count once it is added
        assert {k: v["total"] for k, v in s2.stats()["slots"].items()} == geometry
        for kind in (KV, IDX, DRAFT):
            assert served(s2, kind, range(4)), kind
        assert s2.stats()["slots"]["draft_kv"]["used"] == 4  # the loaded slots are taken, never handed out again


def test_equal_slots_refuses_a_late_kind_and_says_how(tmp_path):
    with open_store(cfg(tmp_path, weights=False), (KV, IDX)) as s:
        spill(s, KV, [0])
        with pytest.raises(L3ConfigError, match="payload_weights"):
            s.add_kind(DRAFT, PB[DRAFT])
        assert "draft_kv" not in s.stats()["slots"] and s.flush(30) and served(s, KV, [0])
        assert s.spill(DRAFT, [key(0)], [page(DRAFT, 0)]) == [False]  # a kind never added: a dropped write


def test_a_second_handle_may_ask_for_a_kind_the_store_added(tmp_path):
    c = cfg(tmp_path, cold_start="clear")
    with open_store(c, (KV, IDX)) as a:
        a.add_kind(DRAFT, PB[DRAFT])
        with open_store(c, (KV, IDX, DRAFT)) as b, open_store(c, (KV,)) as k_only:
            assert b.shared is a.shared is k_only.shared
            spill(b, DRAFT, [1])
            assert a.exists(DRAFT, [key(1)]) == 1


def test_a_second_open_asking_for_one_more_kind_adds_it_or_is_refused(tmp_path):
    from sglang_glm_ext.l3.errors import L3OwnerLockedError

    with open_store(cfg(tmp_path, cold_start="clear"), (KV, IDX)) as a:
        with open_store(cfg(tmp_path, cold_start="clear"), (KV, IDX, DRAFT)) as b:
            assert "draft_kv" in a.stats()["slots"] and b.shared is a.shared
    with open_store(cfg(tmp_path / "eq", weights=False), (KV, IDX)) as a:
        with pytest.raises(L3OwnerLockedError, match=r"other payload kinds.*draft_kv.*payload_weights") as ei:
            open_store(cfg(tmp_path / "eq", weights=False), (KV, IDX, DRAFT))
        assert ei.value.in_this_process and a.shared.refs == 1


def test_adding_a_kind_while_other_kinds_are_written_and_read(tmp_path):
    c = cfg(tmp_path, cold_start="clear")
    with open_store(c, (KV, IDX)) as s:
        stop, errors = threading.Event(), []

        def traffic():
            i = 0
            while not stop.is_set():
                try:
                    s.spill(KV, [key(i, "t")], [page(KV, i)])
                    s.stats()
                    s.exists(KV, [key(i, "t")])
                except Exception as e:  # the data path must not raise, and stats must not trip on a new kind
                    errors.append(e)
                i += 1

        t = threading.Thread(target=traffic)
        t.start()
        try:
            s.add_kind(DRAFT, PB[DRAFT])
        finally:
            stop.set()
            t.join(30)
        assert s.flush(30)
        spill(s, DRAFT, [9])  # after the flood (which may fill staging: a counted drop, not an error)
        assert not errors and s.flush(30) and served(s, DRAFT, [9])
        assert s.stats()["data_path_errors"] == 0


def test_a_late_kind_is_loaded_from_the_index_alone_and_a_v1_slab_of_it_is_discarded(tmp_path, monkeypatch):
    """Issue 13 for kinds added after open (load_kind): no slab byte is read to keep their entries, and a slab of
    the old format (its sidecar says v1) keeps none of them, as at open."""
    import json
    import os

    from sglang_glm_ext.l3.engine.store import slab_path

    c = cfg(tmp_path)
    with open_store(c, (KV, IDX)) as s:
        s.add_kind(DRAFT, PB[DRAFT])
        for kind in (KV, IDX, DRAFT):
            spill(s, kind, range(4))
        assert s.flush(30)
    with open_store(cfg(tmp_path), (KV, IDX)) as s2:
        reads, real = [], os.preadv
        monkeypatch.setattr(os, "preadv", lambda fd, bufs, off: reads.append(off) or real(fd, bufs, off))
        s2.add_kind(DRAFT, PB[DRAFT])
        monkeypatch.undo()
        assert s2.stats()["cold_start_loaded_pages"] == 12 and len(reads) <= 1  # the O_DIRECT probe at open only
        assert served(s2, DRAFT, range(4))
    meta_path = slab_path(c, 0, DRAFT) + ".meta.json"
    meta = json.loads(open(meta_path).read())
    open(meta_path, "w").write(json.dumps({**meta, "format_version": 1}))
    with open_store(cfg(tmp_path), (KV, IDX)) as s3:
        s3.add_kind(DRAFT, PB[DRAFT])
        assert s3.stats()["cold_start_loaded_pages"] == 8  # KV and IDX kept; the v1 draft slab's four dropped
        assert s3.stats()["slots"]["draft_kv"]["used"] == 0
        assert s3.exists(DRAFT, [key(i) for i in range(4)]) == 0 and served(s3, KV, range(4))
