"""Hooks that make SGLang 0.5.23's hugepage-backed host pools check capacity first and never fall back silently.

The `hugepages` feature's hooks (declared in patches.py; the feature and its env var in feature.py); the decisions
live in `capacity` (pure). This module holds per-process state (the pages this process mapped). Each hook
passes straight through to SGLang when SGLANG_HUGEPAGE_SIZE is unset, so ordinary-page pools run SGLang's code
unchanged. Every hook runs at startup (launch, host-pool construction), never on the data path.

- `hook_check_server_args` (launcher, before any scheduler is spawned): an unknown size, or a host-pool allocator
  that ignores hugepages, stops the launch; with an explicit --hicache-size, the node's ranks together must fit
  the free pages; what was free is recorded on the ServerArgs for the ranks (`LAUNCH_PLAN_ATTR`).
- `hook_host_memory_budget_bytes` (each rank, SGLang's host-RAM check before a pool is built): a hugepage-backed
  pool is checked against hugepages, not MemAvailable (which excludes reserved hugepages).
- `hook_alloc_mmap` (each rank, right before each mmap): this buffer's pages against what is usable now.
- `hook_alloc_hugepage` (the mmap itself): a failed MAP_HUGETLB mapping, or one whose pages did not all fault in,
  is an error instead of SGLang's fallback to ordinary pages.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import threading
import weakref

from . import capacity as hp
from .feature import HUGEPAGE_FALLBACK

logger = logging.getLogger("sglang_glm_ext")

SYSFS_ROOT = "/"  # tests point this at a fake tree
LAUNCH_PLAN_ATTR = "_glm_ext_hugepages"
# Host-pool allocators (SGLang 0.5.23 get_allocator_from_storage) that never call alloc_mmap, so ignore the size.
OWN_ALLOCATORS = ("mooncake", "mori", "shm", "tensorcast")

_lock = threading.Lock()
_live_pages: dict[int, int] = {}  # page size -> hugepages this process holds through alloc_mmap
_last_check: dict[int, hp.Capacity] = {}  # page size -> capacity seen by the check right before the mmap
_warned: set[str] = set()


# ---- settings ----

def fallback_allowed() -> bool:
    try:
        return HUGEPAGE_FALLBACK.get_bool()
    except ValueError as exc:
        raise hp.HugepageConfigError(f"sglang-glm-ext: {exc}") from None


def _raw_size() -> str:
    from sglang.srt.environ import envs as sglang_envs

    return sglang_envs.SGLANG_HUGEPAGE_SIZE.get() or ""


def selected_page_bytes() -> int | None:
    """Page bytes SGLANG_HUGEPAGE_SIZE asks for; None when unset, or unknown while the fallback is allowed."""
    try:
        return hp.parse_size(_raw_size())
    except hp.HugepageConfigError as exc:
        if fallback_allowed():
            return None
        raise hp.HugepageConfigError(f"sglang-glm-ext: {exc}. {_fallback_hint()}") from None


def _fallback_hint() -> str:
    return f"{HUGEPAGE_FALLBACK.name}=1 keeps SGLang's fallback to ordinary pages"


def _warn_once(key: str, msg: str, *args) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(msg, *args)


# ---- launch (main process) ----

def _view(server_args):
    try:
        from sglang.srt.arg_groups.overrides import resolving_view

        return resolving_view(server_args)
    except Exception:  # not resolvable here: the raw record carries the same input fields
        return server_args


def _allocator_kind(backend, extra_config) -> str:
    """SGLang 0.5.23 pool_host/common.get_allocator_type, from the launch arguments (nothing is published yet)."""
    if backend == "dynamic" and extra_config:
        try:
            import json

            if json.loads(extra_config).get("allocator") == "shm":
                return "shm"
        except Exception:
            pass
    return backend or "default"


def _hip_owned() -> bool:
    # hipHostMalloc host pools (ROCm, HSA_USERPTR_FOR_PAGED_MEM=0) never reach alloc_mmap; SGLang ignores the size.
    try:
        from sglang.srt.mem_cache.pool_host import common

        return bool(common._is_hip) and os.environ.get("HSA_USERPTR_FOR_PAGED_MEM") == "0"
    except Exception:
        return False


def _why_not_hugepage_backed(kind: str) -> str:
    if kind in OWN_ALLOCATORS:
        return (f"--hicache-storage-backend {kind} allocates the host KV pool with its own allocator, which ignores "
                "SGLANG_HUGEPAGE_SIZE (SGLang 0.5.23 uses hugepages only for its default allocator)")
    if _hip_owned():
        return "with HSA_USERPTR_FOR_PAGED_MEM=0 SGLang allocates host pools with hipHostMalloc, which ignores it"
    return ""


def plan_launch(server_args) -> dict | None:
    """Launcher-side check; returns (and attaches) the plan the ranks use, or None when hugepages are not in play."""
    cfg = _view(server_args)
    if not _field(cfg, "enable_hierarchical_cache", False):
        return None
    page = selected_page_bytes()
    if page is None:
        return None
    label = hp.size_label(page)
    why = _why_not_hugepage_backed(_allocator_kind(_field(cfg, "hicache_storage_backend"),
                                                   _field(cfg, "hicache_storage_backend_extra_config")))
    if why:
        if fallback_allowed():
            _warn_once("launch-allocator", "sglang-glm-ext: SGLANG_HUGEPAGE_SIZE=%s has no effect: %s", label, why)
            return None
        raise hp.HugepageConfigError(
            f"sglang-glm-ext: SGLANG_HUGEPAGE_SIZE asks for {label} hugepages, but {why}; the host KV pool would "
            f"come from ordinary pages. Unset SGLANG_HUGEPAGE_SIZE, or drop the storage backend's allocator. "
            f"{_fallback_hint()}.")
    root = SYSFS_ROOT
    # The launcher maps nothing itself and its children get their own NUMA binding: judge the node as a whole.
    cap = hp.capacity(root, page, policy=hp.MemPolicy("launcher", None, None, None))
    ranks = hp.ranks_on_node(_int(cfg, "tp_size"), _int(cfg, "pp_size"), _int(cfg, "dp_size"), _int(cfg, "nnodes"))
    symmetric = _int(cfg, "pp_size") == 1
    hicache_size = _field(cfg, "hicache_size", 0) or 0
    if cap.limit_kind == "missing" or (hicache_size > 0 and symmetric):
        per_rank = hp.launch_need_pages(hicache_size, page) if hicache_size > 0 else 1
        sf = hp.check(int(hicache_size * 1e9), cap, ranks=ranks, per_rank_pages=per_rank)
        if sf is not None:
            msg = hp.shortfall_message(
                sf, what=(f"the HiCache host pools (--hicache-size {hicache_size} GB per rank, at least)"
                          if hicache_size > 0 else "the HiCache host pools"),
                default_page_bytes=hp.default_page_bytes(root), other_sizes=hp.free_by_size(root),
                lower_hint=_lower_hint(cfg, _share(cap.usable_pages, ranks), page, ranks),
                fallback_env=HUGEPAGE_FALLBACK.name)
            if fallback_allowed():
                _warn_once("launch-capacity", "%s", msg)
                return None
            raise hp.HugepageCapacityError(msg)
    if cap.unknown:
        _warn_once("launch-unknown", "sglang-glm-ext: hugepage capacity partly unknown: %s", "; ".join(cap.unknown))
    plan = hp.LaunchPlan(page, ranks, cap.usable_pages, symmetric).to_dict()
    setattr(server_args, LAUNCH_PLAN_ATTR, plan)
    return plan


def _share(usable_pages: int | None, ranks: int) -> int | None:
    """Whole pages per rank of `usable_pages` shared by `ranks` equal ranks."""
    return None if usable_pages is None else usable_pages // max(ranks, 1)


def _field(cfg, name: str, default=None):
    try:
        return getattr(cfg, name, default)
    except Exception:  # a resolving view that cannot resolve this field here
        return default


def _int(cfg, name: str) -> int:
    try:
        return int(_field(cfg, name, 1) or 1)
    except (TypeError, ValueError):
        return 1


def _lower_hint(cfg, per_rank_pages: int | None, page: int, ranks: int) -> str:
    """`per_rank_pages`: what one rank's host pools may take in all (None: unknown)."""
    size = _field(cfg, "hicache_size", 0) if cfg is not None else 0
    now = f" (now {size} GB per rank)" if size else ""
    if per_rank_pages is None:
        return f"lower --hicache-size{now} / --hicache-ratio"
    nbytes, gb = hp.per_rank_budget(per_rank_pages, page, 1)
    whose = f"each of the {ranks} ranks on this node" if ranks > 1 else "this rank"
    return (f"lower --hicache-size{now} or --hicache-ratio so the host pools of {whose} take at most "
            f"{hp.gib(nbytes)} in all (--hicache-size {gb} at most)")


