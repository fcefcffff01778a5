"""Real 2 MB hugepages on this machine, through SGLang's allocator with the plugin's check (seed 322-338).

Reserves a few pages with the kernel's own knob (/proc/sys/vm/nr_hugepages when 2 MB is the default size, else
the 2 MB sysfs pool), builds a hugepage-backed host pool through SGLang's HostKVCache -> alloc_mmap ->
_alloc_hugepage, and restores the old reservation in a finally. Needs root and a kernel that grants the pages; it
skips with the kernel's reason where the reservation is refused (containers often mount /proc/sys read-only).
A lock file serializes it with any other run of it on the same machine.
"""

from __future__ import annotations

import fcntl
import gc
import os

import pytest
import torch

from sglang_glm_ext.hugepages import capacity as hp

MIB = hp.MIB
PAGES = 8
POOL = "/sys/kernel/mm/hugepages/hugepages-2048kB"
LOCK = "/tmp/sglang_glm_ext_hugepages_test.lock"


def _read(path: str) -> int:
    with open(path) as f:
        return int(f.read().strip())


def _knob() -> str:
    return "/proc/sys/vm/nr_hugepages" if hp.default_page_bytes("/") == 2 * MIB else f"{POOL}/nr_hugepages"


@pytest.fixture
def reserved_pages():
    """Reserve PAGES more 2 MB pages; yields how many are usable now; always puts the old count back."""
    if not os.path.isdir(POOL):
        pytest.skip("this kernel has no 2 MB hugepage pool (/sys/kernel/mm/hugepages/hugepages-2048kB)")
    knob = _knob()
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old = _read(knob)
        before = hp.read_size_pool("/", 2 * MIB).usable or 0
        try:
            try:
                with open(knob, "w") as f:
                    f.write(str(old + PAGES))
            except OSError as exc:
                pytest.skip(f"the kernel refused the hugepage reservation ({knob}): {exc}")
            got = (hp.read_size_pool("/", 2 * MIB).usable or 0) - before
            if got < PAGES:
                pytest.skip(f"asked {knob} for {PAGES} more 2 MB pages, the kernel gave {got} (no contiguous memory, "
                            "or a hugetlb limit)")
            yield before + PAGES
        finally:
            gc.collect()  # unmap what the test mapped before the pool shrinks back
            with open(knob, "w") as f:
                f.write(str(old))


def _page_size_kb_at(addr: int) -> int | None:
    """KernelPageSize of the mapping holding `addr`, from /proc/self/smaps."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and line.startswith("KernelPageSize:"):
                return int(line.split()[1])
    return None


def test_real_hugepage_pool_through_sglang_with_the_plugin_check(reserved_pages, hugepage_plugin, tiny_pool,
                                                                 monkeypatch):
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "2MB")
    usable = reserved_pages
    pool = tiny_pool(host_size_gb=0.01)  # SGLang sizes it: 10 MB -> 2560 tokens of 4 KiB = 5 pages of 2 MB
    buf = pool.kv_buffer
    pages = hp.pages_for(buf.numel(), 2 * MIB)
    assert pages == 5
    assert hp.read_size_pool("/", 2 * MIB).usable == usable - pages
    assert _page_size_kb_at(buf.data_ptr()) == 2048, "the pool must sit on 2 MB pages"
    buf[:: 4096].fill_(0x5A)
    assert int(buf[:: 4096].sum()) == 0x5A * buf[:: 4096].numel()
    assert hugepage_plugin._live_pages[2 * MIB] == pages

    # A second pool larger than what is left: refused by the check, before anything is mapped.
    with pytest.raises(hp.HugepageCapacityError) as exc:
        tiny_pool(host_size_gb=0.01)
    msg = str(exc.value)
    assert f"only {usable - pages} pages" in msg and "hugepages-2048kB/nr_hugepages" in msg, msg
    assert hp.read_size_pool("/", 2 * MIB).usable == usable - pages

    del pool, buf
    gc.collect()
    assert hp.read_size_pool("/", 2 * MIB).usable == usable
    assert hugepage_plugin._live_pages[2 * MIB] == 0


def test_real_map_hugetlb_failure_is_an_error(reserved_pages, hugepage_plugin, monkeypatch):
    from sglang.srt.mem_cache.pool_host.common import HostTensorAllocator

    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "2MB")
    # Skip the plugin's check so the kernel itself refuses the mapping (as when pages vanish after the check).
    monkeypatch.setattr(hugepage_plugin, "rank_check", lambda *a, **k: None)
    with pytest.raises(hp.HugepageAllocError) as exc:
        HostTensorAllocator().allocate(((reserved_pages + 1) * 2 * MIB,), torch.uint8, "cpu")
    assert "Cannot allocate memory" in str(exc.value) and "ordinary pages" in str(exc.value)
    assert hp.read_size_pool("/", 2 * MIB).usable == reserved_pages


def test_sglang_alone_silently_falls_back_to_ordinary_pages(reserved_pages, monkeypatch):
    """The gap on a real kernel: stock 0.5.23 hands back ordinary 4 kB pages when MAP_HUGETLB cannot be met."""
    from sglang.srt.mem_cache.storage.mmap import mmap_allocator as ma
    from sglang_glm_ext.patching.ledger import resolve_original

    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "2MB")
    monkeypatch.setattr(ma, "_alloc_hugepage", resolve_original(f"{ma.__name__}._alloc_hugepage"))
    stock_alloc_mmap = resolve_original(f"{ma.__name__}.alloc_mmap")
    t = stock_alloc_mmap(((reserved_pages + 1) * 2 * MIB,), torch.uint8)
    assert _page_size_kb_at(t.data_ptr()) == os.sysconf("SC_PAGE_SIZE") // 1024
    del t
    ok = stock_alloc_mmap((2 * MIB,), torch.uint8)
    assert _page_size_kb_at(ok.data_ptr()) == 2048
