#!/usr/bin/env python3
"""L3 store vs the raw disk, in one run, on one disk, with one page set: throughput AND CPU seconds per GB.

For each page size (default GLM-5's 3,274,752 B = 64 tokens x 78 layers x 656 B, and 1 MiB) and a fixed data
size (``--size-gb``, default 2), the median of ``--repeats`` (>= 3) runs of:

* raw O_DIRECT sequential write of the same slot-sized transfers (same thread count as the store's I/O pool),
  one fdatasync at the end                                          -> the reference for spill
* L3 spill -> durable: ``spill`` of every page (retrying pages the bounded staging refused) until ``flush``, twice
  per repeat: a first fill (every slot punched and preallocated again, so each write fills an unwritten extent, as
  in a new slab) and again over the slots just written (a slab in steady state). On ext4 the first costs 25-35 %
  more, for fio as for the store: each is paired with fio in the same state (below)
* raw O_DIRECT read of the same slots into a ring of aligned buffers as large as the host pool, no copy (same
  thread count as the reload pool)                                  -> the throughput reference for reload
* raw O_DIRECT read straight into the host page's own bytes (page-first: the page; layer-first: each layer's
  chunk) + one xxh3_64 pass over them where they landed             -> the CPU reference for reload, per layout
* L3 reload into a host pool of 128 pages (SGLang's STORAGE_BATCH_SIZE per call), page-first and layer-first
  (GLM-5: 78 x 41,984 B chunks; 1 MiB: 64 x 16 KiB), and for layer-first both the vectored read into the chunks
  and the single transfer + copy (where the engine under test has both)
* batched ``exists`` (128 keys per call), microseconds per page; peak staging memory vs the configured cap

* the disk's limit, with fio where it is (``--fio``, ``$SGLANG_GLM_EXT_FIO``, PATH; tools/fio.py): per page size a
  sweep of iodepth x numjobs (``--fio-grid``, printed) for O_DIRECT sequential write and random read of the slot
  size on the same file system, then in every repeat fio's best point again, next to the spill and the reloads
  (paired ratios: a disk whose speed drifts biases neither side); for the first fill, fio's best write point as one
  pass over a file just preallocated. Without fio the bench says so and reports only
  its own references. ``--fio-sweep JSON`` reuses a sweep (``python -m sglang_glm_ext.l3.tools.fio --json``);
  ``--reload-threads fio`` / ``--io-threads fio`` give the store as many threads as fio's best point had I/Os in
  flight (the store may raise its concurrency to reach the limit; the table says what it used)

CPU is user + sys of the whole process (``resource.getrusage``) over each timed pass, divided by the payload GB;
fio's is its own process's (``RUSAGE_CHILDREN``). The xxhash build and the vector unit XXH3 runs on are printed.
``--load-pages N`` also times a ``cold_start = "load"`` restart with N live pages (3,968 B pages, one 4 KiB slot
each: the cost is per page) against the same restart with none, and prints seconds per million pages.

The file runs standalone (``python .../bench.py``) against whichever ``sglang_glm_ext`` is importable, and uses
only store APIs that builds before direct reads also have, so ``benchmark/l3_ab.py`` runs this one file against
two checkouts (before / after) alternately. Needs numpy, lmdb, xxhash; never torch (sglang only for the
optional HiCacheFile reference row).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import resource
import shutil
import statistics
import sys
import threading
import time

import numpy as np
import xxhash

from sglang_glm_ext.l3.config import GIL_PAUSE_PAGE, L3Config

try:  # the engine's rooms
    from sglang_glm_ext.l3.disk import format as _format
    from sglang_glm_ext.l3.disk.aligned import AlignedBuffer
    from sglang_glm_ext.l3.disk.format import Namespace, PayloadKind, slot_bytes_for
    from sglang_glm_ext.l3.disk.host_layout import PageLayout
    from sglang_glm_ext.l3.engine.store import L3Store
except ModuleNotFoundError:  # an engine from before them: benchmark/l3_ab.py runs this file against both
    from sglang_glm_ext.l3 import format as _format
    from sglang_glm_ext.l3.aligned import AlignedBuffer
    from sglang_glm_ext.l3.format import Namespace, PayloadKind, slot_bytes_for
    from sglang_glm_ext.l3.layout import PageLayout
    from sglang_glm_ext.l3.store import L3Store

GLM5_PAGE = 64 * 78 * 656  # 3,274,752 B
KIND = PayloadKind.TARGET_KV
BATCH = 128
LOAD_PAGE = 4096 - 128  # the smallest page: one 4 KiB slot
EXIT_TARGET_MISSED = 3  # exit status when a row is FAIL (0: every target met; 1: crashed; 2: bad arguments)


def _beside(name: str):
    """A module that travels with this file (tools/NAME.py), loaded from beside it: benchmark/l3_ab.py runs this file
    against another tree's engine, which may not have it."""
    spec = importlib.util.spec_from_file_location(f"_l3_bench_{name}", os.path.join(os.path.dirname(
        os.path.abspath(__file__)), f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


fio = _beside("fio")
FIO_THREADS_MAX = 64  # `--reload-threads fio`: at most this many threads, whatever fio needed


def checksum_line() -> str:
    """The xxhash build and the vector unit XXH3 runs on (the engine's ``checksum_build``, where it has one)."""
    build = getattr(_format, "checksum_build", None)
    if build is None:
        return f"checksum: xxhash {xxhash.VERSION} (this engine does not report its vector unit)"
    b = build()
    return (f"checksum: xxhash {b['version']} (xxHash {b['xxhash_c']}), XXH3 on {b['vector'] or 'unknown'} "
            f"({b['how']}); CPU best {b['cpu_best'] or 'unknown'}" + (f"; WARNING: {b['warning']}" if b['warning']
                                                                       else ""))


def _keys(n: int, salt: str) -> list[str]:
    return [hashlib.sha256(f"{salt}:{i}".encode()).hexdigest() for i in range(n)]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Timed:
    """Wall and process CPU seconds of a block."""

    def __enter__(self):
        self.c0, self.t0 = _cpu(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.t0, _cpu() - self.c0


def _touched(bufs: list) -> list:
    """Fault the buffers in before any timing (first-touch page faults are not the read path's cost)."""
    for b in bufs:
        np.frombuffer(b.view, np.uint8).fill(0)
    return bufs


def _parallel(n_threads: int, n_items: int, fn) -> None:
    """Run fn(thread_index, item) for items i = t, t + T, ... on T threads (sequential offsets interleaved)."""
    errs = []

    def worker(t):
        try:
            for i in range(t, n_items, n_threads):
                fn(t, i)
        except BaseException as e:  # surface in the main thread
            errs.append(e)

    ths = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    if errs:
        raise errs[0]


def raw_write(path: str, n: int, slot: int, threads: int, src: list[np.ndarray], page: int) -> Timed:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    bufs = _touched([AlignedBuffer(slot) for _ in range(threads)])
    try:
        os.posix_fallocate(fd, 0, n * slot)
        with Timed() as t:
            def one(k, i):
                b = np.frombuffer(bufs[k].view, np.uint8)
                b[:page] = src[i % len(src)]  # the same copy the store does into staging
                os.pwrite(fd, bufs[k].view, i * slot)

            _parallel(threads, n, one)
            os.fdatasync(fd)
        return t
    finally:
        for b in bufs:
            b.close()
        os.close(fd)


def raw_read(path: str, n: int, slot: int, threads: int) -> Timed:
    """Each slot in one O_DIRECT read into a ring of slot-sized aligned buffers as large as the reload's host pool
    (no copy, no check): the disk's limit, the throughput reference for reload."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    ring = _touched([AlignedBuffer(slot) for _ in range(BATCH)])
    try:
        with Timed() as t:
            _parallel(threads, n, lambda k, i: os.preadv(fd, [ring[i % BATCH].view], i * slot))
        return t
    finally:
        for b in ring:
            b.close()
        os.close(fd)


def page_views(host: np.ndarray, page: int, n_layers: int, layout: str) -> list[list[memoryview]]:
    """Each host page's bytes in payload order, as they lie in the pool (page-first: one block; layer-first: one
    chunk per layer), computed here from the geometry alone (not through the engine under test)."""
    if layout == "page_first":
        return [[memoryview(host[p * page:(p + 1) * page])] for p in range(BATCH)]
    chunks = host.reshape(n_layers, BATCH, page // n_layers)
    return [[memoryview(chunks[l, p]) for l in range(n_layers)] for p in range(BATCH)]


def raw_read_xxh3(path: str, n: int, slot: int, threads: int, page: int, views: list) -> "tuple[Timed, str]":
    """The CPU reference for reload: each slot's payload read with O_DIRECT straight into the host page's own
    bytes (one vectored read: the page's pieces + a tail buffer for pad and header), then one xxh3_64 pass over
    those bytes where they landed -- the I/O and the checksum a reload cannot avoid, and nothing else. Where the
    file system refuses that transfer (pieces not aligned to its blocks), the slot goes into a ring buffer and
    is hashed there instead; the returned note says which."""
    return raw_read_in_place(path, n, slot, threads, page, views, checksum=True)


def raw_read_in_place(path: str, n: int, slot: int, threads: int, page: int, views: list,
                      checksum: bool = False) -> "tuple[Timed, str]":
    """Each slot's payload read with O_DIRECT straight into the host page's own pieces (+ a tail buffer for pad and
    header), and with ``checksum`` an xxh3_64 pass over them where they landed. Without the checksum it is the
    transfer an in-place layer-first reload cannot avoid: the same bytes as :func:`raw_read`, but into 64-78
    scattered chunks a page instead of one block, which some disks serve slower. Where the file system refuses the
    transfer, the slot goes into a ring buffer instead; the returned note says which."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    tails = _touched([AlignedBuffer(slot - page) for _ in range(threads)] if slot > page else [])
    ring = _touched([AlignedBuffer(slot) for _ in range(BATCH)])
    mode = ["in place"]
    try:
        def one(k, i):
            pieces = views[i % BATCH]
            if mode[0] == "in place":
                try:
                    os.preadv(fd, pieces + [tails[k].view], i * slot)
                    if checksum:
                        h = xxhash.xxh3_64()
                        for v in pieces:
                            h.update(v)
                        h.intdigest()
                    return
                except OSError:
                    mode[0] = "ring buffer (in-place read refused)"
            buf = ring[i % BATCH].view
            os.preadv(fd, [buf], i * slot)
            if checksum:
                xxhash.xxh3_64_intdigest(buf[:page])

        with Timed() as t:
            _parallel(threads, n, one)
        return t, mode[0]
    finally:
        for b in tails + ring:
            b.close()
        os.close(fd)


def store_config(root: str, n: int, slot: int, args, *, batch: "int | None" = None, io_threads: "int | None" = None,
                 reload_threads: "int | None" = None) -> L3Config:
    return L3Config.from_dict({
        "deployment_id": "bench",
        "cold_start": "clear",
        "direct_io": "auto",
        "disks": [{"path": os.path.join(root, "disk"), "budget": (n + 2) * slot}],
        "index": {"path": os.path.join(root, "index"), "map_size": 1 << 30},
        # The bench measures the write path, not GC: the pool never crosses the start watermark.
        "gc": {"start": 1.0, "stop": 0.99},
        "queues": {"staging_bytes": args.staging_mb * 2**20, "max_inflight": 4096,
                   "write_batch_pages": batch or args.batch_pages,
                   "io_threads": io_threads or _threads(args.io_threads),
                   "reload_threads": reload_threads or _threads(args.reload_threads),
                   # only when asked: an engine from before the key (benchmark/l3_ab.py's "before") refuses it
                   **({"read_coalesce_bytes": args.read_coalesce}
                      if getattr(args, "read_coalesce", None) is not None else {}),
                   **({"layer_first_gil_pause": args.gil_pause}
                      if getattr(args, "gil_pause", None) is not None else {})},
    })


def _threads(value) -> int:
    """A thread count option: an int, or "fio" (resolved per page size from fio's best point; 4 where unknown)."""
    return 4 if value == "fio" else int(value)


class FioRef:
    """fio's best O_DIRECT write and random read at one slot size, on the bench's directory (None where fio is
    absent or failed: ``why`` says so), and the best point run again beside each store pass."""

    def __init__(self, args, slot: int, root: str, total: int):
        self.args, self.slot, self.root, self.total = args, slot, root, total
        self.best: dict = {}
        self.why = ""
        self.path = os.path.join(root, f"fio.{slot}.dat")
        if args.fio_grid == "none":
            self.why = "fio skipped (--fio-grid none)"
            return
        self.exe, how = fio.find_fio(args.fio)
        if self.exe is None:
            self.why = how
            return
        kept = [r for r in args.fio_sweeps if r["block_bytes"] == slot]
        for kind in ("write", "read"):
            r = next((x for x in kept if x["kind"] == kind), None)
            if r is None and args.fio_sweeps_path:
                self.why = f"{args.fio_sweeps_path} has no {kind} sweep at {slot} B"
            elif r is None:
                r, why = fio.sweep(kind, slot, root, total, args.fio_seconds, grid=args.fio_grid, fio=self.exe,
                                   keep_file=True)
                if r is None:
                    self.why = why
                else:
                    print(fio.render(r), flush=True)
            if r is not None:
                self.best[kind] = r
        self.file_bytes = max([fio.file_bytes_for(slot, total, [(r["iodepth"], r["numjobs"])])
                               for r in self.best.values()] + [0])

    def threads(self, kind: str) -> "int | None":
        """I/Os in flight at fio's best point of ``kind`` (iodepth x numjobs), capped at FIO_THREADS_MAX."""
        r = self.best.get(kind)
        return None if r is None else min(FIO_THREADS_MAX, r["iodepth"] * r["numjobs"])

    def run(self, kind: str) -> "dict | None":
        """fio's best point of ``kind`` once more, now (a paired reference); None where there is none."""
        r = self.best.get(kind)
        if r is None:
            return None
        if kind == "read" and fio.lay_out(self.exe, self.path, self.file_bytes):
            return None
        row = fio.point(self.exe, kind, self.slot, self.path, self.file_bytes, self.args.fio_seconds, r["engine"],
                        r["iodepth"], r["numjobs"])
        return row if row.get("gbps") and not row.get("error") else None

    def run_fresh(self) -> "dict | None":
        """fio's best write point as ONE pass over a file of the store's data size just preallocated (a first
        fill, like a new slab's: tools/fio.py), in its own file; None where there is no best write point."""
        r = self.best.get("write")
        if r is None:
            return None
        size = max(self.total, r["numjobs"] * self.slot)
        row = fio.point(self.exe, "write", self.slot, os.path.join(self.root, f"fio.fresh.{self.slot}.dat"), size,
                        self.args.fio_seconds, r["engine"], r["iodepth"], r["numjobs"], fresh=True)
        return row if row.get("gbps") and not row.get("error") else None


def spill_all(store: L3Store, keys: list[str], src: list[np.ndarray]) -> tuple[Timed, int]:
    """Spill every page (retrying what staging refused: that is the backpressure) and wait until durable."""
    n, retries, i = len(keys), 0, 0
    with Timed() as t:
        while i < n:
            ks = keys[i:i + BATCH]
            acc = store.spill(KIND, ks, [src[(i + j) % len(src)] for j in range(len(ks))])
            if all(acc):
                i += len(ks)
                continue
            i += acc.index(False)
            retries += 1
            time.sleep(0.0005)
        ok = store.flush(600)
    if not ok:
        raise RuntimeError("flush timed out")
    return t, retries


def unwritten_again(store: L3Store) -> bool:
    """Punch every slot of the (cleared) store's slabs and preallocate them again, as the store makes a new slab:
    their next writes fill unwritten extents (a first fill). False where the engine under test has no way to (an
    older one) or the file system cannot punch."""
    try:
        parts = store._kinds[KIND].parts
        for st in parts:
            if st.slab.punch(range(st.num_slots)) != st.num_slots:
                return False
            st.slab.reserve(st.num_slots)
        return True
    except (AttributeError, KeyError, TypeError, OSError):
        return False


def reload_all(store: L3Store, keys: list[str], layout: PageLayout) -> tuple[Timed, int]:
    hits = 0
    with Timed() as t:
        for i in range(0, len(keys), BATCH):
            ks = keys[i:i + BATCH]
            hits += sum(store.reload_into_layout(KIND, ks, layout, list(range(len(ks)))))
    return t, hits


def exists_all(store: L3Store, keys: list[str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    found = 0
    for i in range(0, len(keys), BATCH):
        found += store.exists(KIND, keys[i:i + BATCH])
    return time.perf_counter() - t0, found


def hicache_file_rows(root: str, keys: list[str], src: list[np.ndarray], page: int, repeats: int):
    try:
        import torch
        from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig
    except Exception as e:  # noqa: BLE001 - any import failure means "no reference row"
        return None, f"HiCacheFile row skipped: sglang not importable ({type(e).__name__}: {e})"
    os.environ.pop("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", None)
    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                               is_mla_model=True, enable_storage_metrics=False, is_page_first_layout=True,
                               model_name="bench", extra_config={"enable_metadata_cache": False})
    d = os.path.join(root, "hicache_file")
    tsrc = [torch.from_numpy(s) for s in src]
    target = torch.empty(page, dtype=torch.uint8)
    w, r = [], []
    for _ in range(repeats):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        hf = HiCacheFile(cfg, file_path=d)
        t0 = time.perf_counter()
        for i, k in enumerate(keys):
            if not hf.set(k, tsrc[i % len(tsrc)]):
                return None, "HiCacheFile row skipped: set() failed"
        os.sync()  # HiCacheFile never fsyncs; count the flush so both rows mean "durable"
        w.append(time.perf_counter() - t0)
        for fn in os.listdir(d):
            fd = os.open(os.path.join(d, fn), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        t0 = time.perf_counter()
        for k in keys:
            if hf.get(k, target) is None:
                return None, "HiCacheFile row skipped: get() missed"
        r.append(time.perf_counter() - t0)
    shutil.rmtree(d, ignore_errors=True)
    return (statistics.median(w), statistics.median(r)), None


def layer_split(page: int) -> int:
    """Layers of the layer-first host pool for this page size: GLM-5's 78, else 64, else none (1)."""
    return next((n for n in (78, 64) if page % n == 0), 1)


def bench_page_size(page: int, args) -> dict:
    slot = slot_bytes_for(page)
    n = max(BATCH, int(args.size_gb * 1e9) // page)
    root = os.path.join(args.dir, f"p{page}")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root, mode=0o700)
    rng = np.random.default_rng(page)
    src = [rng.integers(0, 256, page, dtype=np.uint8) for _ in range(16)]
    keys = _keys(n, f"bench{page}")
    total = n * page
    n_layers = layer_split(page)
    ref = FioRef(args, slot, root, n * slot)
    io_threads = ref.threads("write") if args.io_threads == "fio" else None
    reload_threads = ref.threads("read") if args.reload_threads == "fio" else None
    cfg = store_config(root, n, slot, args, io_threads=io_threads, reload_threads=reload_threads)
    host = AlignedBuffer(BATCH * page)  # one host pool, seen page-first and layer-first (SGLang's two layouts)
    host_arr = np.frombuffer(host.view, np.uint8)
    host_arr.fill(0)  # faulted in before any timing, like SGLang's pinned host pool
    layouts = {"page_first": PageLayout.page_first(host, page_bytes=page, num_pages=BATCH)}
    if n_layers > 1:
        layouts["layer_first"] = PageLayout.layer_first(host, n_layers=n_layers, slice_bytes=page // n_layers,
                                                        num_pages=BATCH)
    views = {name: page_views(host_arr, page, n_layers, name) for name in layouts}
    res = {"page_bytes": page, "slot_bytes": slot, "pages": n, "bytes": total, "layers": n_layers, "raw_mode": {},
           "io_threads": cfg.io_threads, "reload_threads": cfg.reload_threads,
           "fio": {"why": ref.why, **{k: v for k, v in ref.best.items()},
                   "points": {"write": [], "write_fresh": [], "read": []}}}
    raw_path = os.path.join(root, "raw.bin")
    ns = Namespace("bench", "bf16", "page_first", 64, 0, 78, "bench")
    runs: dict[str, list[Timed]] = {}
    retries, retries_first, ex = [], [], []

    def rec(name, t):
        runs.setdefault(name, []).append(t)

    store = L3Store.open(cfg, rank=0, namespace=ns, page_bytes={KIND: page})
    # The engine's read path where it has one to switch (a private seam: the bench measures both modes).
    reads = getattr(store, "_reloader", None) or getattr(store, "_reads", None)
    res["hash_helpers"] = getattr(reads, "helpers", None)  # None: an engine that hashes on its reader threads
    # From this many readers on, each reader hashes its own page (engine/reload.py); None: an engine without it.
    res["hand_off_below"] = getattr(sys.modules.get(type(reads).__module__), "HAND_OFF_BELOW", None)
    # Layer-first: the engine's default read first (key reload_layer_first, what both sides of an A/B have), then
    # the other mode where the engine has two (reload_layer_first_single / _vectored): vectored vs single transfer.
    default = getattr(reads, "vectored", None)
    alt = [] if default is None or args.skip_alt_modes else [not default]
    modes = {"page_first": [None], "layer_first": [None] + alt}
    try:
        def write_raw():
            if os.path.exists(raw_path):
                os.unlink(raw_path)
            rec("raw_write", raw_write(raw_path, n, slot, cfg.io_threads, src, page))

        def write_store(rep):
            # A first fill (every slot punched: unwritten extents, like a new slab's), then the same pages again
            # over the slots just written (a slab in steady state: GC hands out slots that were written before).
            if rep:
                store.clear()
            if unwritten_again(store):
                t, rt = spill_all(store, keys, src)
                rec("spill_first", t)
                retries_first.append(rt)
                store.clear()
            t, rt = spill_all(store, keys, src)
            rec("spill", t)
            retries.append(rt)

        def fio_point(kind):
            if kind == "write_fresh":
                res["fio"]["points"][kind].append(ref.run_fresh())
            else:
                res["fio"]["points"][kind].append(ref.run(kind))

        per_transfer: dict = {}

        def reload_pass(name, layout, vectored):
            if vectored is not None:
                reads.vectored = vectored
            io0 = reads.io_counters() if hasattr(reads, "io_counters") else {}
            t, hits = reload_all(store, keys, layout)
            if default is not None:
                reads.vectored = default
            if hits != n:
                raise RuntimeError(f"reload ({name}) hit {hits} of {n}")
            if io0:  # pages per transfer of this pass (adjacent slots read together: read_coalesce_bytes)
                io = {k: v - io0.get(k, 0) for k, v in reads.io_counters().items()}
                pages = io.get("span_reads", 0)
                transfers = pages - io.get("run_pages", 0) + io.get("run_reads", 0)
                if transfers:
                    per_transfer[name + {None: "", True: " vectored", False: " single"}[vectored]] = pages / transfers
            return t

        # Each measurement sits next to its reference, in an order that flips every repeat (A B, B A, ...), and each
        # ratio is taken within its pair, then the median over repeats: a (virtual) disk or a shared CPU whose speed
        # drifts during the run biases neither side (the raw rate alone moved 2x between back-to-back runs here).
        for rep in range(args.repeats):
            flip = rep % 2 == 1
            writes = [write_raw, lambda: write_store(rep), lambda: fio_point("write"), lambda: fio_point("write_fresh")]
            for step in writes[::-1] if flip else writes:
                step()
            dt, found = exists_all(store, keys)
            if found != n:
                raise RuntimeError(f"exists found {found} of {n}")
            ex.append(dt)
            if not flip:
                fio_point("read")
            raw = raw_read(raw_path, n, slot, cfg.reload_threads)
            rec("raw_read", raw)
            scattered = None  # the layer-first transfer alone: the in-place reload's own ceiling on this disk
            if "layer_first" in layouts:
                scattered, res["raw_mode"]["layer_first_transfer"] = raw_read_in_place(
                    raw_path, n, slot, cfg.reload_threads, page, views["layer_first"])
                rec("raw_read_layer_first", scattered)
            for name, layout in layouts.items():
                for vectored in modes[name]:
                    key = f"reload_{name}" + {None: "", True: "_vectored", False: "_single"}[vectored]
                    pair = [lambda v=views[name]: raw_read_xxh3(raw_path, n, slot, cfg.reload_threads, page, v),
                            lambda name=name, layout=layout, vectored=vectored: reload_pass(name, layout, vectored)]
                    got = [f() for f in (pair[::-1] if flip else pair)]
                    (xref, res["raw_mode"][name]), t = got[::-1] if flip else got
                    rec(f"raw_read_xxh3_{name}", xref)
                    rec(key, t)
                    res.setdefault(f"{key}_paired", []).append(
                        {"cpu_vs_raw_xxh3": t.cpu / xref.cpu, "gbps_vs_raw": raw.wall / t.wall,
                         "gbps_vs_raw_xxh3": xref.wall / t.wall, "gbps": total / t.wall / 1e9,
                         **({"gbps_vs_raw_in_place": scattered.wall / t.wall}
                            if name == "layer_first" and scattered is not None else {})})
            if flip:
                fio_point("read")
        # Spot check: reloaded bytes are the spilled ones, in both layouts.
        out = np.empty(page, np.uint8)
        for layout in layouts.values():
            store.reload_into_layout(KIND, keys[:4], layout, [0, 1, 2, 3])
            for j in range(4):
                layout.gather_into(j, out)
                if not np.array_equal(out, src[j % len(src)]):
                    raise RuntimeError("reload returned wrong bytes")
        st = store.stats()
        res["layer_first_default"] = {None: "single transfer (the only mode)", True: "vectored",
                                      False: "single transfer"}[default]
        res["dio_alignment"] = reads.alignment() if hasattr(reads, "alignment") else "n/a (this engine)"
        res["io_counters"] = reads.io_counters() if hasattr(reads, "io_counters") else {}
        res["read_coalesce_bytes"] = getattr(cfg, "read_coalesce_bytes", None)  # None: an engine without it
        res["layer_first_gil_pause_bytes"] = getattr(cfg, "layer_first_gil_pause_bytes", None)
        res["pages_per_transfer"] = per_transfer
    finally:
        store.close()
        if os.path.exists(raw_path):
            os.unlink(raw_path)
        del layouts, host_arr
        try:
            host.close()
        except BufferError:
            pass

    med = statistics.median
    for name, ts in runs.items():
        res[f"{name}_s"] = [t.wall for t in ts]
        res[f"{name}_cpu_s"] = [t.cpu for t in ts]
        res[f"{name}_gbps"] = total / med(t.wall for t in ts) / 1e9
        res[f"{name}_cpu_s_per_gb"] = med(t.cpu for t in ts) / (total / 1e9)
    _fio_ratios(res, runs, total)
    res.update({
        "exists_us_per_page": med(ex) / n * 1e6, "spill_retries": retries, "spill_first_retries": retries_first,
        "staging_peak_bytes": st["staging_peak_bytes"], "staging_cap_bytes": st["staging_cap_bytes"],
        "io_mode": st["io_mode"][KIND.label],
    })
    if args.skip_hicachefile:
        res["hicache_file"] = "skipped (--skip-hicachefile)"
    else:
        hf, why = hicache_file_rows(root, keys, src, page, args.repeats)
        res["hicache_file"] = why if hf is None else {"write_gbps": total / hf[0] / 1e9,
                                                      "read_gbps": total / hf[1] / 1e9}
    shutil.rmtree(root, ignore_errors=True)
    return res


def _fio_ratios(res: dict, runs: dict, total: int) -> None:
    """fio's paired points: its GB/s and CPU s/GB (medians), and each store pass over the fio run of its repeat."""
    med = statistics.median
    for kind in ("write", "write_fresh", "read"):
        pts = res["fio"]["points"].get(kind, [])
        ok = [p for p in pts if p]
        if not ok:
            continue
        res[f"fio_{kind}_gbps"] = med(p["gbps"] for p in ok)
        res[f"fio_{kind}_cpu_s_per_gb"] = med(p["cpu_s_per_gb"] for p in ok if p.get("cpu_s_per_gb") is not None) \
            if any(p.get("cpu_s_per_gb") is not None for p in ok) else None
        passes = {"write": ["spill"], "write_fresh": ["spill_first"]}.get(kind) or \
            [k for k in runs if k.startswith("reload_")]
        for name in passes:
            q = [total / t.wall / 1e9 / p["gbps"] for t, p in zip(runs.get(name, []), _per_pass(pts, runs.get(name, [])))
                 if p]
            if q:
                res[f"{name}_vs_fio"] = q


def _per_pass(points: list, passes: list) -> list:
    """The fio point of each repeat, for each timed pass of one name (one pass per repeat)."""
    return (points + [None] * len(passes))[:len(passes)]


def bench_load(args) -> dict:
    """Restart cost: open with ``cold_start = "load"`` over N live pages vs over none (same config, same disk)."""
    n, slot = args.load_pages, slot_bytes_for(LOAD_PAGE)
    root = os.path.join(args.dir, "load")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root, mode=0o700)
    cfg = store_config(root, n, slot, args, batch=256)
    ns = Namespace("bench", "bf16", "page_first", 64, 0, 78, "bench")
    src = [np.random.default_rng(7).integers(0, 256, LOAD_PAGE, dtype=np.uint8)]
    keys = _keys(n, "load")

    def open_load():
        t0 = time.perf_counter()
        s = L3Store.open(cfg, rank=0, namespace=ns, page_bytes={KIND: LOAD_PAGE}, cold_start="load")
        return s, time.perf_counter() - t0

    try:
        s, _ = open_load()
        empty = []
        for _ in range(args.repeats):
            s.close()
            s, dt = open_load()
            empty.append(dt)
        t0 = time.perf_counter()
        spill_all(s, keys, src)
        fill_s = time.perf_counter() - t0
        s.close()
        full, loaded = [], 0
        for _ in range(args.repeats):
            s, dt = open_load()
            loaded = getattr(s, "loaded_pages", None)
            full.append(dt)
            s.close()
        if loaded != n:
            raise RuntimeError(f"load kept {loaded} of {n} pages")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = statistics.median
    return {"pages": n, "page_bytes": LOAD_PAGE, "slot_bytes": slot, "open_empty_s": empty, "open_load_s": full,
            "fill_s": fill_s, "s_per_million": (med(full) - med(empty)) / n * 1e6}


def _s_per_gb(x) -> str:
    return "-" if x is None else f"{x:.3f}s/GB"


def _pass(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def render(results: list[dict], load: "dict | None", args, failed: "list[str] | None" = None) -> str:
    """The table; each row marked FAIL is also appended to `failed` ("page metric")."""
    lines = [f"L3 bench: dir={args.dir} size={args.size_gb} GB/page-size repeats={args.repeats} "
             f"io_threads={args.io_threads} reload_threads={args.reload_threads} batch={args.batch_pages} "
             f"(median of repeats; a ratio is the median of each repeat's adjacent pair; CPU = user+sys of the process per "
             f"payload GB)", checksum_line()]
    absent = sorted({r["fio"]["why"] for r in results if not r["fio"].get("write") and not r["fio"].get("read")})
    for why in absent:
        lines.append(f"fio absent: {why}; ratios are to the bench's own raw reference only")
    lines += [f"{'page':>9} | {'metric':<40} | {'L3':>12} | {'reference':>12} | {'ratio':>6} | {'target':>7} | ok",
              "-" * 110]

    parent = [""]

    def row(page, metric, a, b, ratio, target, ok):
        lines.append(f"{page:>9} | {metric:<40} | {a:>12} | {b:>12} | {ratio:>6} | {target:>7} | {ok}")
        if not metric.startswith(" "):
            parent[0] = metric.split(" vs ")[0]
        if ok == "FAIL" and failed is not None:
            what = f"{parent[0]}: {metric.strip()}" if metric.startswith(" ") else metric
            failed.append(f"{page} {what} {ratio if ratio != '-' else a} (target {target})")

    for r in results:
        p = r["page_bytes"]
        # The raw write fills a file just preallocated: it pairs with the store's first fill where the bench has one.
        first = "spill_first" if r.get("spill_first_gbps") else "spill"
        label = "spill (first fill)" if first == "spill_first" else "spill"
        q = r[f"{first}_gbps"] / r["raw_write_gbps"]
        row(p, f"{label}->durable vs raw O_DIRECT write",
            f"{r[f'{first}_gbps']:.2f}GB/s", f"{r['raw_write_gbps']:.2f}GB/s", f"{q:.2f}x", ">=0.8x", _pass(q >= 0.8))
        row(p, "  CPU: spill vs raw write", f"{r[f'{first}_cpu_s_per_gb']:.3f}s/GB",
            f"{r['raw_write_cpu_s_per_gb']:.3f}s/GB", f"{r[f'{first}_cpu_s_per_gb'] / r['raw_write_cpu_s_per_gb']:.2f}x",
            "info", "-")
        fw, fr = r["fio"].get("write"), r["fio"].get("read")
        if r.get("fio_write_gbps"):
            row(p, f"fio best seq write ({fw['iodepth']}x{fw['numjobs']} {fw['engine']})",
                f"{r['fio_write_gbps']:.2f}GB/s", _s_per_gb(r.get("fio_write_cpu_s_per_gb")), "-", "info", "-")
            q = statistics.median(r["spill_vs_fio"])
            row(p, "spill->durable vs fio best write", f"{r['spill_gbps']:.2f}GB/s", f"{r['fio_write_gbps']:.2f}GB/s",
                f"{q:.2f}x", ">=0.9x", _pass(q >= 0.9))
            if r.get("fio_write_fresh_gbps") and r.get("spill_first_vs_fio"):
                q = statistics.median(r["spill_first_vs_fio"])
                row(p, "  first fill vs fio, one pass, new file", f"{r['spill_first_gbps']:.2f}GB/s",
                    f"{r['fio_write_fresh_gbps']:.2f}GB/s", f"{q:.2f}x", ">=0.9x", _pass(q >= 0.9))
        elif fw:
            lines.append(f"{p:>9} | fio write points failed in every repeat (sweep best {fw['gbps']:.2f}GB/s)")
        row(p, "raw O_DIRECT read: throughput, CPU", f"{r['raw_read_gbps']:.2f}GB/s",
            f"{r['raw_read_cpu_s_per_gb']:.3f}s/GB", "-", "info", "-")
        if r.get("raw_read_layer_first_gbps"):
            row(p, "  same, into the layer-first chunks", f"{r['raw_read_layer_first_gbps']:.2f}GB/s",
                f"{r['raw_read_layer_first_cpu_s_per_gb']:.3f}s/GB",
                f"{r['raw_read_layer_first_gbps'] / r['raw_read_gbps']:.2f}x", "info", "-")
        if r.get("fio_read_gbps"):
            row(p, f"fio best rand read ({fr['iodepth']}x{fr['numjobs']} {fr['engine']})",
                f"{r['fio_read_gbps']:.2f}GB/s", _s_per_gb(r.get("fio_read_cpu_s_per_gb")), "-", "info", "-")
        elif fr:
            lines.append(f"{p:>9} | fio read points failed in every repeat (sweep best {fr['gbps']:.2f}GB/s)")
        for key in [k for k in r if k.startswith("reload_") and k.endswith("_gbps")]:
            name = key[len("reload_"):-len("_gbps")]
            layout = "layer_first" if name.startswith("layer_first") else "page_first"
            label = name.replace("_", "-", 1).replace("_", " ")
            paired = r[f"reload_{name}_paired"]
            q = statistics.median(x["gbps_vs_raw"] for x in paired)
            row(p, f"reload {label} vs raw read", f"{r[key]:.2f}GB/s", f"{r['raw_read_gbps']:.2f}GB/s",
                f"{q:.2f}x", ">=0.95x", _pass(q >= 0.95))
            if r.get(f"reload_{name}_vs_fio"):
                q = statistics.median(r[f"reload_{name}_vs_fio"])
                row(p, "  vs fio best rand read", f"{r[key]:.2f}GB/s", f"{r['fio_read_gbps']:.2f}GB/s", f"{q:.2f}x",
                    ">=0.9x", _pass(q >= 0.9))
            if all("gbps_vs_raw_in_place" in x for x in paired):
                q = statistics.median(x["gbps_vs_raw_in_place"] for x in paired)
                row(p, "  vs raw read into the same chunks", f"{r[key]:.2f}GB/s",
                    f"{r['raw_read_layer_first_gbps']:.2f}GB/s", f"{q:.2f}x", "info", "-")
            q = statistics.median(x["gbps_vs_raw_xxh3"] for x in paired)
            row(p, "  vs raw read + xxh3 in place", f"{r[key]:.2f}GB/s",
                f"{r[f'raw_read_xxh3_{layout}_gbps']:.2f}GB/s", f"{q:.2f}x", "info", "-")
            c, ref = r[f"reload_{name}_cpu_s_per_gb"], r[f"raw_read_xxh3_{layout}_cpu_s_per_gb"]
            q = statistics.median(x["cpu_vs_raw_xxh3"] for x in paired)
            row(p, "  CPU: vs raw read + xxh3 in place", f"{c:.3f}s/GB", f"{ref:.3f}s/GB", f"{q:.2f}x",
                "<=1.2x", _pass(q <= 1.2))
        e = r["exists_us_per_page"]
        row(p, "batched exists (128/call)", f"{e:.2f}us/pg", "-", "-", "<=20us", _pass(e <= 20))
        q = r["staging_peak_bytes"] / r["staging_cap_bytes"]
        row(p, "peak staging vs cap", f"{r['staging_peak_bytes'] / 2**20:.0f}MiB",
            f"{r['staging_cap_bytes'] / 2**20:.0f}MiB", f"{q:.2f}x", "<=1.0x", _pass(q <= 1.0))
        hf = r["hicache_file"]
        if isinstance(hf, dict):
            row(p, "HiCacheFile write+os.sync (ref)", f"{r['spill_gbps']:.2f}GB/s", f"{hf['write_gbps']:.2f}GB/s",
                f"{r['spill_gbps'] / hf['write_gbps']:.2f}x", "info", "L3/HiCacheFile")
            rl = r["reload_page_first_gbps"]
            row(p, "HiCacheFile read, DONTNEED (ref)", f"{rl:.2f}GB/s", f"{hf['read_gbps']:.2f}GB/s",
                f"{rl / hf['read_gbps']:.2f}x", "info", "L3/HiCacheFile")
        else:
            lines.append(f"{p:>9} | {hf}")
        lines.append(f"{'':>9} | layer-first default read: {r['layer_first_default']} ([queues] layer_first_reads = "
                     f"\"vectored\" | \"single\"; where both rows are printed, take the mode that meets your targets)")
        helpers, below = r.get("hash_helpers"), r.get("hand_off_below")
        hashing = "on the reading threads" if helpers is None or (below is not None and r["reload_threads"] >= below) \
            else f"on the caller's thread + up to {helpers} helper(s), readers never wait on them"
        best = ", ".join(f"{k} {x['iodepth']}x{x['numjobs']} = {x['iodepth'] * x['numjobs']} in flight"
                         for k, x in (("write", fw), ("read", fr)) if x) or "-"
        lines.append(f"{'':>9} | store threads: io_threads={r['io_threads']} (writes in flight), reload_threads="
                     f"{r['reload_threads']} (reads in flight), checksums {hashing}; fio best: {best}")
        if r.get("pages_per_transfer"):
            per = ", ".join(f"{k.replace('_', '-')} {v:.1f}" for k, v in r["pages_per_transfer"].items())
            lines.append(f"{'':>9} | reload pages per transfer: {per} (adjacent slots read together up to [queues] "
                         f"read_coalesce_bytes = {r.get('read_coalesce_bytes')} B)")
        if r.get("layer_first_gil_pause_bytes") is not None:
            g = r["layer_first_gil_pause_bytes"]
            when = ("never" if g == 0 else "at each page's end" if g >= GIL_PAUSE_PAGE
                    else f"every {g} B and at each page's end")
            lines.append(f"{'':>9} | layer-first checksums give the GIL up {when} ([queues] layer_first_gil_pause)")
        lines.append(f"{'':>9} | io_mode={r['io_mode']} pages={r['pages']} layers={r['layers']} spill retries "
                     f"(staging full)={r['spill_retries']} dio={r['dio_alignment']} "
                     f"raw reads in place={r['raw_mode']}")
    if load:
        s = load["s_per_million"]
        row(load["page_bytes"], f"cold_start=load, {load['pages']} live pages", f"{s:.2f}s/Mpg",
            f"{statistics.median(load['open_empty_s']):.2f}s empty", "-", "<=10s", _pass(s <= 10))
    return "\n".join(lines)


def add_arguments(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The bench's options; `sglang-glm-ext l3 bench` adds the same ones to its subcommand."""
    ap.add_argument("--dir", default="/tmp/l3_bench", help="directory on the disk under test")
    ap.add_argument("--size-gb", type=float, default=2.0, help="data per page size (GB); >= 2 for the record")
    ap.add_argument("--page-bytes", type=int, nargs="+", default=[GLM5_PAGE, 2**20],
                    help="page sizes to bench, in bytes (GLM-5's 64-token page, then 1 MiB)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per measurement; rows show medians")
    ap.add_argument("--io-threads", type=_threads_arg, default=4,
                    help="[queues] io_threads, and the raw write's threads; 'fio': fio's best write iodepth x numjobs")
    ap.add_argument("--reload-threads", type=_threads_arg, default=4,
                    help="[queues] reload_threads (reads in flight), and the raw read's threads; 'fio': fio's best "
                         f"random read iodepth x numjobs (at most {FIO_THREADS_MAX})")
    ap.add_argument("--read-coalesce", default=None, metavar="SIZE",
                    help="[queues] read_coalesce_bytes (e.g. 8MiB; 0: one read a page); default: the engine's")
    ap.add_argument("--gil-pause", default=None, metavar="WHEN",
                    help='[queues] layer_first_gil_pause ("page", "off" or a size such as 1MiB); default: the '
                         "engine's")
    ap.add_argument("--batch-pages", type=int, default=32, help="[queues] write_batch_pages")
    ap.add_argument("--staging-mb", type=int, default=256, help="[queues] staging_bytes, in MiB")
    ap.add_argument("--load-pages", type=int, default=0,
                    help="also time a cold_start=load restart over this many live pages (0: skip; 100000+ for the "
                         "record)")
    ap.add_argument("--skip-throughput", action="store_true", help="only the --load-pages timing")
    ap.add_argument("--skip-hicachefile", action="store_true", help="leave out SGLang's HiCacheFile reference rows")
    ap.add_argument("--skip-alt-modes", action="store_true",
                    help="time only the engine's default layer-first read (not also its other read mode)")
    ap.add_argument("--fio", metavar="PATH", default=None,
                    help=f"fio binary for the disk's limit (default: ${fio.ENV}, then fio on PATH; none: said, and the "
                         "bench's own raw reference only)")
    ap.add_argument("--fio-grid", default="small", choices=sorted(fio.GRIDS) + ["none"],
                    help="iodepth x numjobs points of the fio sweep (small: 10 points; none: no fio)")
    ap.add_argument("--fio-seconds", type=float, default=2.0, help="seconds per fio point")
    ap.add_argument("--fio-sweep", metavar="JSON", default=None,
                    help="reuse a sweep (python -m sglang_glm_ext.l3.tools.fio --json, or this bench's --json) "
                         "instead of sweeping; each repeat still runs the best point beside the store's passes")
    ap.add_argument("--json", metavar="PATH", help="also write the raw results as JSON")
    return ap


def _threads_arg(value: str):
    if value == "fio":
        return value
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is neither a thread count nor 'fio'") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: at least 1 thread")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = add_arguments(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    return run(ap.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    args.fio_sweeps_path = args.fio_sweep
    args.fio_sweeps = []
    if args.fio_sweep:
        try:
            args.fio_sweeps = fio.load_sweeps(args.fio_sweep)
        except (OSError, ValueError) as e:
            raise SystemExit(f"--fio-sweep {args.fio_sweep}: {e}") from None
    os.makedirs(args.dir, exist_ok=True)
    results = [] if args.skip_throughput else [bench_page_size(p, args) for p in args.page_bytes]
    load = bench_load(args) if args.load_pages > 0 else None
    failed: list[str] = []
    print(render(results, load, args, failed))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "load": load, "checksum": checksum_line(),
                       "fio_sweeps": [x for r in results for x in (r["fio"].get("write"), r["fio"].get("read")) if x]},
                      f, indent=2)
    if failed:  # exit 3: the bench ran and missed a target (1 is a crash, 2 bad arguments)
        print(f"l3 bench: {len(failed)} target(s) missed on {args.dir}: " + "; ".join(failed), file=sys.stderr)
        return EXIT_TARGET_MISSED
    return 0


if __name__ == "__main__":
    sys.exit(main())
