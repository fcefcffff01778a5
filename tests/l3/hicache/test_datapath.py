"""hicache/datapath.py: SGLang's storage calls carried out against a real store with nothing left to decide.

A ``PoolRecord`` here is planned from plain numpy host buffers (``pool_plans.plan_pool``): page-major MLA, layer-major
MLA and MHA K/V layouts, all with the same page bytes, so one store serves every layout. What a page's bytes are is
derived independently from a reshape of the buffer, never from the layout code. Covered: host indices -> pages
(refused before the store, counted), round trips in every layout, the flat path reading the layout path's pages,
the key tag of sidecar pools, the exists prefix over the KV run and v2 transfers, CP ownership (not-owned pages
acknowledged, or under ``durable`` only once the owner committed them), the StorageMetrics samples, and that it
never catches (the backend's adapter does).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import l3kit
from sglang_glm_ext.l3.disk.aligned import buffer_address
from sglang_glm_ext.l3.disk.format import PayloadKind
from sglang_glm_ext.l3.engine.store import L3Store
from sglang_glm_ext.l3.hicache import datapath
from sglang_glm_ext.l3.hicache.cp_writers import WriterPlan
from sglang_glm_ext.l3.hicache.datapath import BackendCounters, DataPath, Samples, indices_np
from sglang_glm_ext.l3.hicache.keys import pool_keys, pool_tag, storage_key
from sglang_glm_ext.l3.hicache.plan import PoolRecord
from sglang_glm_ext.l3.hicache.pool_plans import Buffer, PoolGeometry, plan_pool

PS, PAGES, L = 4, 8, 3
ROW = 64  # MLA: one row per token per layer
PB = PS * L * ROW  # 768 B: MHA with 32 B K and V rows has the same page bytes
KV, IDX = PayloadKind.TARGET_KV, PayloadKind.INDEX_K
NS = l3kit.namespace(model="datapath")
ALONE = WriterPlan("spread", (0,), 0)  # this rank writes every page


class Host:
    """One host pool over numpy buffers, its record, and the test's own view of a page's bytes."""

    def __init__(self, layout: str, name: str = "kv", kind=KV, seed=0):
        rng = np.random.default_rng(seed)
        self.layout = layout
        if layout == "mha_layer_first":
            self.bufs = [rng.integers(0, 256, L * PAGES * PS * ROW // 2, dtype=np.uint8) for _ in range(2)]
            geo = PoolGeometry(name, "mha", "layer_first", PS, PAGES, L, ROW // 2,
                               tuple(Buffer(buffer_address(b), b.nbytes) for b in self.bufs), v_row_bytes=ROW // 2)
        else:
            self.bufs = [rng.integers(0, 256, PAGES * PS * L * ROW, dtype=np.uint8)]
            geo = PoolGeometry(name, "mla", layout, PS, PAGES, L, ROW,
                               (Buffer(buffer_address(self.bufs[0]), self.bufs[0].nbytes),))
        plan = plan_pool(geo)
        assert plan.page_bytes == PB
        self.rec = PoolRecord(name, plan, kind, None)

    def page(self, p: int) -> bytes:
        """The page's payload bytes, from a reshape of the buffers (SGLang's get_data_page order)."""
        if self.layout == "page_first":
            return self.bufs[0].reshape(PAGES, PS * L * ROW)[p].tobytes()
        if self.layout == "layer_first":
            return self.bufs[0].reshape(L, PAGES, PS * ROW)[:, p].tobytes()
        return b"".join(b.reshape(L, PAGES, PS * ROW // 2)[:, p].tobytes() for b in self.bufs)  # K layers, V layers

    def zero(self):
        for b in self.bufs:
            b[:] = 0

    def nonzero(self) -> int:
        return sum(int(np.count_nonzero(b)) for b in self.bufs)


def tokens(pages) -> torch.Tensor:
    return torch.cat([torch.arange(p * PS, (p + 1) * PS, dtype=torch.int64) for p in pages])


def hexkey(first_byte: int, i: int) -> str:
    """A 64-hex-digit key (SGLang's SHA-256 form): stored as these 32 bytes, so its first byte picks its CP owner."""
    return (bytes([first_byte]) + i.to_bytes(31, "big")).hex()


@pytest.fixture
def store(tmp_path):
    s = L3Store.open(l3kit.config(tmp_path, budget=2**21), rank=0, namespace=NS, page_bytes={KV: PB, IDX: PB})
    yield s
    s.close()


def path(store, writers=ALONE, *, wait=0.0, durable=False):
    return DataPath(store, writers, BackendCounters(), Samples(), wait=wait, durable=durable)


# ------------------------------------------------------------------------------------------------ indices_np
def test_indices_np_flattens_any_tensor_or_sequence_to_int64():
    t = torch.arange(8, dtype=torch.int32).reshape(2, 4).t()  # 2-D, int32, not contiguous
    got = indices_np(t)
    assert got.dtype == np.int64 and got.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]  # logical order, not memory order
    assert indices_np([3, 1, 2]).tolist() == [3, 1, 2] and indices_np([3, 1, 2]).dtype == np.int64
    assert indices_np(np.array([[7], [9]], dtype=np.uint16)).tolist() == [7, 9]
    assert indices_np(torch.arange(0)).shape == (0,)