def hook_check_server_args(result, server_args, *args, **kwargs):
    """AFTER ServerArgs.check_server_args (Engine._launch_subprocesses, in the launcher before any rank exists).

    SGLang lets an exception from here escape `launch_server` / `sglang serve` as a traceback. A command-line
    launch (prepare_server_args recorded `_launch_command` on the record) gets the message alone instead, as
    SystemExit (printed to stderr, exit status 1), like the plugin's flag errors; `Engine(...)` callers keep the
    exception (HugepageConfigError is a ValueError)."""
    try:
        plan_launch(server_args)
    except hp.HugepageError as exc:
        if getattr(server_args, "_launch_command", None) is not None:
            raise SystemExit(str(exc)) from None
        raise
    return result


# ---- ranks (scheduler processes) ----

def _server_args():
    try:
        from sglang.srt.runtime_context import get_server_args

        return get_server_args()
    except Exception:
        return None


def _launch_plan(page: int) -> hp.LaunchPlan | None:
    plan = hp.LaunchPlan.from_dict(getattr(_server_args(), LAUNCH_PLAN_ATTR, None) or {})
    return plan if plan is not None and plan.page_bytes == page else None


def _ranks_on_node(plan: hp.LaunchPlan | None) -> int:
    if plan is not None:
        return plan.ranks_on_node
    try:
        from sglang.srt.mem_cache.pool_host.base import ranks_per_host

        return max(int(ranks_per_host()), 1)
    except Exception:
        return 1


