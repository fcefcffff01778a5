#!/usr/bin/env python3
"""L3 through SGLang's own HiCache controller vs SGLang's HiCacheFile vs raw O_DIRECT vs the L3 engine alone.

One run, one disk, the same pages (GLM-5 KV: 64 tokens x 78 layers x 656 B = 3,274,752 B per page by default),
``--size-gb`` (>= 2 for the record) per side and round, median of ``--repeats`` (>= 3) rounds, the sides' order
rotated every round (a virtual disk's speed drifts; rotation biases no side):

* ``raw``: O_DIRECT writes of the same slot-sized transfers (the page copied into an aligned buffer, as the store
  copies it into staging) on as many threads as the store's I/O pool, one fdatasync at the end; O_DIRECT reads
  back on as many threads, each slot read straight into the host page (one vectored read: the page's own bytes,
  then a small tail buffer for pad and header), as the store reads. Where O_DIRECT cannot land in the host page
  (its address or length does not fit the alignment the file system reports), each slot is read into an aligned
  buffer and copied, and the output says why (``raw_read_mode``).
* ``ours (controller)``: SGLang's ``HybridCacheController._page_backup`` (what the backup thread runs: 128-page
  batches, ``page_set_func``) with the L3 backend's zero-copy ``batch_set_v1``, then ``flush`` (fdatasync'ed and
  committed = durable); then ``_page_transfer`` (what the prefetch I/O thread runs, ``batch_get_v1``) into the
  emptied host pool. O_DIRECT both ways, so the reads never come from the page cache.
* ``engine``: the same pages straight through ``L3Store.spill_from_layout`` / ``reload_into_layout`` with the
  backend's own plan (what the backend calls), same store.
* ``HiCacheFile``: SGLang's file backend on the same controller path (the controller gives it the generic
  ``batch_set`` / ``batch_get`` calls: SGLang enables v1 only for its listed backends and ``dynamic``); write, then
  ``os.sync()`` (HiCacheFile never fsyncs: counted so both sides mean durable); reads after
  ``posix_fadvise(DONTNEED)`` of every file it wrote.

* ``ours (durable)``: the same controller path with ``ack = "durable"`` (issue 20, item 7): SGLang's batch_set is
  answered only once its pages are fdatasync'ed and committed, so the backup thread waits per call instead of
  staging the next batch; ``ours`` is the default ``ack = "write_behind"``. Their write GB/s side by side is the
  price of the durable acknowledgement.

Writes that the bounded L3 staging refuses are retried (the old drop; the backend now waits for room itself,
``queues.wait_ms``), counted and reported. Bytes read back are checked against what was written, for every side.

``--burst`` (issue 20, item 8) instead hands a burst of write-back operations to SGLang's real backup thread at once
(``write_storage``; nothing retries a False: SGLang logs "Write page to storage: N pages failed" and drops the rest of
that operation) with a small L3 staging (``--burst-staging-mb``), once with brief backpressure (the default
``queues.wait_ms``) and once with the old drop (``wait_ms = 0``), alternated: the pages the burst leaves in L3 (the
hit rate a later prefetch could get), the write-back throughput (durable bytes over the time from the first submit
to all durable), SGLang's warning lines and the counted drops.

Without SGLang (the GPU node's image: torch, no SGLang, no lmdb unless brought along) it runs ``engine`` vs ``raw``
only, labelled so: the L3 engine's own pages (``spill`` / ``reload_into``), not the controller path.

Run: PYTHONPATH=. TORCH_EXTENSIONS_DIR=.torch_extensions python benchmark/l3_controller_bench.py --size-gb 2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

BATCH = 128  # SGLang's STORAGE_BATCH_SIZE


def _keys(n: int, tag: str) -> list[str]:
    return [hashlib.sha256(f"{tag}:{i}".encode()).hexdigest() for i in range(n)]


def _aligned(nbytes: int):
    from sglang_glm_ext.l3.disk.aligned import AlignedBuffer

    return AlignedBuffer(nbytes)


class Raw:
    """Raw O_DIRECT on the same disk, with as many threads as the store's I/O (writes) and reload (reads) pools:
    the reference both L3 paths are measured against."""

    def __init__(self, path: str, slot: int, page: int, threads: int = 4):
        self.path, self.slot, self.page, self.threads = path, slot, page, threads
        self.bufs = [_aligned(slot) for _ in range(threads)]
        self.arrs = [np.frombuffer(b.view, np.uint8) for b in self.bufs]
        self.tail_bufs: list = []  # pad + header of a slot read straight into a host page
        self.tails: list = []
        self.read_mode = "not run"

    def _each(self, n: int, fn) -> None:
        """fn(thread, i) for i = t, t + T, ... on T threads: sequential offsets interleaved across threads."""
        errs = []

        def worker(t):
            try:
                for i in range(t, n, self.threads):
                    fn(t, i)
            except BaseException as e:  # noqa: BLE001 - surfaced in the caller
                errs.append(e)

        ths = [threading.Thread(target=worker, args=(t,)) for t in range(self.threads)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        if errs:
            raise errs[0]

    def write(self, n: int, src) -> float:
        """``src(i)`` is page i's bytes (a uint8 array of page bytes)."""
        if os.path.exists(self.path):
            os.unlink(self.path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
        try:
            os.posix_fallocate(fd, 0, n * self.slot)
            t0 = time.perf_counter()

            def one(t, i):
                self.arrs[t][:self.page] = src(i)  # the copy the store makes into staging
                os.pwrite(fd, self.bufs[t].view, i * self.slot)

            self._each(n, one)
            os.fdatasync(fd)
            return time.perf_counter() - t0
        finally:
            os.close(fd)

    def read(self, n: int, host) -> float:
        """Read page i into ``host(i)`` (a flat uint8 array of the page: its host page): straight in where O_DIRECT
        can land there, else through an aligned buffer and a copy; ``self.read_mode`` says which and why."""
        from sglang_glm_ext.l3.disk.dio_align import probe_dio_alignment

        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
        try:
            self.read_mode = self._direct_into(probe_dio_alignment(fd), host(0))
            direct = self.read_mode == "straight into the host page"
            t0 = time.perf_counter()

            def one(t, i):
                dst = host(i)
                if direct:
                    os.preadv(fd, [dst, self.tails[t]], i * self.slot)
                else:
                    os.preadv(fd, [self.bufs[t].view], i * self.slot)
                    np.copyto(dst, self.arrs[t][:self.page])

            self._each(n, one)
            return time.perf_counter() - t0
        finally:
            os.close(fd)

    def _direct_into(self, align, page0) -> str:
        """Can a slot's O_DIRECT read land in the host page itself (the page's bytes, then a tail for pad and
        header)? The host pages must sit at memory-aligned addresses and the page be a whole number of the file
        system's direct-I/O blocks."""
        addr, stride = page0.ctypes.data, self.page
        if addr % align.mem or stride % align.mem:
            return (f"copied from an aligned buffer: host pages at {addr % align.mem} B past the {align.mem} B "
                    f"memory alignment O_DIRECT needs here ({align.source})")
        if self.page % align.offset:
            return (f"copied from an aligned buffer: the {self.page} B page is not a whole number of {align.offset} B "
                    f"direct-I/O blocks ({align.source})")
        if not self.tail_bufs:
            self.tail_bufs = [_aligned(self.slot - self.page) for _ in range(self.threads)]
            self.tails = [b.view for b in self.tail_bufs]
        return "straight into the host page"

    def close(self):
        self.arrs, self.tails = [], []  # views export the buffers: drop them before the mappings close
        for b in self.bufs + self.tail_bufs:
            b.close()
        if os.path.exists(self.path):
            os.unlink(self.path)


def _l3_config_text(root: str, budget: int, *, ack: str | None = None, staging: str | None = None,
                    wait_ms: int | None = None) -> str:
    from sglang_glm_ext.l3.config import example_config

    text = example_config(root).replace('budget = "1GiB"', f"budget = {budget}")
    if ack is not None:
        text = text.replace('ack = "write_behind"', f'ack = "{ack}"')
    if wait_ms is not None:
        text = text.replace("wait_ms = 5000", f"wait_ms = {wait_ms}")
    if staging is not None:  # the burst: a small staging the burst overflows
        return text.replace("start = 0.90", "start = 1.0").replace("stop = 0.85", "stop = 0.99").replace(
            'staging_bytes = "256MiB"', f'staging_bytes = "{staging}"')
    # The bench measures the paths, not GC: every round starts from clear() and never reaches the GC watermark.
    text = text.replace("start = 0.90", "start = 1.0").replace("stop = 0.85", "stop = 0.99")
    text = text.replace('staging_bytes = "256MiB"', 'staging_bytes = "1GiB"').replace("max_inflight = 256",
                                                                                     "max_inflight = 4096")
    return text


def _op(op):
    """A KV-only operation as the hybrid controller takes it: the scheduler's ops carry their sidecar pool
    transfers (none here: the KV pages alone are measured)."""
    if getattr(op, "pool_transfers", None) is None:
        op.pool_transfers = None
    return op


def _med(xs):
    return statistics.median(xs)


# ---------------------------------------------------------------------------------------------- with SGLang
def _setup(args):
    """The plugin and the CPU stand-ins in this process; the stack's shape, its KV page, the page count, the work dir."""
    import sglang_glm_ext
    from sglang_glm_ext.l3.demo import cpu_standins, stack

    sglang_glm_ext.register()
    cpu_standins.install()
    spec = stack.StackSpec(layers=args.layers, device_pages=args.host_pages // 2, host_ratio=2.0,
                           layout=args.layout, io_backend="direct" if args.layout == "page_first_direct" else "kernel")
    kv_page = spec.page_size * spec.layers * spec.kv_cache_dim
    n = max(BATCH, int(args.size_gb * 1e9) // kv_page)
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir, mode=0o700)
    return spec, kv_page, n, args.dir


def run_controller(args) -> dict:
    import torch

    import sglang_glm_ext
    from sglang.srt.managers.cache_controller import PrefetchOperation, StorageOperation

    from sglang_glm_ext.l3.disk.format import slot_bytes_for
    from sglang_glm_ext.l3.hicache.keys import storage_keys
    from sglang_glm_ext.l3.demo import cpu_standins, stack

    spec, kv_page, n, work = _setup(args)
    cfg = os.path.join(work, "l3", "l3.toml")
    os.makedirs(os.path.dirname(cfg))
    # target_kv for n pages (+ margin); equal_slots gives the indexer kind the same slot count (small pages).
    with open(cfg, "w") as f:
        f.write(_l3_config_text(os.path.join(work, "l3"), (n + 8) * (slot_bytes_for(kv_page) + 700_000)))
    cfg_d = os.path.join(work, "l3d", "l3.toml")  # the same, answered only once durable (ack = "durable")
    os.makedirs(os.path.dirname(cfg_d))
    with open(cfg_d, "w") as f:
        f.write(_l3_config_text(os.path.join(work, "l3d"), (n + 8) * (slot_bytes_for(kv_page) + 700_000),
                                ack="durable"))
    file_dir = os.path.join(work, "hicache_file")
    os.makedirs(file_dir)
    os.environ.pop("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", None)

    sa = stack.publish_server_args(spec, storage_backend=None, extra_config=None,
                                   plugin_values={"enable_cp_l3": True, "cp_l3_config": cfg})
    ours = stack.DsaStack.build(spec, sa)
    sa_d = stack.publish_server_args(spec, storage_backend=None, extra_config=None,
                                     plugin_values={"enable_cp_l3": True, "cp_l3_config": cfg_d})
    ours_d = stack.DsaStack.build(spec, sa_d)
    assert ours_d.backend.config.ack == "durable" and ours.backend.config.ack == "write_behind"
    sa_f = stack.publish_server_args(spec, storage_backend="file",
                                     extra_config=json.dumps({"file_storage_path": file_dir}))
    theirs = stack.DsaStack.build(spec, sa_f)
    be, cc, fcc = ours.backend, ours.controller, theirs.controller
    assert type(be).__name__ == "L3HiCacheStorage" and type(theirs.backend).__name__ == "HiCacheFile"
    assert cc.page_set_func == cc._page_set_zero_copy and cc.page_get_func == cc._page_get_zero_copy
    store, plan, kind = be.store, be.plan.kv.plan, be.plan.kv.kind  # the attach plan (hicache/plan.py)
    assert plan.page_bytes == kv_page
    host_pages = min(args.host_pages, ours.host_pool("kv").page_num - 1, theirs.host_pool("kv").page_num - 1)
    ps = spec.page_size
    kv_host = {id(s): s.host_pool("kv") for s in (ours, theirs, ours_d)}

    def host_view(st, p):
        """Host page p's KV bytes as one flat uint8 array (page_first layouts: one contiguous block)."""
        buf = kv_host[id(st)].kv_buffer
        return buf.view(torch.uint8).reshape(kv_host[id(st)].page_num, -1)[p].numpy() if args.layout != "layer_first" \
            else None

    # Fill both host pools with the same random pages; remember them to check every side's bytes.
    rng = np.random.default_rng(0)
    ref = [rng.integers(0, 256, kv_page, dtype=np.uint8) for _ in range(host_pages)]

    def fill(st):
        for p in range(host_pages):
            host_view(st, p)[:] = ref[p]

    def zero(st):
        for p in range(host_pages):
            host_view(st, p)[:] = 0

    def check(st, chunk_len, what):
        for p in (0, chunk_len - 1):
            if not np.array_equal(host_view(st, p), ref[p]):
                raise RuntimeError(f"{what}: host page {p} differs after the read")

    def chunks(keys):
        for c in range(0, len(keys), host_pages):
            part = keys[c:c + host_pages]
            yield part, torch.arange(len(part) * ps, dtype=torch.int64)

    stats = {"retries": {"ours": 0, "engine": 0, "ours_durable": 0}}

    def ctl_write(controller, keys, side):
        for part, idx in chunks(keys):
            done = 0
            while done < len(part):
                op = _op(StorageOperation(idx[done * ps:], token_ids=[], hash_value=part[done:]))
                controller._page_backup(op)
                got = op.completed_tokens // ps
                if got == 0:
                    stats["retries"][side] += 1
                    time.sleep(0.002)  # staging full: the writer drains it at disk speed
                done += got

    def ctl_read(controller, st, keys, what):
        t = 0.0
        for part, idx in chunks(keys):
            zero(st)
            op = _op(PrefetchOperation(f"bench-{what}", token_ids=[]))
            op.host_indices, op.hash_value = idx, list(part)
            t0 = time.perf_counter()
            controller._page_transfer(op)
            t += time.perf_counter() - t0
            ack = controller.ack_prefetch_queue.get(timeout=60)  # SGLang's sync thread hands the ack on
            if ack.completed_tokens != len(part) * ps:
                raise RuntimeError(f"{what}: read {ack.completed_tokens} of {len(part) * ps} tokens")
            check(st, len(part), what)
        return t

    def side_ours(r, st_=None, side="ours"):
        st_ = st_ or ours
        keys = _keys(n, f"{side}{r}")
        st_.backend.store.clear()
        fill(st_)
        t0 = time.perf_counter()
        ctl_write(st_.controller, keys, side)
        if not st_.backend.store.flush(600):
            raise RuntimeError("flush timed out")
        w = time.perf_counter() - t0
        return w, ctl_read(st_.controller, st_, keys, side)

    def side_ours_durable(r):
        return side_ours(r, ours_d, "ours_durable")

    def side_engine(r):
        keys = storage_keys(_keys(n, f"engine{r}"))
        store.clear()
        fill(ours)
        t0 = time.perf_counter()
        for part, _ in chunks(keys):
            for b in range(0, len(part), BATCH):
                ks, pages = part[b:b + BATCH], list(range(b, min(b + BATCH, len(part))))
                while True:
                    ok = store.spill_from_layout(kind, ks, plan.layout, pages)
                    if all(ok):
                        break
                    first = ok.index(False)
                    ks, pages = ks[first:], pages[first:]
                    stats["retries"]["engine"] += 1
                    time.sleep(0.002)
        if not store.flush(600):
            raise RuntimeError("flush timed out")
        w = time.perf_counter() - t0
        t = 0.0
        for part, _ in chunks(keys):
            zero(ours)
            t0 = time.perf_counter()
            for b in range(0, len(part), BATCH):
                ok = store.reload_into_layout(kind, part[b:b + BATCH], plan.layout,
                                              list(range(b, min(b + BATCH, len(part)))))
                if not all(ok):
                    raise RuntimeError("engine: reload missed")
            t += time.perf_counter() - t0
            check(ours, len(part), "engine")
        return w, t

    def side_file(r):
        keys = _keys(n, f"file{r}")
        theirs.backend.clear()
        fill(theirs)
        t0 = time.perf_counter()
        for part, idx in chunks(keys):
            op = _op(StorageOperation(idx, token_ids=[], hash_value=part))
            fcc._page_backup(op)
            if op.completed_tokens != len(part) * ps:
                raise RuntimeError("HiCacheFile: write failed")
        os.sync()
        w = time.perf_counter() - t0
        for fn in os.listdir(file_dir):
            fd = os.open(os.path.join(file_dir, fn), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        return w, ctl_read(fcc, theirs, keys, "HiCacheFile")

    raw = Raw(os.path.join(work, "raw.bin"), slot_bytes_for(kv_page), kv_page, be.config.io_threads)

    def side_raw(r):
        w = raw.write(n, lambda i: ref[i % host_pages])
        rd = raw.read(n, lambda i: host_view(ours, i % host_pages))
        return w, rd

    sides = {"raw": side_raw, "ours": side_ours, "engine": side_engine, "hicache_file": side_file,
             "ours_durable": side_ours_durable}
    if args.sides:
        sides = {k: v for k, v in sides.items() if k in args.sides.split(",")}
    res = {k: {"w": [], "r": []} for k in sides}
    names = list(sides)
    try:
        side_engine("warm")  # first touch of slabs and staging outside the timed rounds
        if "ours_durable" in sides:
            side_ours_durable("warm")  # its own slab: the first write into fallocated extents is slower
        for r in range(args.repeats):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                w, rd = sides[name](r)
                res[name]["w"].append(w)
                res[name]["r"].append(rd)
                print(f"  round {r} {name:<13} write {n * kv_page / w / 1e9:6.2f} GB/s  read "
                      f"{n * kv_page / rd / 1e9:6.2f} GB/s", flush=True)
        io_mode = store.stats()["io_mode"]["target_kv"]
        raw_mode = raw.read_mode
    finally:
        raw.close()
        ours.close()
        ours_d.close()
        theirs.close()
        shutil.rmtree(work, ignore_errors=True)
    total = n * kv_page
    gbps = {k: {"write": total / _med(v["w"]) / 1e9, "read": total / _med(v["r"]) / 1e9} for k, v in res.items()}
    return {"mode": "controller", "pages": n, "page_bytes": kv_page, "bytes": total, "repeats": args.repeats,
            "layout": args.layout, "io_mode": io_mode, "gbps": gbps, "seconds": res, "retries": stats["retries"],
            "raw_read_mode": raw_mode}


# ---------------------------------------------------------------------------------------------- burst (item 8)
def run_burst(args) -> dict:
    """A burst of write-back operations handed to SGLang's backup thread at once, staging smaller than the burst:
    brief backpressure (default queues.wait_ms) vs the old drop (wait_ms = 0), alternated over the rounds."""
    import logging

    import torch

    import sglang_glm_ext
    from sglang_glm_ext.l3.disk.format import slot_bytes_for
    from sglang_glm_ext.l3.hicache.keys import storage_key
    from sglang_glm_ext.l3.demo import cpu_standins, stack

    spec, kv_page, n, work = _setup(args)
    stacks = {}
    for name, wait_ms in (("backpressure", None), ("drop", 0)):
        root = os.path.join(work, name)
        os.makedirs(root)
        cfg = os.path.join(root, "l3.toml")
        with open(cfg, "w") as f:
            f.write(_l3_config_text(root, (n + 8) * (slot_bytes_for(kv_page) + 700_000),
                                    staging=f"{args.burst_staging_mb}MiB", wait_ms=wait_ms))
        sa = stack.publish_server_args(spec, storage_backend=None, extra_config=None,
                                       plugin_values={"enable_cp_l3": True, "cp_l3_config": cfg})
        stacks[name] = stack.DsaStack.build(spec, sa)
    lines: list = []

    class Count(logging.Handler):
        def emit(self, record):
            if "Write page to storage" in record.getMessage():
                lines.append(record)

    sglang_log = logging.getLogger("sglang.srt.managers.cache_controller")
    handler = Count(logging.WARNING)
    sglang_log.addHandler(handler)
    ps = spec.page_size
    res = {k: [] for k in stacks}
    try:
        for st in stacks.values():
            host_pages = min(args.host_pages, st.host_pool("kv").page_num - 1)
            buf = st.host_pool("kv").kv_buffer.view(torch.uint8).reshape(st.host_pool("kv").page_num, -1)
            buf[:host_pages] = torch.randint(0, 256, buf[:host_pages].shape, dtype=torch.uint8)
        for r in range(args.repeats):
            for name in (("backpressure", "drop") if r % 2 == 0 else ("drop", "backpressure")):
                st = stacks[name]
                be, cc, store = st.backend, st.controller, st.backend.store
                store.clear()
                host_pages = min(args.host_pages, st.host_pool("kv").page_num - 1)
                keys = _keys(n, f"burst{name}{r}")
                ops = [keys[c:c + host_pages] for c in range(0, n, host_pages)]
                before = (len(lines), store.stats()["dropped_staging"])
                t0 = time.perf_counter()
                for part in ops:  # the whole burst queued at once: SGLang's backup thread takes it op by op
                    cc.write_storage(torch.arange(len(part) * ps, dtype=torch.int64), [], hash_value=part)
                acked = sum(cc.ack_backup_queue.get(timeout=900).completed_tokens for _ in ops) // ps
                if not store.flush(900):
                    raise RuntimeError("flush timed out")
                t = time.perf_counter() - t0
                kind = be.plan.kv.kind
                in_l3 = sum(store.exists(kind, [storage_key(k)], include_staged=False) for k in keys)
                row = {"pages": n, "acked": acked, "in_l3": in_l3, "seconds": t,
                       "durable_gbps": in_l3 * kv_page / t / 1e9, "offered_gbps": n * kv_page / t / 1e9,
                       "sglang_failed_lines": len(lines) - before[0],
                       "dropped_staging": store.stats()["dropped_staging"] - before[1]}
                res[name].append(row)
                print(f"  round {r} {name:<12} in L3 {in_l3}/{n} ({in_l3 / n:.0%}), acked {acked}, "
                      f"{row['durable_gbps']:.2f} GB/s durable, {row['sglang_failed_lines']} SGLang lines, "
                      f"{row['dropped_staging']} dropped", flush=True)
    finally:
        sglang_log.removeHandler(handler)
        for st in stacks.values():
            st.close()
        shutil.rmtree(work, ignore_errors=True)
    return {"mode": "burst", "pages": n, "page_bytes": kv_page, "staging_mb": args.burst_staging_mb,
            "repeats": args.repeats, "rounds": res}


def render_burst(res: dict) -> str:
    out = [f"Write burst through SGLang's backup thread: {res['pages']} pages x {res['page_bytes']:,} B queued at "
           f"once, L3 staging {res['staging_mb']} MiB, median of {res['repeats']} (alternated)",
           f"{'':<14} {'in L3 (hit rate)':>17} {'durable GB/s':>13} {'SGLang lines':>13} {'dropped':>8}"]
    for name, rows in res["rounds"].items():
        hit = _med([x["in_l3"] / x["pages"] for x in rows])
        out.append(f"{name:<14} {hit:>16.1%} {_med([x['durable_gbps'] for x in rows]):>13.2f} "
                   f"{_med([x['sglang_failed_lines'] for x in rows]):>13.0f} "
                   f"{_med([x['dropped_staging'] for x in rows]):>8.0f}")
    b, d = res["rounds"]["backpressure"], res["rounds"]["drop"]
    q = [x["durable_gbps"] / y["durable_gbps"] for x, y in zip(b, d) if y["durable_gbps"]]
    if q:
        out.append(f"backpressure/drop durable GB/s per round pair: {_med(q):.2f}x ({min(q):.2f}-{max(q):.2f})")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------- without SGLang
def run_engine_only(args) -> dict:
    """The GPU node (no SGLang): the L3 engine's own spill / reload_into vs raw O_DIRECT, nothing else."""
    from sglang_glm_ext.l3.config import L3Config
    from sglang_glm_ext.l3.disk.format import Namespace, PayloadKind, slot_bytes_for
    from sglang_glm_ext.l3.engine.store import L3Store

    page = 64 * args.layers * 656
    slot = slot_bytes_for(page)
    n = max(BATCH, int(args.size_gb * 1e9) // page)
    work = args.dir
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work, mode=0o700)
    rng = np.random.default_rng(0)
    ref = [rng.integers(0, 256, page, dtype=np.uint8) for _ in range(16)]
    # Page-aligned like SGLang's pinned host pool, so both the engine and the raw reference read straight into it.
    host_buf = _aligned(BATCH * page)
    host = np.frombuffer(host_buf.view, np.uint8).reshape(BATCH, page)
    host.fill(0)
    cfg = L3Config.from_dict({
        "deployment_id": "bench", "cold_start": "clear", "direct_io": "auto",
        "disks": [{"path": os.path.join(work, "disk"), "budget": (n + 2) * slot}],
        "index": {"path": os.path.join(work, "index"), "map_size": 256 * 2**20},
        "gc": {"start": 1.0, "stop": 0.99},
        "queues": {"staging_bytes": 2**30, "max_inflight": 4096},
    })
    kind = PayloadKind.TARGET_KV
    store = L3Store.open(cfg, rank=0, namespace=Namespace("bench", "fp8", "page_first", 64, 0, args.layers, "b"),
                         page_bytes={kind: page})
    raw = Raw(os.path.join(work, "raw.bin"), slot, page, cfg.io_threads)
    retries = 0

    def side_engine(r):
        nonlocal retries
        keys = _keys(n, f"engine{r}")
        store.clear()
        t0 = time.perf_counter()
        i = 0
        while i < n:
            ks = keys[i:i + BATCH]
            ok = store.spill(kind, ks, [ref[(i + j) % 16] for j in range(len(ks))])
            if all(ok):
                i += len(ks)
                continue
            i += ok.index(False)
            retries += 1
            time.sleep(0.002)
        if not store.flush(600):
            raise RuntimeError("flush timed out")
        w = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(0, n, BATCH):
            ks = keys[i:i + BATCH]
            if not all(store.reload_into(kind, ks, [host[j] for j in range(len(ks))])):
                raise RuntimeError("reload missed")
        rd = time.perf_counter() - t0
        if not np.array_equal(host[0], ref[(n - 1) // BATCH * BATCH % 16]):  # the last batch's first page
            raise RuntimeError("engine: wrong bytes")
        return w, rd

    def side_raw(r):
        w = raw.write(n, lambda i: ref[i % 16])
        rd = raw.read(n, lambda i: host[i % BATCH])
        return w, rd

    sides = {"raw": side_raw, "engine": side_engine}
    res = {k: {"w": [], "r": []} for k in sides}
    try:
        side_engine("warm")
        for r in range(args.repeats):
            for name in (("raw", "engine") if r % 2 == 0 else ("engine", "raw")):
                w, rd = sides[name](r)
                res[name]["w"].append(w)
                res[name]["r"].append(rd)
                print(f"  round {r} {name:<7} write {n * page / w / 1e9:6.2f} GB/s  read {n * page / rd / 1e9:6.2f} "
                      "GB/s", flush=True)
        io_mode = store.stats()["io_mode"][kind.label]
        raw_mode = raw.read_mode
    finally:
        store.close()
        raw.close()
        host = None  # the array exports the mapping: dropped before it closes
        host_buf.close()
        shutil.rmtree(work, ignore_errors=True)
    total = n * page
    gbps = {k: {"write": total / _med(v["w"]) / 1e9, "read": total / _med(v["r"]) / 1e9} for k, v in res.items()}
    return {"mode": "engine_only", "pages": n, "page_bytes": page, "bytes": total, "repeats": args.repeats,
            "io_mode": io_mode, "gbps": gbps, "seconds": res, "retries": {"engine": retries}, "raw_read_mode": raw_mode}


# ---------------------------------------------------------------------------------------------- report
def render(res: dict) -> str:
    g = res["gbps"]
    head = (f"{res['pages']} pages x {res['page_bytes']:,} B = {res['bytes'] / 1e9:.2f} GB per side and round, "
            f"median of {res['repeats']}, io {res['io_mode']}, staging-full retries {res['retries']}; raw read: "
            f"{res.get('raw_read_mode', '-')}")
    if res["mode"] == "engine_only":
        lines = ["L3 ENGINE ALONE vs raw O_DIRECT (no SGLang here: not the controller path, no HiCacheFile)", head,
                 f"{'':<22} {'engine GB/s':>12} {'raw GB/s':>10} {'engine/raw':>11} {'target':>7}"]
        for op, what in (("write", "durable write"), ("read", "cold read (O_DIRECT)")):
            q = g["engine"][op] / g["raw"][op]
            lines.append(f"{what:<22} {g['engine'][op]:>12.2f} {g['raw'][op]:>10.2f} {q:>10.2f}x {'>=0.8x':>7} "
                         f"{'PASS' if q >= 0.8 else 'FAIL'}")
        return "\n".join(lines)
    if not {"ours", "engine", "raw", "hicache_file"} <= set(g):
        return "\n".join([head] + [f"{k:<14} write {v['write']:.2f} GB/s  read {v['read']:.2f} GB/s"
                                    for k, v in g.items()] + _ack_line(res, g))
    lines = [f"L3 through SGLang's HiCache controller (v1 zero-copy), layout {res['layout']}", head,
             f"{'':<22} {'ours':>6} {'engine':>7} {'raw':>6} {'HiCacheFile':>12} | {'ours/raw':>8} "
             f"{'ours/engine':>11} {'ours/HiCacheFile':>16} | targets ours/raw, ours/engine >= 0.8x"]
    for op, what in (("write", "durable write GB/s"), ("read", "cold read GB/s")):
        o, e, r, f = g["ours"][op], g["engine"][op], g["raw"][op], g["hicache_file"][op]
        ok = "PASS" if o / r >= 0.8 and o / e >= 0.8 else "FAIL"
        lines.append(f"{what:<22} {o:>6.2f} {e:>7.2f} {r:>6.2f} {f:>12.2f} | {o / r:>7.2f}x {o / e:>10.2f}x "
                     f"{o / f:>15.2f}x | {ok}")
    lines.append(f"{'engine/raw':<22} write {g['engine']['write'] / g['raw']['write']:.2f}x, read "
                 f"{g['engine']['read'] / g['raw']['read']:.2f}x")
    return "\n".join(lines + _ack_line(res, g))


def _ack_line(res: dict, g: dict) -> list:
    if "ours_durable" not in g or "ours" not in g:
        return []
    d, o = g["ours_durable"]["write"], g["ours"]["write"]
    return [f"{'write-back, ack modes':<22} write_behind {o:.2f} GB/s, durable {d:.2f} GB/s: durable/write_behind "
            f"{d / o:.2f}x (medians; paired per round {_paired(res, 'ours_durable', 'ours')})"]


def _paired(res: dict, a: str, b: str) -> str:
    """a/b write throughput per round (the two sides ran minutes apart at most), as 'median (min-max)'."""
    q = [tb / ta for ta, tb in zip(res["seconds"][a]["w"], res["seconds"][b]["w"])]
    return f"{_med(q):.2f}x ({min(q):.2f}-{max(q):.2f})" if q else "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=2.0, help="data per side and round (GB); >= 2 for the record")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layers", type=int, default=78)
    ap.add_argument("--layout", default="page_first", choices=("page_first", "page_first_direct"),
                    help="page_first_direct needs --host-pages above --layers (SGLang 0.5.23 builds per-layer views "
                         "of the host buffer by its first axis there)")
    ap.add_argument("--host-pages", type=int, default=64, help="host pool pages per stack (pages cycle through it)")
    ap.add_argument("--dir", default=None, help="directory on the disk under test (default: a new one in /var/tmp)")
    ap.add_argument("--engine-only", action="store_true", help="engine vs raw only (what runs without SGLang)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--sides", default="", help="comma list of sides to run (default: all): raw, ours, engine, "
                    "hicache_file, ours_durable")
    ap.add_argument("--burst", action="store_true", help="the write-burst comparison: backpressure vs drop (item 8)")
    ap.add_argument("--burst-staging-mb", type=int, default=64, help="L3 staging of the burst stacks (MiB)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    args.dir = args.dir or tempfile.mkdtemp(prefix="l3_controller_bench_", dir="/var/tmp")
    mode = args.engine_only
    if not mode:
        try:
            import sglang.srt.managers.cache_controller  # noqa: F401
        except Exception as e:  # noqa: BLE001 - any import failure: the engine-only run, said so
            print(f"SGLang not importable ({type(e).__name__}: {e}): running engine vs raw O_DIRECT only")
            mode = True
    try:
        res = run_burst(args) if args.burst and not mode else run_engine_only(args) if mode else run_controller(args)
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)  # also after a failure before a side's own clean-up
    print(render_burst(res) if res["mode"] == "burst" else render(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
