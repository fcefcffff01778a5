"""The hugepage hooks driven through SGLang 0.5.23's own functions (seed 322-338), on a fake sysfs.

SGLang's HostTensorAllocator / alloc_mmap / _alloc_hugepage, host_memory_budget_bytes, HostKVCache's
_allocate_host_buffer and ServerArgs.check_server_args run for real; only the sysfs root and, where a test says
so, libc's mmap/madvise are fakes (a fake mmap hands out ordinary memory, so nothing here needs hugepages).
The real-kernel test is tests/hugepages/test_real_hugepages.py.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import types

import pytest
import torch

import sglang.srt.mem_cache.host_memory as host_memory
import sglang.srt.mem_cache.pool_host.base as base
import sglang.srt.mem_cache.pool_host.common as common
from sglang.srt.mem_cache.storage.mmap import mmap_allocator as ma
from sglang_glm_ext.hugepages import capacity as hp
from sglang_glm_ext.hugepages import hooks as hh
from sglang_glm_ext.patching.ledger import resolve_original, source_sha

MIB, GIB = hp.MIB, hp.GIB
MB2, GB1 = 2048, 1048576
FALLBACK = "SGLANG_GLM_EXT_HUGEPAGE_FALLBACK"


@pytest.fixture(autouse=True)
def plugin(hugepage_plugin):
    return hugepage_plugin


@pytest.fixture
def tree(fake_sysfs, monkeypatch):
    def make(size_kb=MB2, **pool):
        fs = fake_sysfs().pool(size_kb, **pool)
        monkeypatch.setattr(hh, "SYSFS_ROOT", fs.root)
        return fs

    return make


class FakeLibc:
    """libc's mmap/munmap/madvise as _alloc_hugepage calls them; mmap hands out ordinary memory or fails."""

    def __init__(self, mmap_errno=0, madvise_errno=0):
        self.mmap_errno, self.madvise_errno = mmap_errno, madvise_errno
        self.maps, self._keep = [], []

    def mmap(self, addr, length, prot, flags, fd, off):
        self.maps.append((length, flags))
        if self.mmap_errno:
            ctypes.set_errno(self.mmap_errno)
            return ma._MAP_FAILED
        buf = ctypes.create_string_buffer(length)
        self._keep.append(buf)
        return ctypes.addressof(buf)

    def munmap(self, ptr, length):
        return 0

    def madvise(self, ptr, length, advice):
        if self.madvise_errno:
            ctypes.set_errno(self.madvise_errno)
            return -1
        return 0


@pytest.fixture
def libc(monkeypatch):
    def make(**kw):
        fake = FakeLibc(**kw)
        monkeypatch.setattr(ma, "_libc", fake)
        return fake

    return make


def allocate(nbytes):
    """SGLang's default host-pool allocator, as every HiCache pool calls it on CUDA (alloc_with_host_register)."""
    return common.HostTensorAllocator().allocate((nbytes,), torch.uint8, "cpu")


# ---- the allocation: unknown size, shortfall, failure ----

@pytest.mark.parametrize("raw", ["2M", "1G", "4MB", "yes"])
def test_unknown_size_is_a_clear_error(monkeypatch, raw):
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", raw)
    with pytest.raises(hp.HugepageConfigError) as exc:
        allocate(4096)
    msg = str(exc.value)
    assert f"SGLANG_HUGEPAGE_SIZE={raw!r}" in msg and "2MB or 1GB" in msg and FALLBACK in msg


def test_unknown_size_with_fallback_keeps_sglangs_ordinary_pages(monkeypatch):
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "2M")
    monkeypatch.setenv(FALLBACK, "1")
    t = allocate(4096)
    t.fill_(7)
    assert t.shape == (4096,) and int(t.sum()) == 7 * 4096