def rank_check(need_bytes: int, page: int, *, what: str, pages: int | None = None) -> hp.Capacity:
    """Raise HugepageCapacityError unless `need_bytes` fits now, and the node's ranks together fit the launch's pages.

    The first compares only this rank's own need with what is usable now: pages other ranks already took are
    gone from both sides, so it never refuses a later rank of a node that fits. The second compares
    ranks x (what this process holds + this need) with what was usable at launch, before any rank mapped a
    page: it refuses every rank of a node that cannot fit, at its first pool, before anyone's allocation
    fails halfway. It is an error only when the ranks are symmetric (no pipeline stages); else a warning.
    """
    root = SYSFS_ROOT
    pages = hp.pages_for(need_bytes, page) if pages is None else pages
    cap = hp.capacity(root, page)
    with _lock:
        _last_check[page] = cap
        held = _live_pages.get(page, 0)
    plan = _launch_plan(page)
    ranks = _ranks_on_node(plan)
    sa = _server_args()
    cfg = _view(sa) if sa is not None else None
    sf = hp.check(need_bytes, cap, per_rank_pages=pages)
    if sf is None and plan is not None and plan.usable_pages is not None and ranks > 1:
        launch_cap = hp.Capacity(page, cap.pool, hp.MemPolicy("launch", None, None, None), cap.cgroup,
                                 plan.usable_pages, f"the {hp.size_label(page)} pages usable at launch", "pool")
        node_sf = hp.check((held * page) + need_bytes, launch_cap, ranks=ranks, per_rank_pages=held + pages,
                           baseline="at launch")
        if node_sf is not None:
            if plan.symmetric:
                sf, cap = node_sf, launch_cap
            else:
                _warn_once("node-asym", "sglang-glm-ext: %d ranks x %d %s pages this rank holds or maps exceed the "
                           "%d pages usable at launch; pipeline stages differ in size, so this is only a warning",
                           ranks, held + pages, hp.size_label(page), plan.usable_pages)
    if sf is not None:
        # What one rank may take: its share of the launch figure when there is one, else what it can map now.
        if plan is not None and plan.usable_pages is not None:
            per_rank = _share(plan.usable_pages, ranks)
        else:
            per_rank = None if cap.usable_pages is None else cap.usable_pages + held
        raise hp.HugepageCapacityError(hp.shortfall_message(
            sf, what=what, default_page_bytes=hp.default_page_bytes(root), other_sizes=hp.free_by_size(root),
            lower_hint=_lower_hint(cfg, per_rank, page, ranks), fallback_env=HUGEPAGE_FALLBACK.name))
    if cap.usable_pages is None:
        _warn_once(f"unknown-{page}", "sglang-glm-ext: cannot read the %s hugepage pool (%s); the capacity check is "
                   "skipped and a failing mmap will still stop the launch", hp.size_label(page), "; ".join(cap.unknown))
    return cap


