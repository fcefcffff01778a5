"""The L3 bench's references, each beside the store pass it is paired with: raw O_DIRECT writes and reads of the
same slot-sized transfers (``Timed``: wall and process CPU seconds), fio's best points on the same directory, and
SGLang's ``HiCacheFile`` backend. Loaded from beside ``bench.py`` (not as a package module: benchmark/l3_ab.py runs
that file against an older engine); it imports only numpy, xxhash and the engine's aligned buffer."""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import threading
import time

import numpy as np
import xxhash

try:  # the engine's rooms
    from sglang_glm_ext.l3.disk.aligned import AlignedBuffer
except ModuleNotFoundError:  # an engine from before them
    from sglang_glm_ext.l3.aligned import AlignedBuffer

BATCH = 128  # pages per store call and in the host pool (SGLang's STORAGE_BATCH_SIZE)
FIO_THREADS_MAX = 64  # `--reload-threads fio`: at most this many threads, whatever fio needed


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Timed:
    """Wall and process CPU seconds of a block."""

    def __enter__(self):
        self.c0, self.t0 = cpu_seconds(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.t0, cpu_seconds() - self.c0


def touched(bufs: list) -> list:
    """Fault the buffers in before any timing (first-touch page faults are not the read path's cost)."""
    for b in bufs:
        np.frombuffer(b.view, np.uint8).fill(0)
    return bufs


def parallel(n_threads: int, n_items: int, fn) -> None:
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
    bufs = touched([AlignedBuffer(slot) for _ in range(threads)])
    try:
        os.posix_fallocate(fd, 0, n * slot)
        with Timed() as t:
            def one(k, i):
                b = np.frombuffer(bufs[k].view, np.uint8)
                b[:page] = src[i % len(src)]  # the same copy the store does into staging
                os.pwrite(fd, bufs[k].view, i * slot)

            parallel(threads, n, one)
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
    ring = touched([AlignedBuffer(slot) for _ in range(BATCH)])
    try:
        with Timed() as t:
            parallel(threads, n, lambda k, i: os.preadv(fd, [ring[i % BATCH].view], i * slot))
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
    tails = touched([AlignedBuffer(slot - page) for _ in range(threads)] if slot > page else [])
    ring = touched([AlignedBuffer(slot) for _ in range(BATCH)])
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
            parallel(threads, n, one)
        return t, mode[0]
    finally:
        for b in tails + ring:
            b.close()
        os.close(fd)


class FioRef:
    """fio's best O_DIRECT write and random read at one slot size, on the bench's directory (None where fio is
    absent or failed: ``why`` says so), and the best point run again beside each store pass. ``fio``: tools/fio.py,
    as bench.py loaded it."""

    def __init__(self, args, slot: int, root: str, total: int, fio):
        self.args, self.slot, self.root, self.total, self.fio = args, slot, root, total, fio
        self.best: dict = {}
        self.why = ""
        self.path = os.path.join(root, f"fio.{slot}.dat")
        if args.fio_grid == "none":
            self.why = "fio skipped (--fio-grid none)"
            return
        self.exe, how = self.fio.find_fio(args.fio)
        if self.exe is None:
            self.why = how
            return
        kept = [r for r in args.fio_sweeps if r["block_bytes"] == slot]
        for kind in ("write", "read"):
            r = next((x for x in kept if x["kind"] == kind), None)
            if r is None and args.fio_sweeps_path:
                self.why = f"{args.fio_sweeps_path} has no {kind} sweep at {slot} B"
            elif r is None:
                r, why = self.fio.sweep(kind, slot, root, total, args.fio_seconds, grid=args.fio_grid, fio=self.exe,
                                   keep_file=True)
                if r is None:
                    self.why = why
                else:
                    print(self.fio.render(r), flush=True)
            if r is not None:
                self.best[kind] = r
        self.file_bytes = max([self.fio.file_bytes_for(slot, total, [(r["iodepth"], r["numjobs"])])
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
        if kind == "read" and self.fio.lay_out(self.exe, self.path, self.file_bytes):
            return None
        row = self.fio.point(self.exe, kind, self.slot, self.path, self.file_bytes, self.args.fio_seconds, r["engine"],
                        r["iodepth"], r["numjobs"])
        return row if row.get("gbps") and not row.get("error") else None

    def run_fresh(self) -> "dict | None":
        """fio's best write point as ONE pass over a file of the store's data size just preallocated (a first
        fill, like a new slab's: tools/fio.py), in its own file; None where there is no best write point."""
        r = self.best.get("write")
        if r is None:
            return None
        size = max(self.total, r["numjobs"] * self.slot)
        row = self.fio.point(self.exe, "write", self.slot, os.path.join(self.root, f"fio.fresh.{self.slot}.dat"), size,
                        self.args.fio_seconds, r["engine"], r["iodepth"], r["numjobs"], fresh=True)
        return row if row.get("gbps") and not row.get("error") else None


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