# ------------------------------------------------------------------------------------------------ spill / reload
@pytest.mark.parametrize("layout", ["page_first", "layer_first", "mha_layer_first"])
def test_pages_round_trip_through_the_store_and_nothing_else_is_written(store, layout):
    host = Host(layout, seed=1)
    want = {p: host.page(p) for p in (2, 0, 7)}
    dp = path(store)
    assert dp.spill(host.rec, ["a", "b", "c"], tokens([2, 0, 7])) == [True] * 3
    assert store.flush(30)
    host.zero()
    # Read back into other host pages than they came from: the indices say where each page lands.
    assert dp.reload(host.rec, ["c", "a", "b"], tokens([1, 5, 3])) == [True] * 3
    assert (host.page(1), host.page(5), host.page(3)) == (want[7], want[2], want[0])
    assert host.nonzero() == sum(np.count_nonzero(np.frombuffer(v, np.uint8)) for v in want.values())
    assert dp.c.as_dict() == dict(BackendCounters().as_dict())  # nothing refused


def test_a_page_not_in_the_store_is_a_miss_that_leaves_its_host_page_alone(store):
    host = Host("page_first", seed=2)
    dp = path(store)
    assert dp.spill(host.rec, ["a"], tokens([0])) == [True] and store.flush(30)
    before = host.page(4)
    assert dp.reload(host.rec, ["a", "missing"], tokens([6, 4])) == [True, False]
    assert host.page(4) == before and host.page(6) == host.page(0)


@pytest.mark.parametrize("idx,n,why", [
    (torch.arange(1, PS + 1), 1, "not on a page boundary"),
    (tokens([0]), 2, "fewer indices than keys"),
    (tokens([0, 1]), 1, "more indices than keys"),
    (torch.tensor([0, 1, 3, 2]), 1, "not one contiguous run"),
    (tokens([PAGES]), 1, "past the pool"),
    (torch.arange(-PS, 0), 1, "negative"),
])
def test_indices_that_are_not_whole_host_pages_are_refused_before_the_store(store, idx, n, why):
    host = Host("layer_first", seed=3)
    before = host.page(0)
    dp = path(store)
    keys = [f"k{i}" for i in range(n)]
    assert dp.spill(host.rec, keys, idx) == [False] * n, why
    assert dp.reload(host.rec, keys, idx) == [False] * n, why
    assert dp.c.bad_indices == 2 * n
    assert store.stats()["spill_accepted"] == 0 and host.page(0) == before
    assert dp.samples.take()["backup_pgs"] == []  # a refused call is no sample


def test_an_empty_call_is_an_empty_answer(store):
    host = Host("page_first")
    dp = path(store)
    assert dp.spill(host.rec, [], torch.arange(0)) == [] and dp.reload(host.rec, [], torch.arange(0)) == []
    assert dp.c.bad_indices == 0


def test_a_bad_key_is_not_caught_here(store):
    """The backend's adapter runs every call through one guard and error net: the data path itself raises."""
    with pytest.raises(TypeError, match="str or bytes"):
        path(store).spill(Host("page_first").rec, [123], tokens([0]))