def test_odd_fallback_value_is_a_clear_error(monkeypatch, tree):
    tree(free=100)
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "2M")
    monkeypatch.setenv(FALLBACK, "sometimes")
    with pytest.raises(hp.HugepageConfigError, match=FALLBACK):
        allocate(4096)


def test_shortfall_is_refused_before_any_mmap(monkeypatch, tree, libc):
    tree(free=2, total=10)
    fake = libc()
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "2MB")
    with pytest.raises(hp.HugepageCapacityError) as exc:
        allocate(8 * MIB)
    assert fake.maps == [], "the check must come before the mapping"
    msg = str(exc.value)
    for needle in ("8.0 MiB as 4 pages of 2 MB", "only 2 pages", "sysctl -w vm.nr_hugepages=12", "--hicache-size"):
        assert needle in msg, msg


def test_fitting_buffer_maps_hugepages_and_is_tracked(monkeypatch, tree, libc):
    tree(free=100)
    fake = libc()
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "2MB")
    t = allocate(5 * MIB)
    assert t.shape == (5 * MIB,)
    (length, flags), = fake.maps
    assert length == 6 * MIB and flags & ma._MAP_HUGETLB and flags & ma._MAP_HUGE_2MB
    assert hh._live_pages[2 * MIB] == 3
    del t
    gc.collect()
    assert hh._live_pages[2 * MIB] == 0


def test_mmap_failure_after_the_check_is_an_error_not_a_fallback(monkeypatch, tree, libc):
    tree(free=100)
    fake = libc(mmap_errno=errno.ENOMEM)
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "2MB")
    with pytest.raises(hp.HugepageAllocError) as exc:
        allocate(4 * MIB)
    assert len(fake.maps) == 1
    msg = str(exc.value)
    assert "Cannot allocate memory" in msg and "ordinary pages" in msg and "100 usable pages" in msg and FALLBACK in msg
    assert not isinstance(exc.value, OSError)  # SGLang's `except OSError` fallback must not catch it


def test_mmap_failure_with_fallback_keeps_sglangs_behaviour(monkeypatch, tree, libc):
    tree(free=100)
    libc(mmap_errno=errno.ENOMEM)
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "2MB")
    monkeypatch.setenv(FALLBACK, "1")
    assert allocate(4 * MIB).shape == (4 * MIB,)  # ordinary pages, as upstream


def test_mapping_without_all_its_pages_is_an_error(monkeypatch, tree, libc):
    tree(free=100)
    libc(madvise_errno=errno.EFAULT)
    monkeypatch.setattr(ma, "_has_madv_populate_write", lambda: True)
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "2MB")
    with pytest.raises(hp.HugepageAllocError, match="did not get all its pages"):
        allocate(4 * MIB)
    assert hh._live_pages.get(2 * MIB, 0) == 0
    monkeypatch.setenv(FALLBACK, "1")
    assert allocate(4 * MIB).shape == (4 * MIB,)


def test_missing_libc_is_an_error(monkeypatch, tree):
    tree(free=100)
    monkeypatch.setattr(ma, "_libc", None)
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "1GB")
    with pytest.raises(hp.HugepageAllocError, match="libc could not be loaded"):
        allocate(4096)


def test_unset_size_leaves_sglangs_allocation_alone(libc):
    fake = libc()
    assert allocate(3 * MIB).shape == (3 * MIB,)
    assert fake.maps == [] and hh._live_pages == {}


# ---- the RAM check ----

@pytest.fixture
def fixed_ram(monkeypatch):
    """Pin what SGLang's available_host_memory_bytes reads, so stock and hooked answers compare exactly."""
    def pin(available_gib):
        vm = types.SimpleNamespace(available=available_gib * GIB)
        monkeypatch.setattr(host_memory, "psutil", types.SimpleNamespace(virtual_memory=lambda: vm))
        monkeypatch.setattr(host_memory, "_cgroup_memory_headroom", lambda *a, **k: None)

    return pin