def _pool_page_bytes() -> int | None:
    """Page bytes when this process's HiCache host pools are hugepage-backed; None when SGLang's RAM check applies."""
    page = selected_page_bytes()
    if page is None:
        return None
    try:
        from sglang.srt.mem_cache.pool_host.common import get_allocator_type

        kind = get_allocator_type()
    except Exception:  # no published config (a bare pool): SGLang's default allocator
        kind = "default"
    if _why_not_hugepage_backed(kind):
        return None
    return page


def hook_host_memory_budget_bytes(original, *args, **kwargs):
    """SGLang's host-RAM budget, except that a hugepage-backed pool is judged by hugepages (AROUND hook).

    MemAvailable excludes reserved hugepages, so SGLang would refuse a correctly reserved node. For a hugepage
    pool this returns what the hugepages allow (after refusing a shortfall with the actionable message); for
    anything else, or when the pool would fall back to ordinary pages anyway, SGLang's own answer.
    """
    page = _pool_page_bytes()
    if page is None:
        return original(*args, **kwargs)
    requested = args[0] if args else kwargs.get("requested_bytes", 0)
    if requested and requested > 0:
        try:
            cap = rank_check(int(requested), page, what=f"a HiCache host pool of {hp.gib(int(requested))}")
        except hp.HugepageCapacityError as exc:
            if fallback_allowed():
                logger.warning("%s\nFalling back to ordinary pages: SGLang's RAM check applies.", exc)
                return original(*args, **kwargs)
            raise
        return int(requested) if cap.usable_bytes is None else max(cap.usable_bytes, int(requested))
    # A budget query (auto-sizing, pools sized from the budget): this rank's share, as SGLang shares RAM. The
    # launch figure is taken before any rank mapped a page, so the share does not shrink as siblings allocate.
    plan = _launch_plan(page)
    cap = hp.capacity(SYSFS_ROOT, page)
    if plan is not None and plan.usable_pages is not None:
        cap = hp.Capacity(page, cap.pool, cap.policy, cap.cgroup, plan.usable_pages,
                          f"the {hp.size_label(page)} pages usable at launch", "pool")
    if cap.usable_pages is None:
        return original(*args, **kwargs)
    ranks = _ranks_on_node(plan)
    share = _share(cap.usable_pages, ranks)
    if share == 0:  # else SGLang's auto-sizing would blame "the 10 GiB reserve" of RAM
        sf = hp.check(page, cap, ranks=ranks, per_rank_pages=1)
        raise hp.HugepageCapacityError(hp.shortfall_message(
            sf, what="auto-sized HiCache host pools", default_page_bytes=hp.default_page_bytes(SYSFS_ROOT),
            other_sizes=hp.free_by_size(SYSFS_ROOT), lower_hint="unset SGLANG_HUGEPAGE_SIZE",
            fallback_env=HUGEPAGE_FALLBACK.name))
    return share * page


def hook_alloc_mmap(original, dims, dtype, *args, **kwargs):
    """Check this buffer's pages right before SGLang maps it; unknown sizes and a missing libc are errors."""
    page = selected_page_bytes()
    if page is None:
        return original(dims, dtype, *args, **kwargs)
    from sglang.srt.mem_cache.storage.mmap import mmap_allocator

    if mmap_allocator._libc is None:
        if fallback_allowed():
            return original(dims, dtype, *args, **kwargs)
        raise hp.HugepageAllocError(
            f"sglang-glm-ext: SGLANG_HUGEPAGE_SIZE={_raw_size()} needs libc's mmap, but libc could not be loaded; "
            f"SGLang would allocate the host pool from ordinary pages. {_fallback_hint()}.")
    n_bytes = _nbytes(dims, dtype)
    if n_bytes > 0:
        try:
            rank_check(n_bytes, page, what=f"a host buffer of {hp.gib(n_bytes)}")
        except hp.HugepageCapacityError as exc:
            if fallback_allowed():
                logger.warning("%s\nSGLang will try the mapping and fall back to ordinary pages.", exc)
            else:
                raise
    return original(dims, dtype, *args, **kwargs)


