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
only store APIs that builds before direct reads also have (what it reads beyond them: ``bench_engine.py``), so
``benchmark/l3_ab.py`` runs this one file, with its parts beside it (``bench_refs.py``: the references;
``bench_report.py``: the table), against two checkouts (before / after) alternately. Needs numpy, lmdb, xxhash; never torch (sglang only for the
optional HiCacheFile reference row).
"""


from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import statistics
import sys
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
refs = _beside("bench_refs")  # the raw, fio and HiCacheFile references
report = _beside("bench_report")  # the table
engine = _beside("bench_engine")  # what the bench reads of the engine beyond the caller API
# The references' names, kept here for the benchmarks and tests that import them from the bench.
BATCH, FIO_THREADS_MAX, FioRef, Timed = refs.BATCH, refs.FIO_THREADS_MAX, refs.FioRef, refs.Timed
_touched, _parallel, page_views = refs.touched, refs.parallel, refs.page_views
hicache_file_rows = refs.hicache_file_rows
raw_write, raw_read, raw_read_xxh3, raw_read_in_place = (refs.raw_write, refs.raw_read, refs.raw_read_xxh3,
                                                         refs.raw_read_in_place)


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


def layer_split(page: int) -> int:
    """Layers of the layer-first host pool for this page size: GLM-5's 78, else 64, else none (1)."""
    return next((n for n in (78, 64) if page % n == 0), 1)


def unwritten_again(store: L3Store) -> bool:
    """Punch every slot of the (cleared) store's slabs and preallocate them again, as the store makes a new slab:
    their next writes fill unwritten extents (a first fill). False where the engine under test has no way to (an
    older one) or the file system cannot punch."""
    return engine.unwritten_again(store, KIND)