def stock_budget(*args, **kwargs):
    return resolve_original("sglang.srt.mem_cache.pool_host.base.host_memory_budget_bytes")(*args, **kwargs)


def test_ram_check_does_not_refuse_a_hugepage_pool(monkeypatch, tree, fixed_ram):
    # 1 TiB of 1 GB pages reserved: MemAvailable no longer counts them, so SGLang alone refuses a 500 GB pool.
    tree(GB1, free=1024)
    fixed_ram(30)
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "1GB")
    want = int(500e9)
    assert stock_budget(want) < want
    assert base.host_memory_budget_bytes(want) >= want


@pytest.mark.parametrize("requested", [0, 1, int(5e9), int(19e9), int(21e9), int(500e9)])
def test_ordinary_pools_keep_sglangs_check_byte_for_byte(fixed_ram, requested):
    fixed_ram(30)
    assert base.host_memory_budget_bytes(requested) == stock_budget(requested)
    assert base.host_memory_budget_bytes(requested, auto_size=True) == stock_budget(requested, auto_size=True)


def test_pools_that_ignore_hugepages_keep_sglangs_check(monkeypatch, tree, fixed_ram):
    tree(GB1, free=1024)
    fixed_ram(30)
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "1GB")
    monkeypatch.setattr(common, "get_allocator_type", lambda: "shm")
    assert base.host_memory_budget_bytes(int(500e9)) == stock_budget(int(500e9))


def test_short_hugepages_with_fallback_get_sglangs_ram_check(monkeypatch, tree, fixed_ram):
    tree(GB1, free=4)
    fixed_ram(30)
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "1GB")
    monkeypatch.setenv(FALLBACK, "1")
    # the pool will come from ordinary pages, so RAM is what must hold it
    assert base.host_memory_budget_bytes(int(500e9)) == stock_budget(int(500e9))


def test_budget_query_is_this_ranks_share_of_the_hugepages(monkeypatch, tree, fixed_ram):
    tree(GB1, free=1024)
    fixed_ram(30)
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "1GB")
    assert base.host_memory_budget_bytes() == 1024 * GIB  # one rank here (no torch.distributed)
    publish_plan(monkeypatch, hp.LaunchPlan(GIB, 8, 800, True))
    assert base.host_memory_budget_bytes(auto_size=True) == 100 * GIB


def test_budget_query_with_no_hugepages_names_them_not_ram(monkeypatch, tree, fixed_ram):
    tree(GB1, free=3)
    fixed_ram(30)
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "1GB")
    publish_plan(monkeypatch, hp.LaunchPlan(GIB, 8, 3, True))
    with pytest.raises(hp.HugepageCapacityError, match="auto-sized HiCache host pools: the 8 ranks"):
        base.host_memory_budget_bytes(auto_size=True)


def test_oversized_ordinary_pool_is_still_refused_by_sglang(fixed_ram, tiny_pool):
    TinyHostPool = tiny_pool
    fixed_ram(30)
    with pytest.raises(ValueError, match="Not enough host memory available"):
        TinyHostPool(host_size_gb=500)
    assert TinyHostPool.allocated is None


def test_hugepage_pool_passes_sglangs_pool_check(monkeypatch, tree, fixed_ram, tiny_pool):
    TinyHostPool = tiny_pool
    tree(GB1, free=1024)
    fixed_ram(30)
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "1GB")
    TinyHostPool(host_size_gb=500)
    assert TinyHostPool.allocated and TinyHostPool.allocated > 500e9


def test_hugepage_pool_shortfall_is_refused_at_sglangs_pool_check(monkeypatch, tree, fixed_ram, tiny_pool):
    TinyHostPool = tiny_pool
    tree(GB1, free=100)
    fixed_ram(30)
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "1GB")
    with pytest.raises(hp.HugepageCapacityError) as exc:
        TinyHostPool(host_size_gb=500)
    assert TinyHostPool.allocated is None
    assert "HiCache host pool of 465.7 GiB" in str(exc.value) and "466 pages of 1 GB" in str(exc.value)


