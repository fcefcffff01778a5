"""Host dedup (``host_dedup``) under faults, on gloo processes with SGLang's real HiCache stack (``dedup_ranks.py``).

DEMO/TEST-ONLY. ``python -m sglang_glm_ext.l3.demo.dedup_faults PLAN RANK``: the plan of ``dedup_ranks.py`` with
``plan["scenario"]`` one of

* ``stall``: the source's slab reads block (a gate on ``os.preadv`` for the slots of the pages named, in the source
  process only) while every rank prefetches. Under SGLang's ``wait_complete`` every rank waits the stall out and
  loads every page; under its ``timeout`` policy (SGLang's default) every rank ends the prefetch at the same page
  count (a miss, or with 2-page storage batches the prefix read before the stall) at the policy's deadline, loads
  that prefix back byte-exact while the read is still blocked, a second request's prefetch behind the stalled one is
  a miss too (SGLang's one prefetch I/O thread), and once the read returns the next prefetch loads every page.
* ``stall_past_pg_timeout``: the stack's process groups get ``pg_timeout_s`` (SGLang's prefetch MIN groups pass no
  timeout: torch's 30 min), the source's read stalls ``stall_s`` past it; then the next prefetch: what is left
  (SGLang's prefetch sync thread, the host slots of that prefetch).
* ``crash_write``: write-through to L3 with ``ack = "durable"`` and a flush; the rank saves the device bytes, writes
  its result and waits to be killed (the test SIGKILLs every rank: no close, no flush, no atexit).
* ``crash_load``: a second run on the same L3 directory with ``cold_start = "load"``: every rank prefetches the
  tokens of ``crash_write`` (the source reads, the peers get the broadcast) and compares its device KV with the
  bytes saved before the kill.
* ``full_disk``: every write of the source's slabs fails with ENOSPC (``DiskSlab.inject_write_fault``), then every
  write after the first ``k``, then none: counted in the store's ``write_errors``, a miss, a prefix, then every page,
  byte-exact on every rank, no process crashes.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
import time

from .cp_rank_kit import PS, drop_l2, flush_all, page_keys, tokens
from .dedup_ranks import RUN_ATTR, _l3_read_bytes, _same, _stack

# SGLang 0.5.23's defaults (hybrid_cache_controller.py parse_storage_backend_extra_config), written out
TIMEOUTS = {"prefetch_timeout_base": 1.0, "prefetch_timeout_per_ki_token": 0.25}
_CC = "sglang.srt.managers.cache_controller"  # STORAGE_BATCH_SIZE: pages per storage call and completion ack


# ---------------------------------------------------------------------------------------------- shared steps
def _write(st, group, t, seed):
    """Insert ``t`` with random KV, write it through to L3 and flush every store: the device bytes."""
    slots = st.insert(t)
    st.fill_device(slots, seed)
    want = st.snapshot_device(slots)
    st.write_back_storage(t)
    flush_all(st, group)  # a source's own store and the other writers' it writes for; a peer none
    return want


def _exact(st, t, n, want) -> bool:
    """The first ``n`` tokens of ``t`` loaded back to the device hold ``want``'s bytes (nothing to check at 0)."""
    if not n:
        return True
    got = st.snapshot_device(st.load_back(t[:n]))
    return _same(got, [w[:n] if w.shape[0] == len(t) else w[: n // PS] for w in want])


def _durable(st, t) -> dict | None:
    """The source's leading durable pages of ``t`` per pool (None on a peer: it has no store)."""
    from ..hicache.keys import pool_keys, storage_keys

    be = st.backend
    if be.store is None:
        return None
    keys = storage_keys(page_keys(t))
    return {name: be.store.exists(rec.kind, pool_keys(keys, rec.tag), include_staged=False)
            for name, rec in be.plan.pools.items()}


def _stores(be) -> tuple:
    """Every store this rank writes: a host-dedup source's own and the other writers' (``L3HiCacheStorage.stores``);
    a peer none."""
    return tuple(be.stores)


def _counters(st) -> dict:
    run = getattr(st.controller, RUN_ATTR, None)
    return {} if run is None else dict(run.counters)


def _prefetch(st, group, t, want, out, tag, *, load=True):
    """Every rank prefetches ``t`` from L3 (L1 and L2 dropped first): pages loaded, seconds, bytes read here."""
    import torch.distributed as dist

    drop_l2(st, t)
    dist.barrier(group=group)
    l3_0, t0 = _l3_read_bytes(st), time.monotonic()
    n = out[f"loaded_{tag}"] = st.prefetch(t, tag)
    out[f"s_{tag}"] = time.monotonic() - t0
    out[f"l3_read_bytes_{tag}"] = _l3_read_bytes(st) - l3_0
    if load:
        out[f"exact_{tag}"] = _exact(st, t, n, want)
    return n


# ---------------------------------------------------------------------------------------------- stall
class ReadStall:
    """The source's slab reads block: ``os.preadv`` on a KV slab file, for a byte range that touches the slot of an
    armed page there, waits until :meth:`release` or until ``hold_s`` after :meth:`arm` (one stall for every read it
    holds). Counts the reads it held (``hits``), those held now (``held_now``) and the longest hold. Installed in one
    process (the source's) only; each page's slab is the one the shared index names (any writer's store)."""

    def __init__(self, st):
        self.be, self.kind = st.backend, st.backend.plan.kv.kind
        self.real = os.preadv
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.slots: dict[str, tuple[int, set]] = {}  # slab file -> (slot bytes, armed slots)
        self.until = 0.0
        self.hits = self.held_now = 0
        self.longest_s = 0.0
        os.preadv = self

    def arm(self, t, first_page: int, hold_s: float) -> None:
        from ..hicache.keys import storage_key

        stores = {store.rank: store for store in _stores(self.be)}
        slots: dict[str, tuple[int, set]] = {}
        for k in page_keys(t)[first_page:]:
            rank, disk, slot = self.be.store.locate(self.kind, storage_key(k))
            slab = stores[rank].slab(self.kind, disk=disk)
            slots.setdefault(os.path.realpath(slab.path), (slab.slot_bytes, set()))[1].add(slot)
        with self.lock:
            self.gate.clear()
            self.slots, self.until = slots, time.monotonic() + hold_s

    def release(self) -> None:
        with self.lock:
            self.slots = {}
            self.gate.set()

    def __call__(self, fd, buffers, offset, *rest):
        if self.slots and self._gated(fd, buffers, offset):
            t0 = time.monotonic()
            with self.lock:
                self.hits += 1
                self.held_now += 1
            self.gate.wait(max(0.0, self.until - t0))
            with self.lock:
                self.held_now -= 1
                self.longest_s = max(self.longest_s, time.monotonic() - t0)
        return self.real(fd, buffers, offset, *rest)

    def _gated(self, fd, buffers, offset) -> bool:
        try:
            size, slots = self.slots.get(os.path.realpath(os.readlink(f"/proc/self/fd/{fd}")), (0, ()))
        except OSError:
            return False
        end = offset + sum(memoryview(b).nbytes for b in buffers)
        return any(offset < (s + 1) * size and s * size < end for s in slots)

    def uninstall(self) -> None:
        self.release()
        os.preadv = self.real


def _policy(st, policy: str, batch: int) -> None:
    st.cache.prefetch_stop_policy = policy  # what SGLang's _apply_policies sets (storage_attachment.py)
    sys.modules[_CC].STORAGE_BATCH_SIZE = batch  # the same on every rank (the completion acks are counted per batch)


def _stalled(st, group, gate, t, want, out, tag, *, first_page=0, hold_s=30.0, then_release=True):
    """A prefetch of ``t`` while the source's reads of pages ``first_page``... are held; its load-back happens while
    they still are; records what the gate saw on the source."""
    import torch.distributed as dist

    if gate is not None:
        gate.arm(t, first_page, hold_s)
    _prefetch(st, group, t, want, out, tag)
    if gate is not None:
        out[f"gate_hits_{tag}"] = gate.hits
        out[f"gate_held_after_{tag}"] = gate.held_now  # still blocked once the prefetch and its load-back ended
        if then_release:
            gate.release()
    dist.barrier(group=group)


def scenario_stall(plan, rank, group, out):
    import torch.distributed as dist

    cc = sys.modules.get(_CC) or __import__(_CC, fromlist=["STORAGE_BATCH_SIZE"])
    batch0 = cc.STORAGE_BATCH_SIZE
    st = _stack(plan, rank, group, extra=TIMEOUTS)
    gate = None
    try:
        pages = plan.get("pages", 8)
        t, other = tokens(1, pages), tokens(100_000, pages)
        want, want_other = _write(st, group, t, 1), _write(st, group, other, 2)
        gate = ReadStall(st) if st.backend.store is not None else None
        out["role"] = "peer" if gate is None else "source"
        out["timeout_s"] = st.cache.prefetch_timeout_base + pages * st.cache.prefetch_timeout_per_page
        # wait_complete: every rank waits the stall out, then loads every page
        _policy(st, "wait_complete", batch0)
        _stalled(st, group, gate, t, want, out, "wait", hold_s=plan.get("short_stall_s", 2.0))
        # timeout (SGLang's default policy), SGLang's storage batch (128 pages: one read, one ack): a miss
        _policy(st, "timeout", batch0)
        _stalled(st, group, gate, t, want, out, "miss", then_release=False)
        # ... and another request's prefetch behind the stalled read (not gated itself): a miss as well
        _prefetch(st, group, other, want_other, out, "behind")
        out["gate_held_after_behind"] = None if gate is None else gate.held_now
        if gate is not None:
            gate.release()
        dist.barrier(group=group)
        _prefetch(st, group, t, want, out, "after_miss")
        # timeout with 2-page storage batches, pages 4... held: the prefix read before the stall, on every rank
        _policy(st, "timeout", 2)
        _stalled(st, group, gate, t, want, out, "prefix", first_page=plan.get("stall_page", 4))
        _prefetch(st, group, t, want, out, "after_prefix")
        out["gate_longest_s"] = None if gate is None else gate.longest_s
        out["counters"] = _counters(st)
        dist.barrier(group=group)
    finally:
        cc.STORAGE_BATCH_SIZE = batch0
        if gate is not None:
            gate.uninstall()
        st.close()


def _short_pg_timeout(plan, rank, group):
    """The stack with every process group it creates (SGLang's prefetch hit / completion MIN groups,
    ``cache_controller.py:404-429``, which pass no timeout: torch's gloo default, 30 min) on ``pg_timeout_s``."""
    import datetime

    import torch.distributed.distributed_c10d as c10d

    real = c10d._get_default_timeout
    c10d._get_default_timeout = lambda backend: datetime.timedelta(seconds=plan["pg_timeout_s"])
    try:
        return _stack(plan, rank, group, extra=TIMEOUTS)
    finally:
        c10d._get_default_timeout = real


def scenario_stall_past_pg_timeout(plan, rank, group, out):
    """The source's read stalls longer than the prefetch completion group's timeout: what the ranks are left with.
    The stack is not closed (its groups are broken): the rank's result is written and the process exits."""
    import torch.distributed as dist

    died: list[str] = []
    threading.excepthook = lambda a: died.append(f"{a.thread.name}: {a.exc_type.__name__}: {a.exc_value}"[:300])
    st = _short_pg_timeout(plan, rank, group)
    pages, hold = plan.get("pages", 8), plan["stall_s"]
    t = tokens(1, pages)
    want = _write(st, group, t, 1)
    gate = ReadStall(st) if st.backend.store is not None else None
    cc = st.controller
    _policy(st, "timeout", sys.modules[_CC].STORAGE_BATCH_SIZE)
    t0 = time.monotonic()
    _stalled(st, group, gate, t, want, out, "stalled", hold_s=hold, then_release=False)
    time.sleep(max(0.0, t0 + hold + plan["pg_timeout_s"] + 1.0 - time.monotonic()))  # the read returned by now
    dist.barrier(group=group)
    out["gate_held_after_stall"] = None if gate is None else gate.held_now
    out["sync_thread_alive"] = cc.prefetch_sync_thread.is_alive()
    free0 = cc.mem_pool_host.available_size()
    _prefetch(st, group, t, want, out, "next")
    out["host_slots_lost_next"] = free0 - cc.mem_pool_host.available_size()
    out["thread_errors"] = died
    dist.barrier(group=group)


# ---------------------------------------------------------------------------------------------- crash
def _publish(plan, rank, out) -> None:
    """This rank's result on disk atomically while the process goes on (``write_result`` exits)."""
    path = os.path.join(plan["out"], f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)


def scenario_crash_write(plan, rank, group, out):
    """Durable writes, then wait for the test's SIGKILL with the store open (never closed, never flushed again)."""
    import torch
    import torch.distributed as dist

    st = _stack(plan, rank, group)
    t = tokens(1, plan.get("pages", 8))
    want = _write(st, group, t, 7)
    torch.save(want, os.path.join(plan["out"], f"want{rank}.pt"))
    out["durable"] = _durable(st, t)
    stores = _stores(st.backend)
    out["stores"] = len(stores)
    out["acked_not_durable_pages"] = sum(x.stats()["acked_not_durable_pages"] for x in stores) if stores else None
    out["pid"] = os.getpid()
    dist.barrier(group=group)
    _publish(plan, rank, out)
    time.sleep(plan.get("linger_s", 120.0))  # the test kills it first; were it not killed, exit 3 fails the test
    os._exit(3)


def scenario_crash_load(plan, rank, group, out):
    import torch
    import torch.distributed as dist

    st = _stack(plan, rank, group)
    try:
        stats = [x.stats() for x in _stores(st.backend)]
        if stats:  # every store the source opened (its own, the other writers' it writes for) kept its pages
            out["cold_start"] = sorted({s["cold_start"] for s in stats})
            out["cold_start_loaded_pages"] = sum(s["cold_start_loaded_pages"] for s in stats)
        t = tokens(1, plan.get("pages", 8))
        out["durable"] = _durable(st, t)
        want = torch.load(os.path.join(plan["crashed_out"], f"want{rank}.pt"))
        _prefetch(st, group, t, want, out, "reload")
        out["counters"] = _counters(st)
        dist.barrier(group=group)
    finally:
        st.close()


# ---------------------------------------------------------------------------------------------- full disk
def _fault(st, pwrite) -> None:
    """Every slab of every store the source writes (the disk they share is full) writes through a ``pwrite()`` of its
    own (its own count of writes left; None: the real one again)."""
    be = st.backend
    for store in _stores(be):
        for rec in be.plan.pools.values():
            store.slab(rec.kind).inject_write_fault(None if pwrite is None else pwrite())


_COUNTS = ("write_errors", "spilled", "spill_accepted", "dropped_pool_full", "dropped_staging")


def _store_counts(st) -> dict | None:
    """The store counters of a full disk, summed over the stores the source writes (None on a peer)."""
    stats = [x.stats() for x in _stores(st.backend)]
    if not stats:
        return None
    out = {k: sum(s[k] for s in stats) for k in _COUNTS}
    out["disk_write_errors"] = sum(row["write_errors"] for s in stats for row in s["per_disk"].values())
    out["write_path_failing"] = sorted({p for s in stats for p in s["write_path_failing"]})
    return out


def _full_disk_round(st, group, t, seed, out, tag, pwrite):
    import torch.distributed as dist

    _fault(st, pwrite)
    want = _write(st, group, t, seed)
    _fault(st, None)
    dist.barrier(group=group)
    out[f"durable_{tag}"] = _durable(st, t)
    out[f"store_{tag}"] = _store_counts(st)
    _prefetch(st, group, t, want, out, tag)


def scenario_full_disk(plan, rank, group, out):
    import torch.distributed as dist

    from ..disk.slab import fail_write

    st = _stack(plan, rank, group)
    try:
        pages, k = plan.get("pages", 8), plan.get("written_before_full", 3)
        out["store_start"] = _store_counts(st)
        _full_disk_round(st, group, tokens(1, pages), 1, out, "full", lambda: fail_write(errno.ENOSPC))
        _full_disk_round(st, group, tokens(100_000, pages), 2, out, "fills", lambda: fail_write(errno.ENOSPC, after=k))
        _full_disk_round(st, group, tokens(200_000, pages), 3, out, "freed", None)
        out["counters"] = _counters(st)
        dist.barrier(group=group)
    finally:
        st.close()


SCENARIOS = {"stall": scenario_stall, "stall_past_pg_timeout": scenario_stall_past_pg_timeout,
             "crash_write": scenario_crash_write, "crash_load": scenario_crash_load, "full_disk": scenario_full_disk}


if __name__ == "__main__":
    from .dedup_ranks import main

    main(sys.argv[1:], SCENARIOS)
