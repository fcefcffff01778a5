"""What SGLang 0.5.23 does with hugepage-backed host pools on its own: the gaps the `hugepages.*` patches close.

Seed lines 322-338 (fork commit: the host-pool size check inspected regular RAM, which reserved hugepages are
carved out of, so a correctly reserved node was refused; insufficient hugepages must fail loud with an actionable
message, not as a cryptic or silent mmap failure). Runs SGLang's unwrapped functions. When one of these fails
after an SGLang upgrade, upstream changed the behaviour: review the matching patch in
sglang_glm_ext/hugepages/patches.py (its remove_when) and tests/hugepages/test_hooks.py.
The real-kernel version of the fallback is
tests/hugepages/test_real_hugepages.py::test_sglang_alone_silently_falls_back_to_ordinary_pages.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import types

import pytest
import torch

import sglang.srt.mem_cache.host_memory as host_memory
from sglang.srt.mem_cache.storage.mmap import mmap_allocator as ma
from sglang_glm_ext.patching.ledger import resolve_original

GIB = 1024**3


@pytest.fixture
def stock(monkeypatch):
    """SGLang's own alloc_mmap / _alloc_hugepage / host_memory_budget_bytes, whatever register() wrapped earlier."""
    monkeypatch.setattr(ma, "_alloc_hugepage", resolve_original(f"{ma.__name__}._alloc_hugepage"))
    return types.SimpleNamespace(
        alloc_mmap=resolve_original(f"{ma.__name__}.alloc_mmap"),
        budget=resolve_original("sglang.srt.mem_cache.pool_host.base.host_memory_budget_bytes"))


def test_unknown_size_only_logs_and_maps_ordinary_pages(stock, monkeypatch, caplog):
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "2M")
    with caplog.at_level(logging.WARNING):
        t = stock.alloc_mmap((4096,), torch.uint8)
    assert t.shape == (4096,) and "Falling back to plain page-size mmap" in caplog.text


def test_failed_map_hugetlb_only_logs_and_maps_ordinary_pages(stock, monkeypatch, caplog):
    class FailingLibc:
        def mmap(self, *args):
            ctypes.set_errno(errno.ENOMEM)
            return ma._MAP_FAILED

    monkeypatch.setattr(ma, "_libc", FailingLibc())
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "1GB")
    with caplog.at_level(logging.ERROR):
        t = stock.alloc_mmap((4096,), torch.uint8)
    assert t.shape == (4096,) and "falling back to plain mmap" in caplog.text


def test_failed_map_hugetlb_is_an_oserror_that_alloc_mmap_catches():
    # The plugin's error is deliberately not an OSError: this is the except clause it must get past.
    import inspect

    src = inspect.getsource(resolve_original(f"{ma.__name__}.alloc_mmap"))
    assert "except OSError as e:" in src and "except Exception" not in src


def test_host_memory_check_counts_only_ram(stock, monkeypatch):
    # 1 TiB reserved as hugepages leaves MemAvailable at 30 GiB: the budget is RAM minus SGLang's 10 GiB reserve,
    # whatever SGLANG_HUGEPAGE_SIZE says.
    vm = types.SimpleNamespace(available=30 * GIB)
    monkeypatch.setattr(host_memory, "psutil", types.SimpleNamespace(virtual_memory=lambda: vm))
    monkeypatch.setattr(host_memory, "_cgroup_memory_headroom", lambda *a, **k: None)
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "1GB")
    assert stock.budget(int(500e9)) == 20 * GIB