def test_small_hugepage_pool_end_to_end_through_sglang(monkeypatch, tree, fixed_ram, libc, tiny_pool):
    tree(free=64)
    fixed_ram(30)
    fake = libc()
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "2MB")
    pool = tiny_pool(host_size_gb=0.01)  # 10 MB -> 2496 + 64 tokens of 4 KiB -> 5 pages
    assert pool.kv_buffer is not None and len(fake.maps) == 1
    assert fake.maps[0][0] == hp.pages_for(pool.size * 4096, 2 * MIB) * 2 * MIB


# ---- several ranks on one node ----

def publish_plan(monkeypatch, plan: hp.LaunchPlan, **fields):
    sa = types.SimpleNamespace(**{hh.LAUNCH_PLAN_ATTR: plan.to_dict()}, **fields)
    monkeypatch.setattr(hh, "_server_args", lambda: sa)


def run_rank(fs, need_bytes, page=GIB):
    """One rank in its own process: nothing held yet; check, then (if it passes) take the pages."""
    hh._reset_for_tests()
    hh.rank_check(need_bytes, page, what="a host pool")
    fs.consume(GB1, hp.pages_for(need_bytes, page))


def test_ranks_one_after_another_all_pass_when_the_node_fits(monkeypatch, tree):
    fs = tree(GB1, free=800)
    publish_plan(monkeypatch, hp.LaunchPlan(GIB, 8, 800, True))
    for _ in range(8):
        run_rank(fs, 100 * GIB)  # each sees fewer free pages, but only its own need is compared with them
    assert fs.read("sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages") == "0"


def test_naive_all_ranks_check_against_current_free_would_refuse_rank_two(tree):
    # The design this replaces: "ranks x my need vs free now" refuses a node that fits once rank 1 has mapped.
    fs = tree(GB1, free=800)
    fs.consume(GB1, 100)
    assert hp.check(100 * GIB, hp.capacity(fs.root, GIB), ranks=8) is not None


def test_every_rank_refuses_up_front_when_the_node_cannot_fit(monkeypatch, tree):
    fs = tree(GB1, free=750)
    publish_plan(monkeypatch, hp.LaunchPlan(GIB, 8, 750, True), hicache_size=107)
    for _ in range(8):  # concurrently or in any order: each refuses at its first pool, before mapping anything
        hh._reset_for_tests()
        with pytest.raises(hp.HugepageCapacityError) as exc:
            hh.rank_check(100 * GIB, GIB, what="a host pool")
        msg = str(exc.value)
        assert "the 8 ranks on this node together need 800.0 GiB as 800 pages" in msg
        assert "750 pages (750.0 GiB) are free when the launch started" in msg
        # 750 // 8 = 93 pages per rank; 93 GiB = 99.86e9 bytes, so --hicache-size 99 keeps 8 x 93 pages
        assert "now 107 GB per rank" in msg and "take at most 93.0 GiB in all (--hicache-size 99 at most)" in msg
    assert fs.read("sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages") == "750"


def test_node_total_counts_every_pool_of_the_rank(monkeypatch, tree):
    fs = tree(GB1, free=800)
    publish_plan(monkeypatch, hp.LaunchPlan(GIB, 8, 800, True))
    hh._live_pages[GIB] = 90  # this rank already holds its KV pool; now the DSA indexer pool
    with pytest.raises(hp.HugepageCapacityError, match="800 pages"):
        hh.rank_check(11 * GIB, GIB, what="the indexer pool")  # 8 x (90 + 11) = 808 > 800
    assert fs is not None