def test_a_tagged_pool_stores_its_pages_under_its_own_keys(store):
    """A sidecar pool's pages are bound to its format through their keys: the raw key finds nothing, the tagged
    key the page; the untagged KV pool's page of the same key is another page."""
    side = Host("page_first", name="draft", kind=IDX, seed=4)
    tag = pool_tag(side.rec.plan.fmt)
    side.rec = dataclasses.replace(side.rec, tag=tag)
    kv = Host("page_first", seed=5)
    dp = path(store)
    assert dp.spill(side.rec, ["p"], tokens([1])) == [True] and dp.spill(kv.rec, ["p"], tokens([1])) == [True]
    assert store.flush(30)
    raw = storage_key("p")
    assert store.exists(IDX, [raw]) == 0 and store.exists(IDX, pool_keys([raw], tag)) == 1
    want = side.page(1)
    side.zero()
    assert dp.reload(side.rec, ["p"], tokens([2])) == [True] and side.page(2) == want != kv.page(1)


# ------------------------------------------------------------------------------------------------ flat pages
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_the_flat_path_reads_the_pages_the_layout_path_wrote(store, layout):
    host = Host(layout, seed=6)
    dp = path(store)
    assert dp.spill(host.rec, ["f"], tokens([3])) == [True] and store.flush(30)
    target = torch.zeros(PB // 2, dtype=torch.bfloat16)  # SGLang's flat page: any dtype of page_bytes
    assert dp.get_flat(host.rec, ["f"], [target])[0] is target
    assert target.view(torch.uint8).numpy().tobytes() == host.page(3)


def test_the_layout_path_reads_the_pages_the_flat_path_wrote(store):
    host = Host("layer_first", seed=7)
    page = torch.from_numpy(np.frombuffer(l3kit.page(1, "flat", nbytes=PB), np.uint8).copy())
    dp = path(store)
    assert dp.set_flat(host.rec, ["g"], [page]) is True and store.flush(30)
    assert dp.reload(host.rec, ["g"], tokens([5])) == [True]
    assert host.page(5) == page.numpy().tobytes()


def _bad_flat_values():
    return {
        "none": None,
        "not_a_tensor": np.zeros(PB, np.uint8),
        "short": torch.zeros(PB - 1, dtype=torch.uint8),
        "long": torch.zeros(PB + 2, dtype=torch.uint8),
        "strided": torch.zeros(2 * PB, dtype=torch.uint8)[::2],
    }


@pytest.mark.parametrize("bad", list(_bad_flat_values()))
def test_a_flat_buffer_that_is_not_one_contiguous_cpu_page_is_refused(store, bad):
    host = Host("page_first")
    dp = path(store)
    good = torch.ones(PB, dtype=torch.uint8)
    value = _bad_flat_values()[bad]
    assert dp.set_flat(host.rec, ["ok", "bad"], [good, value]) is False
    assert dp.c.bad_indices == 2  # the whole call is refused: not even the good page is written
    assert store.flush(30) and store.exists(KV, [storage_key("ok")]) == 0
    assert dp.set_flat(host.rec, ["ok"], [good]) is True and store.flush(30)
    target = torch.zeros(PB, dtype=torch.uint8)
    got = dp.get_flat(host.rec, ["ok", "ok"], [value, target])  # a bad target costs only its own page
    assert got[0] is None and got[1] is target and bool((target == 1).all())
    assert dp.c.bad_indices == 3


# ------------------------------------------------------------------------------------------------ exists / transfers
def _transfer(name, keys, idx=None, policy=None):
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

    return PoolTransfer(name=PoolName(name), host_indices=idx, keys=keys,
                        hit_policy=policy or PoolHitPolicy.ALL_PAGES)


def test_exists_is_the_leading_run_every_asked_pool_holds(store):
    from sglang.srt.mem_cache.hicache_storage import PoolName

    kv, idx = Host("page_first", seed=8), Host("layer_first", name="indexer", kind=IDX, seed=9)
    pools = {"kv": kv.rec, "indexer": idx.rec}
    dp = path(store)
    keys = ["a", "b", "c", "d"]
    assert all(dp.spill(kv.rec, keys[:3], tokens([0, 1, 2])))  # no flush: staged pages count already
    assert all(dp.spill(idx.rec, keys[:2], tokens([0, 1])))
    assert dp.exists(pools, keys) == (3, {"kv": 3})
    assert dp.exists(pools, ["d", "a"]) == (0, {})  # a prefix: a miss ends it
    assert dp.exists(pools, keys, [_transfer("indexer", keys)]) == (2, {"kv": 3, PoolName.INDEXER: 2})
    assert dp.c.exists_calls == 3 and dp.c.unknown_pool == 0


def test_exists_with_a_pool_it_does_not_serve_or_another_hit_policy_is_no_hit(store):
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy

    kv = Host("page_first", seed=10)
    pools = {"kv": kv.rec}
    dp = path(store)
    assert all(dp.spill(kv.rec, ["a", "b"], tokens([0, 1])))
    assert dp.exists(pools, ["a", "b"], [_transfer("swa", ["a", "b"])]) == (0, {"kv": 2})
    assert dp.exists(pools, ["a", "b"], [_transfer("kv", ["a", "b"], policy=PoolHitPolicy.TRAILING_PAGES)])[0] == 0
    assert dp.c.unknown_pool == 2
    assert dp.exists(pools, ["x"], [_transfer("swa", ["x"])]) == (0, {})  # no KV run: the transfers are not asked
    assert dp.c.unknown_pool == 2


def test_a_transfer_names_its_pool_and_carries_its_indices(store):
    kv = Host("page_first", seed=11)
    pools = {"kv": kv.rec}
    dp = path(store)
    assert dp.transfer(pools, _transfer("kv", ["t1", "t2"], tokens([4, 6])), dp.spill) == [True, True]
    assert dp.transfer(pools, _transfer("indexer", ["t1", "t2"], tokens([4, 6])), dp.spill) == [False, False]
    assert dp.transfer(pools, _transfer("kv", ["t1", "t2"], None), dp.reload) == [False, False]
    assert dp.transfer(pools, _transfer("kv", None, tokens([0])), dp.reload) == []
    assert (dp.c.unknown_pool, dp.c.bad_indices) == (1, 2)
    assert store.flush(30) and store.exists(KV, [storage_key("t1"), storage_key("t2")]) == 2


# ------------------------------------------------------------------------------------------------ CP ownership
TWO = [WriterPlan("spread", (0, 1), 0), WriterPlan("spread", (0, 1), 1)]  # two replicas on the node


def test_pages_another_replica_owns_are_acknowledged_not_written(store):
    host = Host("page_first", seed=12)
    dp = path(store, TWO[0])
    mine, theirs = hexkey(0x02, 1), hexkey(0x03, 2)  # first byte even: writer 0's; odd: writer 1's
    assert dp.spill(host.rec, [mine, theirs], tokens([0, 1])) == [True, True]
    assert dp.c.set_not_owned == 1
    assert store.flush(30)
    assert store.exists(KV, [mine]) == 1 and store.exists(KV, [theirs]) == 0
    assert store.stats()["spill_accepted"] == 1
    assert dp.samples.take()["backup_pgs"] == [1]  # the sample counts what this rank wrote


def test_a_rank_that_writes_nothing_acknowledges_every_page():
    plan = WriterPlan("one_per_node", (0,), -1)  # the node's first replica writes; this one does not
    host = Host("page_first")

    class NoStore:  # nothing may reach the store
        def __getattr__(self, name):
            raise AssertionError(f"store.{name} called")

    dp = path(NoStore(), plan)
    assert dp.spill(host.rec, ["a", "b", "c"], tokens([0, 1, 2])) == [True] * 3
    assert dp.c.set_not_owned == 3


def test_under_durable_acks_a_page_another_replica_owns_is_true_only_once_its_owner_committed_it(store):
    host = Host("page_first", seed=13)
    theirs = hexkey(0x05, 3)  # writer 1's
    early = path(store, TWO[0], wait=0.05, durable=True)
    assert early.spill(host.rec, [theirs], tokens([0])) == [False]  # its owner has not written it
    owner = path(store, TWO[1], wait=30.0, durable=True)
    assert owner.spill(host.rec, [theirs], tokens([0])) == [True]  # durable when it returns
    late = path(store, TWO[0], wait=30.0, durable=True)
    assert late.spill(host.rec, [theirs], tokens([0])) == [True]
    assert store.stats()["spill_accepted"] == 1  # written once, by its owner


def test_a_dedup_source_writes_each_page_into_its_owners_store_and_reads_any_of_them(tmp_path):
    """A host-dedup source writes for every writer of its node: each page into its owner's store (that rank's slab,
    disk and budget), none acknowledged as another's; its own store reads them all (one index per node)."""
    cfg = l3kit.config(tmp_path, budget=2**22, ranks={"count": 2},
                       disks=[{"path": str(tmp_path / "d0"), "budget": 2**21},
                              {"path": str(tmp_path / "d1"), "budget": 2**21}])
    assert cfg.disks_for_rank(0) == (0,) and cfg.disks_for_rank(1) == (1,)
    own = L3Store.open(cfg, rank=0, namespace=NS, page_bytes={KV: PB})
    other = L3Store.open(cfg, rank=1, namespace=NS, page_bytes={KV: PB})
    try:
        host = Host("page_first", seed=21)
        dp = DataPath(own, TWO[0], BackendCounters(), Samples(), wait=0.0, durable=False, stores={0: own, 1: other})
        keys = [hexkey(0x02, 1), hexkey(0x03, 2), hexkey(0x04, 3), hexkey(0x05, 4)]  # writers 0, 1, 0, 1
        assert dp.spill(host.rec, keys, tokens([0, 1, 2, 3])) == [True] * 4
        assert dp.c.set_not_owned == 0
        assert own.flush(30) and other.flush(30)
        assert [own.locate(KV, storage_key(k))[:2] for k in keys] == [(0, 0), (1, 1), (0, 0), (1, 1)]  # (rank, disk)
        assert own.stats()["spill_accepted"] == 2 and other.stats()["spill_accepted"] == 2
        assert dp.samples.take()["backup_pgs"] == [4]
        want = [host.page(p) for p in range(4)]
        host.zero()
        assert dp.reload(host.rec, keys, tokens([0, 1, 2, 3])) == [True] * 4
        assert [host.page(p) for p in range(4)] == want
    finally:
        other.close()
        own.close()


# ------------------------------------------------------------------------------------------------ samples
def test_spill_and_reload_each_leave_one_sample_of_what_they_moved(store):
    host = Host("page_first", seed=14)
    dp = path(store)
    assert dp.spill(host.rec, ["a", "b"], tokens([0, 1])) == [True, True] and store.flush(30)
    assert dp.reload(host.rec, ["a", "x", "b"], tokens([2, 3, 4])) == [True, False, True]
    m = dp.samples.take()
    assert m["backup_pgs"] == [2] and m["prefetch_pgs"] == [2]  # hits, not asks
    assert all(bw > 0 for bw in m["backup_bandwidth"] + m["prefetch_bandwidth"])
    assert dp.samples.take() == {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [],
                                 "backup_bandwidth": []}


def test_samples_report_gb_per_second_and_are_capped_per_interval(monkeypatch):
    monkeypatch.setattr(datapath, "_SAMPLES", 3)
    s = Samples()
    s.add("prefetch", 2, 4 * 10**9, 2.0)
    s.add("prefetch", 1, 10**9, 0.0)  # no measurable time: a page count, no bandwidth
    for _ in range(5):
        s.add("backup", 1, 10**6, 0.001)
    m = s.take()
    assert m["prefetch_pgs"] == [2, 1] and m["prefetch_bandwidth"] == [2.0]
    assert m["backup_pgs"] == [1, 1, 1] and len(m["backup_bandwidth"]) == 3
    assert m["backup_bandwidth"][0] == pytest.approx(10**6 / 0.001 / 1e9)
    s.add("backup", 4, 0, 1.0)
    assert s.take()["backup_pgs"] == [4]  # a new interval: room again


def test_counters_start_at_zero_and_name_every_refusal():
    c = BackendCounters()
    assert c.as_dict() == {name: 0 for name in
                           ("set_not_owned", "exists_calls", "bad_indices", "unknown_pool", "errors", "not_ready")}
    c.bad_indices += 2
    assert c.as_dict()["bad_indices"] == 2 and BackendCounters().as_dict()["bad_indices"] == 0