def _nbytes(dims, dtype) -> int:
    import torch

    return math.prod(dims) * torch.empty([], dtype=dtype).element_size()


def _page_of_flags(extra_flags: int, alloc_bytes: int) -> int:
    shift = (int(extra_flags) >> 26) & 0x3F  # MAP_HUGE_SHIFT: log2 of the page size
    return 1 << shift if shift else (selected_page_bytes() or alloc_bytes or 1)


def hook_alloc_hugepage(original, n_bytes, alloc_bytes, extra_flags, *args, **kwargs):
    """The MAP_HUGETLB mapping: an OSError or a mapping without all its pages is an error, not a fallback."""
    page = _page_of_flags(extra_flags, alloc_bytes)
    try:
        array = original(n_bytes, alloc_bytes, extra_flags, *args, **kwargs)
    except OSError as exc:
        if fallback_allowed():
            raise  # SGLang logs it and maps ordinary pages
        raise hp.HugepageAllocError(_alloc_failure(exc, alloc_bytes, page)) from None
    err = _unpopulated(array, alloc_bytes)
    if err is not None:
        del array  # the array's finalizer unmaps it now
        if fallback_allowed():
            raise OSError(err[0], err[1])
        raise hp.HugepageAllocError(_alloc_failure(OSError(*err), alloc_bytes, page, populate=True))
    pages = hp.pages_for(alloc_bytes, page)
    with _lock:
        _live_pages[page] = _live_pages.get(page, 0) + pages
    weakref.finalize(array, _release, page, pages)
    return array


def _release(page: int, pages: int) -> None:
    with _lock:
        _live_pages[page] = max(_live_pages.get(page, 0) - pages, 0)


def _unpopulated(array, alloc_bytes: int) -> tuple[int, str] | None:
    """(errno, text) when the mapping's pages are not all there; None when they are or the kernel cannot tell.

    MAP_POPULATE ignores a page that fails to fault in (a NUMA node or hugetlb cgroup out of pages), and the
    first touch would then be a SIGBUS mid-serving. MADV_POPULATE_WRITE (Linux 5.14+) reports it as an error.
    """
    from sglang.srt.mem_cache.storage.mmap import mmap_allocator as ma

    if ma._libc is None or not ma._has_madv_populate_write():
        return None
    if ma._libc.madvise(ctypes.addressof(array), alloc_bytes, ma._MADV_POPULATE_WRITE) == 0:
        return None
    errno = ctypes.get_errno()
    return errno, f"madvise(MADV_POPULATE_WRITE): {os.strerror(errno)}"


def _alloc_failure(exc: OSError, alloc_bytes: int, page: int, *, populate: bool = False) -> str:
    root = SYSFS_ROOT
    pages = hp.pages_for(alloc_bytes, page)
    label = hp.size_label(page)
    with _lock:
        before = _last_check.get(page)
    now = hp.capacity(root, page)
    step = "did not get all its pages" if populate else "failed"
    lines = [f"sglang-glm-ext: the {label} hugepage mapping of {hp.gib(alloc_bytes)} ({pages} pages) for a host "
             f"buffer {step}: {exc}. SGLang 0.5.23 would silently allocate it from ordinary pages instead."]
    if before is not None and before.usable_pages is not None:
        lines.append(f"The capacity check right before saw {before.usable_pages} usable pages "
                     f"(limited by {before.limited_by}); now {now.usable_pages} (limited by {now.limited_by}). "
                     "Pages taken in between by another rank of this launch or another process, a NUMA binding or "
                     "a hugetlb cgroup limit can cause this.")
    sf = hp.Shortfall(alloc_bytes, pages, now) if now.usable_pages is not None and now.usable_pages < pages else None
    if sf is not None:
        lines.append(hp.shortfall_message(sf, what="this buffer", default_page_bytes=hp.default_page_bytes(root),
                                          lower_hint="lower --hicache-size / --hicache-ratio",
                                          other_sizes=hp.free_by_size(root)).split("\n", 1)[1])
    else:
        lines.append("Reserve more pages or lower --hicache-size / --hicache-ratio; `sglang-glm-ext doctor` shows the "
                     "pools per size and NUMA node.")
    lines.append(f"{_fallback_hint()}.")
    return "\n".join(lines)


def _reset_for_tests() -> None:
    with _lock:
        _live_pages.clear()
        _last_check.clear()
    _warned.clear()