def test_unequal_pipeline_stages_only_warn_on_the_node_total(monkeypatch, tree, caplog):
    tree(GB1, free=750)
    publish_plan(monkeypatch, hp.LaunchPlan(GIB, 8, 750, False))
    with caplog.at_level("WARNING", logger="sglang_glm_ext"):
        hh.rank_check(100 * GIB, GIB, what="a host pool")
    assert "only a warning" in caplog.text


def test_a_rank_short_now_is_refused_even_if_the_launch_fit(monkeypatch, tree):
    fs = tree(GB1, free=800)
    publish_plan(monkeypatch, hp.LaunchPlan(GIB, 8, 800, True))
    fs.consume(GB1, 750)  # another process took pages after the launch
    with pytest.raises(hp.HugepageCapacityError, match="only 50 pages"):
        hh.rank_check(100 * GIB, GIB, what="a host pool")


def test_numa_bound_rank_is_checked_on_its_node(monkeypatch, fake_sysfs):
    fs = fake_sysfs(nodes=(0, 1)).pool(MB2, free=1100, node_free={0: 1000, 1: 100}).policy("bind:1")
    monkeypatch.setattr(hh, "SYSFS_ROOT", fs.root)
    with pytest.raises(hp.HugepageCapacityError) as exc:
        hh.rank_check(GIB, 2 * MIB, what="a host pool")
    assert "NUMA node(s) 1" in str(exc.value) and "node1/hugepages/hugepages-2048kB/nr_hugepages" in str(exc.value)
    hh.rank_check(100 * 2 * MIB, 2 * MIB, what="a host pool")


# ---- the launch ----

@pytest.fixture(scope="module")
def make_server_args():
    from sglang.srt.server_args import ServerArgs

    def make(**kw):
        kw.setdefault("model_path", "dummy")
        kw.setdefault("enable_hierarchical_cache", True)
        sa = ServerArgs(**kw)
        sa.resolve_once()
        return sa

    return make


def test_launch_refuses_a_node_whose_ranks_cannot_fit(monkeypatch, tree, make_server_args):
    tree(GB1, free=700)
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "1GB")
    sa = make_server_args(hicache_size=100, tp_size=8)
    with pytest.raises(hp.HugepageCapacityError) as exc:
        hh.plan_launch(sa)
    msg = str(exc.value)
    assert "--hicache-size 100 GB per rank" in msg and "the 8 ranks on this node together need 752.0 GiB" in msg
    assert "only 700 pages" in msg and "hugepagesz=1G hugepages=752" in msg and "at most 700 pages" not in msg
    assert not hasattr(sa, hh.LAUNCH_PLAN_ATTR)


def test_launch_that_fits_records_the_plan_for_the_ranks(monkeypatch, tree, make_server_args):
    import pickle

    tree(GB1, free=800)
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "1gb")
    sa = make_server_args(hicache_size=100, tp_size=8)
    hh.plan_launch(sa)
    plan = getattr(pickle.loads(pickle.dumps(sa)), hh.LAUNCH_PLAN_ATTR)  # as it reaches a scheduler process
    assert hp.LaunchPlan.from_dict(plan) == hp.LaunchPlan(GIB, 8, 800, True)


def test_ratio_sized_launch_is_left_to_the_ranks(monkeypatch, tree, make_server_args):
    tree(GB1, free=0)
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "1GB")
    sa = make_server_args(tp_size=4, pp_size=2)
    assert hh.plan_launch(sa)["usable_pages"] == 0  # sizes unknown before the device pool exists: no verdict


def test_launch_with_unknown_size_or_an_allocator_that_ignores_it_stops(monkeypatch, tree, make_server_args):
    tree(GB1, free=800)
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "1 GB")
    with pytest.raises(hp.HugepageConfigError, match="2MB or 1GB"):
        hh.plan_launch(make_server_args(hicache_size=10))
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "1GB")
    with pytest.raises(hp.HugepageConfigError, match="--hicache-storage-backend shm"):
        hh.plan_launch(make_server_args(hicache_size=10, hicache_storage_backend="shm"))
    monkeypatch.setenv(FALLBACK, "1")
    assert hh.plan_launch(make_server_args(hicache_size=10, hicache_storage_backend="shm")) is None