class _Point:
    """One page size's inputs (pages, keys, host pool in both layouts, fio's reference, the store's config) and its
    results so far: what the steps of :func:`bench_page_size` share."""

    def __init__(self, page: int, args):
        self.page, self.args = page, args
        self.slot = slot = slot_bytes_for(page)
        self.n = n = max(BATCH, int(args.size_gb * 1e9) // page)
        self.root = os.path.join(args.dir, f"p{page}")
        shutil.rmtree(self.root, ignore_errors=True)
        os.makedirs(self.root, mode=0o700)
        rng = np.random.default_rng(page)
        self.src = [rng.integers(0, 256, page, dtype=np.uint8) for _ in range(16)]
        self.keys = _keys(n, f"bench{page}")
        self.total = n * page
        self.n_layers = n_layers = layer_split(page)
        self.ref = FioRef(args, slot, self.root, n * slot, fio)
        io_threads = self.ref.threads("write") if args.io_threads == "fio" else None
        reload_threads = self.ref.threads("read") if args.reload_threads == "fio" else None
        self.cfg = store_config(self.root, n, slot, args, io_threads=io_threads, reload_threads=reload_threads)
        self.host = AlignedBuffer(BATCH * page)  # one host pool, seen page-first and layer-first (SGLang's two)
        self.host_arr = np.frombuffer(self.host.view, np.uint8)
        self.host_arr.fill(0)  # faulted in before any timing, like SGLang's pinned host pool
        self.layouts = {"page_first": PageLayout.page_first(self.host, page_bytes=page, num_pages=BATCH)}
        if n_layers > 1:
            self.layouts["layer_first"] = PageLayout.layer_first(self.host, n_layers=n_layers,
                                                                 slice_bytes=page // n_layers, num_pages=BATCH)
        self.views = {name: page_views(self.host_arr, page, n_layers, name) for name in self.layouts}
        self.res = {"page_bytes": page, "slot_bytes": slot, "pages": n, "bytes": self.total, "layers": n_layers,
                    "raw_mode": {}, "io_threads": self.cfg.io_threads, "reload_threads": self.cfg.reload_threads,
                    "fio": {"why": self.ref.why, **{k: v for k, v in self.ref.best.items()},
                            "points": {"write": [], "write_fresh": [], "read": []}}}
        self.raw_path = os.path.join(self.root, "raw.bin")
        self.ns = Namespace("bench", "bf16", "page_first", 64, 0, 78, "bench")
        self.runs: dict[str, list[Timed]] = {}
        self.retries, self.retries_first, self.ex = [], [], []
        self.per_transfer: dict = {}

    def rec(self, name: str, t: Timed) -> None:
        self.runs.setdefault(name, []).append(t)

    def fio_point(self, kind: str) -> None:
        self.res["fio"]["points"][kind].append(self.ref.run_fresh() if kind == "write_fresh" else self.ref.run(kind))

    def release(self) -> None:
        if os.path.exists(self.raw_path):
            os.unlink(self.raw_path)
        self.layouts = self.host_arr = None
        try:
            self.host.close()
        except BufferError:
            pass


def bench_page_size(page: int, args) -> dict:
    pt = _Point(page, args)
    store = L3Store.open(pt.cfg, rank=0, namespace=pt.ns, page_bytes={KIND: page})
    reads = engine.ReadPath(store)
    pt.res["hash_helpers"] = reads.helpers  # None: an engine that hashes on its reader threads
    # From this many readers on, each reader hashes its own page (engine/reload.py); None: an engine without it.
    pt.res["hand_off_below"] = reads.hand_off_below
    # Layer-first: the engine's default read first (key reload_layer_first, what both sides of an A/B have), then
    # the other mode where the engine has two (reload_layer_first_single / _vectored): vectored vs single transfer.
    alt = [] if reads.default is None or args.skip_alt_modes else [not reads.default]
    modes = {"page_first": [None], "layer_first": [None] + alt}
    try:
        # Each measurement sits next to its reference, in an order that flips every repeat (A B, B A, ...), and each
        # ratio is taken within its pair, then the median over repeats: a (virtual) disk or a shared CPU whose speed
        # drifts during the run biases neither side (the raw rate alone moved 2x between back-to-back runs here).
        for rep in range(args.repeats):
            _writes(pt, store, rep)
            _reads(pt, store, reads, modes, rep)
        _spot_check(pt, store)
        st = store.stats()
        pt.res["layer_first_default"] = {None: "single transfer (the only mode)", True: "vectored",
                                         False: "single transfer"}[reads.default]
        pt.res["dio_alignment"] = reads.alignment()
        pt.res["io_counters"] = reads.io_counters()
        pt.res["read_coalesce_bytes"] = getattr(pt.cfg, "read_coalesce_bytes", None)  # None: an engine without it
        pt.res["layer_first_gil_pause_bytes"] = getattr(pt.cfg, "layer_first_gil_pause_bytes", None)
        pt.res["pages_per_transfer"] = pt.per_transfer
    finally:
        store.close()
        pt.release()
    return _summary(pt, st)


def _writes(pt: _Point, store: L3Store, rep: int) -> None:
    """One repeat's writes, paired and in flipped order: the raw write, the store's spills, fio's two points."""
    def write_raw():
        if os.path.exists(pt.raw_path):
            os.unlink(pt.raw_path)
        pt.rec("raw_write", raw_write(pt.raw_path, pt.n, pt.slot, pt.cfg.io_threads, pt.src, pt.page))

    def write_store():
        # A first fill (every slot punched: unwritten extents, like a new slab's), then the same pages again over
        # the slots just written (a slab in steady state: GC hands out slots that were written before).
        if rep:
            store.clear()
        if unwritten_again(store):
            t, rt = spill_all(store, pt.keys, pt.src)
            pt.rec("spill_first", t)
            pt.retries_first.append(rt)
            store.clear()
        t, rt = spill_all(store, pt.keys, pt.src)
        pt.rec("spill", t)
        pt.retries.append(rt)

    steps = [write_raw, write_store, lambda: pt.fio_point("write"), lambda: pt.fio_point("write_fresh")]
    for step in steps[::-1] if rep % 2 == 1 else steps:
        step()


def _reads(pt: _Point, store: L3Store, reads, modes: dict, rep: int) -> None:
    """One repeat's exists and reads: the raw read, each reload pass paired with raw read + xxh3 in place, fio's."""
    flip, n, threads = rep % 2 == 1, pt.n, pt.cfg.reload_threads
    dt, found = exists_all(store, pt.keys)
    if found != n:
        raise RuntimeError(f"exists found {found} of {n}")
    pt.ex.append(dt)
    if not flip:
        pt.fio_point("read")
    raw = raw_read(pt.raw_path, n, pt.slot, threads)
    pt.rec("raw_read", raw)
    scattered = None  # the layer-first transfer alone: the in-place reload's own ceiling on this disk
    if "layer_first" in pt.layouts:
        scattered, pt.res["raw_mode"]["layer_first_transfer"] = raw_read_in_place(
            pt.raw_path, n, pt.slot, threads, pt.page, pt.views["layer_first"])
        pt.rec("raw_read_layer_first", scattered)
    for name, layout in pt.layouts.items():
        for vectored in modes[name]:
            key = f"reload_{name}" + {None: "", True: "_vectored", False: "_single"}[vectored]
            pair = [lambda v=pt.views[name]: raw_read_xxh3(pt.raw_path, n, pt.slot, threads, pt.page, v),
                    lambda name=name, layout=layout, vectored=vectored: _reload_pass(pt, store, reads, name, layout,
                                                                                     vectored)]
            got = [f() for f in (pair[::-1] if flip else pair)]
            (xref, pt.res["raw_mode"][name]), t = got[::-1] if flip else got
            pt.rec(f"raw_read_xxh3_{name}", xref)
            pt.rec(key, t)
            pt.res.setdefault(f"{key}_paired", []).append(
                {"cpu_vs_raw_xxh3": t.cpu / xref.cpu, "gbps_vs_raw": raw.wall / t.wall,
                 "gbps_vs_raw_xxh3": xref.wall / t.wall, "gbps": pt.total / t.wall / 1e9,
                 **({"gbps_vs_raw_in_place": scattered.wall / t.wall}
                    if name == "layer_first" and scattered is not None else {})})
    if flip:
        pt.fio_point("read")


def _reload_pass(pt: _Point, store: L3Store, reads, name: str, layout, vectored) -> Timed:
    """Every page reloaded into ``layout`` (layer-first: in read mode ``vectored``, None the default), and the
    pages per transfer of the pass (adjacent slots read together: read_coalesce_bytes)."""
    reads.set_vectored(vectored)
    io0 = reads.io_counters()
    t, hits = reload_all(store, pt.keys, layout)
    reads.set_vectored(None)
    if hits != pt.n:
        raise RuntimeError(f"reload ({name}) hit {hits} of {pt.n}")
    if io0:
        io = {k: v - io0.get(k, 0) for k, v in reads.io_counters().items()}
        pages = io.get("span_reads", 0)
        transfers = pages - io.get("run_pages", 0) + io.get("run_reads", 0)
        if transfers:
            pt.per_transfer[name + {None: "", True: " vectored", False: " single"}[vectored]] = pages / transfers
    return t


def _spot_check(pt: _Point, store: L3Store) -> None:
    """Reloaded bytes are the spilled ones, in both layouts."""
    out = np.empty(pt.page, np.uint8)
    for layout in pt.layouts.values():
        store.reload_into_layout(KIND, pt.keys[:4], layout, [0, 1, 2, 3])
        for j in range(4):
            layout.gather_into(j, out)
            if not np.array_equal(out, pt.src[j % len(pt.src)]):
                raise RuntimeError("reload returned wrong bytes")


def _summary(pt: _Point, st: dict) -> dict:
    """Medians of every timed pass, fio's paired ratios, the store's staging and I/O mode, HiCacheFile's row."""
    res, total, med = pt.res, pt.total, statistics.median
    for name, ts in pt.runs.items():
        res[f"{name}_s"] = [t.wall for t in ts]
        res[f"{name}_cpu_s"] = [t.cpu for t in ts]
        res[f"{name}_gbps"] = total / med(t.wall for t in ts) / 1e9
        res[f"{name}_cpu_s_per_gb"] = med(t.cpu for t in ts) / (total / 1e9)
    _fio_ratios(res, pt.runs, total)
    res.update({
        "exists_us_per_page": med(pt.ex) / pt.n * 1e6, "spill_retries": pt.retries,
        "spill_first_retries": pt.retries_first, "staging_peak_bytes": st["staging_peak_bytes"],
        "staging_cap_bytes": st["staging_cap_bytes"], "io_mode": st["io_mode"][KIND.label],
    })
    if pt.args.skip_hicachefile:
        res["hicache_file"] = "skipped (--skip-hicachefile)"
    else:
        hf, why = hicache_file_rows(pt.root, pt.keys, pt.src, pt.page, pt.args.repeats)
        res["hicache_file"] = why if hf is None else {"write_gbps": total / hf[0] / 1e9,
                                                      "read_gbps": total / hf[1] / 1e9}
    shutil.rmtree(pt.root, ignore_errors=True)
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


def render(results: list[dict], load: "dict | None", args, failed: "list[str] | None" = None) -> str:
    """The table (bench_report.py); each row marked FAIL is also appended to `failed` ("page metric")."""
    return report.render(results, load, args, failed, checksum=checksum_line(), gil_pause_page=GIL_PAUSE_PAGE)


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
