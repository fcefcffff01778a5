"""The backend under attention CP, in one process: CP ranks are replicas with one owner per page; every rank hits
what any rank wrote (the node's shared index and the owner's slab); the CP rank is an attribute for metrics."""

import pytest
import torch

from sglang_glm_ext.l3.hicache.extra_config import AttachError

import leakguard
from l3kit import write_config
from .test_backend import attach, pools, transfers

PS = 64


@pytest.fixture(autouse=True)
def published(standins):
    from sglang_glm_ext.l3.demo import stack

    with leakguard.kept():
        stack.publish_server_args(stack.StackSpec(), storage_backend=None, extra_config=None)
        yield


def _cp_config(tmp_path, ranks=2, mode="spread"):
    p = write_config(tmp_path)
    text = open(p).read().replace("count = 1", f"count = {ranks}").replace('mode = "spread"', f'mode = "{mode}"')
    open(p, "w").write(text)
    return p


def _cp_rank(rank, size):
    from sglang.srt.runtime_context import get_parallel

    return get_parallel().override(tp_rank=rank, tp_size=size, attn_cp_size=size, attn_tp_size=1,
                                   moe_tp_size=size)


def _attach_cp(hp, cfg, rank, size, patch=True):
    with _cp_rank(rank, size):
        return attach(hp, cfg, tp_rank=rank, tp_size=size, attn_cp_rank=rank, attn_cp_size=size,
                      writers_patch=patch)


def _keys(n, salt="k"):
    import hashlib

    return [hashlib.sha256(f"{salt}{i}".encode()).hexdigest() for i in range(n)]


def _write_all(backends, hps, keys, idx):
    """What SGLang's backup thread does on every replica once the writer patch made each one a writer."""
    for be, hp in zip(backends, hps):
        assert be.batch_set_v2(transfers(hp, keys, idx))["indexer"] == [True] * len(keys)
        assert be.batch_set_v1(keys, idx) == [True] * len(keys)  # pages another rank owns are acknowledged
    for be in backends:
        be.store.flush()


@pytest.mark.parametrize("size", [2, 3])
def test_every_cp_rank_hits_every_page_and_each_page_is_written_once(tmp_path, size):
    from sglang.srt.mem_cache.hicache_storage import PoolName

    cfg = _cp_config(tmp_path, ranks=size)
    hps = [pools("dsa", "page_first") for _ in range(size)]
    for hp in hps:
        hp.fill_random(7)  # replicated KV: the same bytes on every CP rank
    want = {n: [hps[0].page_bytes(n, p) for p in range(8)] for n in hps[0].pools}
    bes = [_attach_cp(hp, cfg, r, size) for r, hp in enumerate(hps)]
    try:
        assert [b.cp_rank for b in bes] == list(range(size)) and {b.cp_size for b in bes} == {size}
        assert [b.rank for b in bes] == list(range(size))
        assert len({b.namespace.sealed_digest() for b in bes}) == 1  # CP-rank-free namespace
        keys = _keys(8)
        idx = torch.arange(0, 8 * PS, dtype=torch.int64)
        _write_all(bes, hps, keys, idx)
        written = [b.store.stats()["spill_accepted"] for b in bes]
        assert sum(written) == 2 * len(keys)  # KV + indexer, each page once over the group
        not_owned = [b.l3_stats()["backend"]["set_not_owned"] for b in bes]
        assert [w + o for w, o in zip(written, not_owned)] == [2 * len(keys)] * size
        for r, (be, hp) in enumerate(zip(bes, hps)):
            assert be.batch_exists(keys) == len(keys)
            res = be.batch_exists_v2(keys, transfers(hp, keys, idx))
            assert res.kv_hit_pages == len(keys) and res.extra_pool_hit_pages[PoolName.INDEXER] == len(keys)
            hp.zero()
            assert be.batch_get_v1(keys, idx) == [True] * len(keys)
            assert be.batch_get_v2(transfers(hp, keys, idx))["indexer"] == [True] * len(keys)
            assert {n: [hp.page_bytes(n, p) for p in range(8)] for n in hp.pools} == want, r
        # the pages live in every rank's slabs, so each rank read some through another rank's slab
        located = {bes[0].store.locate(bes[0].plan.kv.kind, k)[0] for k in map(bytes.fromhex, keys)}
        assert located == set(range(size))
    finally:
        for b in bes:
            b.close()


def test_one_per_node_mode_writes_everything_on_the_first_rank(tmp_path):
    cfg = _cp_config(tmp_path, ranks=2, mode="one_per_node")
    hps = [pools("dsa", "page_first") for _ in range(2)]
    for hp in hps:
        hp.fill_random(3)
    bes = [_attach_cp(hp, cfg, r, 2) for r, hp in enumerate(hps)]
    try:
        keys = _keys(6)
        _write_all(bes, hps, keys, torch.arange(0, 6 * PS, dtype=torch.int64))
        assert [b.store.stats()["spill_accepted"] for b in bes] == [12, 0]
        assert bes[1].batch_exists(keys) == 6
    finally:
        for b in bes:
            b.close()


def test_without_the_writer_patch_each_rank_writes_what_sglang_hands_it(tmp_path):
    """Stock SGLang calls batch_set only on its one writer; the backend must then write every page it gets."""
    cfg = _cp_config(tmp_path, ranks=2)
    hp = pools("dsa", "page_first")
    hp.fill_random(1)
    be = _attach_cp(hp, cfg, 0, 2, patch=False)
    try:
        assert be.writers.writes_everything
        keys = _keys(4)
        assert be.batch_set_v1(keys, torch.arange(0, 4 * PS, dtype=torch.int64)) == [True] * 4
        assert be.store.stats()["spill_accepted"] == 4
    finally:
        be.close()


def test_a_multi_node_group_without_the_writer_patch_is_refused_at_attach(tmp_path):
    from sglang.srt.runtime_context import get_parallel

    cfg = _cp_config(tmp_path, ranks=2)
    with get_parallel().override(tp_rank=3, tp_size=4, attn_cp_size=4, attn_tp_size=1, moe_tp_size=4, nnodes=2):
        with pytest.raises(AttachError, match="span nodes"):
            attach(pools("dsa", "page_first"), cfg, tp_rank=3, tp_size=4, attn_cp_rank=3, attn_cp_size=4)
        be = attach(pools("dsa", "page_first"), cfg, tp_rank=3, tp_size=4, attn_cp_rank=3, attn_cp_size=4,
                    writers_patch=True)
    try:
        assert be.rank == 1 and be.writers.writers == (2, 3) and be.writers.me == 1
    finally:
        be.close()


def test_a_rank_outside_the_nodes_ranks_count_is_refused(tmp_path):
    cfg = _cp_config(tmp_path, ranks=2)
    with pytest.raises(AttachError, match="ranks.count counts one node's ranks"):
        _attach_cp(pools("dsa", "page_first"), cfg, 2, 4)


def test_mha_under_cp_keeps_one_namespace_per_tp_rank(tmp_path):
    """MHA pages are not replicated: each rank writes its own (tp rank in the shard), never shared."""
    cfg = _cp_config(tmp_path, ranks=2)
    bes = [_attach_cp(pools("mha", "page_first"), cfg, r, 2) for r in range(2)]
    try:
        assert bes[0].namespace.sealed_digest() != bes[1].namespace.sealed_digest()
        assert all(b.writers.writes_everything for b in bes)
    finally:
        for b in bes:
            b.close()