def test_launch_without_hicache_or_hugepages_is_untouched(monkeypatch, tree, make_server_args):
    tree(GB1, free=0)
    assert hh.plan_launch(make_server_args(hicache_size=100)) is None  # SGLANG_HUGEPAGE_SIZE unset
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "1GB")
    assert hh.plan_launch(make_server_args(enable_hierarchical_cache=False)) is None


def test_launch_check_fires_inside_sglangs_check_server_args(monkeypatch, tree, make_server_args):
    import sglang.srt.arg_groups.validation_hook as validation_hook

    tree(GB1, free=10)
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "1GB")
    # SGLang's own cross-field validation needs a real model and GPU platform; the method around it is real.
    monkeypatch.setattr(validation_hook, "check_server_args", lambda server_args: None)
    sa = make_server_args(hicache_size=100, tp_size=2)
    with pytest.raises(hp.HugepageCapacityError, match="the 2 ranks on this node"):
        sa.check_server_args()


def test_a_command_line_launch_gets_the_message_alone_an_engine_the_exception(monkeypatch, tree, make_server_args):
    """SGLang lets an exception from check_server_args escape launch_server as a traceback; a record built from a
    command line (prepare_server_args sets `_launch_command`) exits with the message instead. The subprocess
    launch is tests/hugepages/test_launch_cli.py."""
    import sglang.srt.arg_groups.validation_hook as validation_hook

    tree(GB1, free=10)
    monkeypatch.setattr(validation_hook, "check_server_args", lambda server_args: None)
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "3MB")
    engine = make_server_args(hicache_size=10)
    with pytest.raises(hp.HugepageConfigError):  # Engine(...): a ValueError the caller can catch
        engine.check_server_args()
    cli = make_server_args(hicache_size=10)
    cli._launch_command = ["--model-path", "dummy", "--enable-hierarchical-cache"]
    with pytest.raises(SystemExit) as exc:
        cli.check_server_args()
    msg = str(exc.value.code)
    assert "\n" not in msg and msg.startswith("sglang-glm-ext: SGLANG_HUGEPAGE_SIZE='3MB'")
    assert "set SGLANG_HUGEPAGE_SIZE to 2MB or 1GB" in msg and FALLBACK in msg
    monkeypatch.setenv(FALLBACK, "sometimes")
    with pytest.raises(SystemExit, match=f"^sglang-glm-ext: {FALLBACK}='sometimes'"):
        cli.check_server_args()


# ---- SGLang functions the hooks read without patching ----

@pytest.mark.parametrize("target,sha", [
    # hooks._allocator_kind mirrors it from the launch arguments
    ("sglang.srt.mem_cache.pool_host.common.get_allocator_type", "429745156a4c3b66"),
    # OWN_ALLOCATORS lists the kinds this maps to an allocator other than HostTensorAllocator
    ("sglang.srt.mem_cache.pool_host.common.get_allocator_from_storage", "5dade936b3b3dce8"),
    # the rank count when no launch plan reached the rank
    ("sglang.srt.mem_cache.pool_host.base.ranks_per_host", "559104b5cb63ef84"),
])
def test_sglang_code_the_hooks_mirror_is_unchanged(target, sha):
    assert source_sha(resolve_original(target)) == sha, f"{target} changed: review hugepages/hooks.py"


def test_host_pools_reach_alloc_mmap_through_the_default_allocator():
    import inspect

    assert "return alloc_mmap(dims, dtype)" in inspect.getsource(common.HostTensorAllocator.allocate)
    assert "_alloc_hugepage(n_bytes, alloc_bytes, extra_flags)" in inspect.getsource(
        resolve_original("sglang.srt.mem_cache.storage.mmap.mmap_allocator.alloc_mmap"))
