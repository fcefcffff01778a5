#!/usr/bin/env python3
"""L3 store vs the raw disk, in one run, on one disk, with one page set.

For each page size (default GLM-5's 3,274,752 B = 64 tokens x 78 layers x 656 B, and 1 MiB) and a fixed data
size (``--size-gb``, default 2), the median of ``--repeats`` (>= 3) runs of:

* raw O_DIRECT sequential write of the same slot-sized transfers (same thread count as the store's I/O pool),
  one fdatasync at the end                                   -> the reference for spill
* L3 spill -> durable: ``spill`` of every page (retrying pages the bounded staging refused) until ``flush``
  returns, i.e. every page written, fdatasync'ed and committed to the index
* raw O_DIRECT read of the same bytes (same thread count as the store's reload pool) -> the reference for reload
* L3 reload (O_DIRECT, so never the page cache): index lookup + read + header/xxh3 verify + copy into the
  destination page buffer
* batched ``exists`` (128 keys per call, SGLang's STORAGE_BATCH_SIZE), microseconds per page
* peak staging memory vs the configured cap
* SGLang's HiCacheFile on the same pages, if sglang is importable (a reference row: buffered writes + one
  ``os.sync()`` to make them durable; reads after ``posix_fadvise(DONTNEED)`` on every file).

Needs numpy, lmdb, xxhash; never torch or sglang (the HiCacheFile row is skipped with a message without them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import threading
import time

import numpy as np

from sglang_glm_ext.l3.aligned import AlignedBuffer
from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.format import Namespace, PayloadKind, slot_bytes_for
from sglang_glm_ext.l3.store import L3Store

GLM5_PAGE = 64 * 78 * 656  # 3,274,752 B
KIND = PayloadKind.TARGET_KV
BATCH = 128


def _keys(n: int, salt: str) -> list[str]:
    return [hashlib.sha256(f"{salt}:{i}".encode()).hexdigest() for i in range(n)]


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


def raw_write(path: str, n: int, slot: int, threads: int, src: list[np.ndarray], page: int) -> float:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    try:
        os.posix_fallocate(fd, 0, n * slot)
        bufs = [AlignedBuffer(slot) for _ in range(threads)]
        t0 = time.perf_counter()

        def one(t, i):
            b = np.frombuffer(bufs[t].view, np.uint8)
            b[:page] = src[i % len(src)]  # the same copy the store does into staging
            os.pwrite(fd, bufs[t].view, i * slot)

        _parallel(threads, n, one)
        os.fdatasync(fd)
        dt = time.perf_counter() - t0
        for b in bufs:
            b.close()
        return dt
    finally:
        os.close(fd)


def raw_read(path: str, n: int, slot: int, threads: int, dst: np.ndarray, page: int) -> float:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        bufs = [AlignedBuffer(slot) for _ in range(threads)]
        t0 = time.perf_counter()

        def one(t, i):
            os.preadv(fd, [bufs[t].view], i * slot)
            np.copyto(dst[i % len(dst)], np.frombuffer(bufs[t].view, np.uint8)[:page])  # same copy reload does

        _parallel(threads, n, one)
        dt = time.perf_counter() - t0
        for b in bufs:
            b.close()
        return dt
    finally:
        os.close(fd)


def store_config(root: str, n: int, slot: int, args) -> L3Config:
    return L3Config.from_dict({
        "deployment_id": "bench",
        "cold_start": "clear",
        "direct_io": "auto",
        "disks": [{"path": os.path.join(root, "disk"), "budget": (n + 2) * slot}],
        "index": {"path": os.path.join(root, "index"), "map_size": 256 * 2**20},
        # The bench measures the write path, not GC: the pool never crosses the start watermark.
        "gc": {"start": 1.0, "stop": 0.99},
        "queues": {"staging_bytes": args.staging_mb * 2**20, "max_inflight": 4096,
                   "write_batch_pages": args.batch_pages, "io_threads": args.io_threads,
                   "reload_threads": args.reload_threads},
    })


def spill_all(store: L3Store, keys: list[str], src: list[np.ndarray]) -> tuple[float, int]:
    """Spill every page (retrying what staging refused: that is the backpressure) and wait until durable."""
    n = len(keys)
    retries = 0
    t0 = time.perf_counter()
    i = 0
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
    dt = time.perf_counter() - t0
    if not ok:
        raise RuntimeError("flush timed out")
    return dt, retries


def reload_all(store: L3Store, keys: list[str], dst: np.ndarray) -> tuple[float, int]:
    n = len(keys)
    hits = 0
    per = len(dst)
    t0 = time.perf_counter()
    for i in range(0, n, per):
        ks = keys[i:i + per]
        hits += sum(store.reload_into(KIND, ks, [dst[j] for j in range(len(ks))]))
    return time.perf_counter() - t0, hits


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


def bench_page_size(page: int, args) -> dict:
    slot = slot_bytes_for(page)
    n = max(BATCH, int(args.size_gb * 1e9) // page)
    root = os.path.join(args.dir, f"p{page}")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root, mode=0o700)
    rng = np.random.default_rng(page)
    src = [rng.integers(0, 256, page, dtype=np.uint8) for _ in range(16)]
    dst = np.empty((BATCH, page), dtype=np.uint8)  # reload in SGLang-sized calls (128 pages)
    keys = _keys(n, f"bench{page}")
    total = n * page
    res = {"page_bytes": page, "slot_bytes": slot, "pages": n, "bytes": total}

    raw_path = os.path.join(root, "raw.bin")
    cfg = store_config(root, n, slot, args)
    ns = Namespace("bench", "bf16", "page_first", 64, 0, 78, "bench")
    rw, rr, sw, sr, ex, retries = [], [], [], [], [], []
    store = L3Store.open(cfg, rank=0, namespace=ns, page_bytes={KIND: page})
    try:
        def raw_round():
            if os.path.exists(raw_path):
                os.unlink(raw_path)
            rw.append(raw_write(raw_path, n, slot, args.io_threads, src, page))
            rr.append(raw_read(raw_path, n, slot, args.reload_threads, dst, page))

        def store_round(rep):
            if rep:
                store.clear()
            dt, rt = spill_all(store, keys, src)
            sw.append(dt)
            retries.append(rt)
            dt, found = exists_all(store, keys)
            if found != n:
                raise RuntimeError(f"exists found {found} of {n}")
            ex.append(dt)
            dt, hits = reload_all(store, keys, dst)
            if hits != n:
                raise RuntimeError(f"reload hit {hits} of {n}")
            sr.append(dt)

        # Raw and store runs alternate A-B, B-A across repeats, so a (virtual) disk whose speed drifts during the
        # run biases neither side: on a shared virtio disk the raw rate alone moved 2x between back-to-back runs.
        for rep in range(args.repeats):
            if rep % 2 == 0:
                raw_round()
                store_round(rep)
            else:
                store_round(rep)
                raw_round()
        # Spot check: reloaded bytes are the spilled ones.
        store.reload_into(KIND, keys[:4], [dst[j] for j in range(4)])
        for j in range(4):
            if not np.array_equal(dst[j], src[j % len(src)]):
                raise RuntimeError("reload returned wrong bytes")
        st = store.stats()
    finally:
        store.close()
        if os.path.exists(raw_path):
            os.unlink(raw_path)

    med = statistics.median
    res.update({
        "raw_write_gbps": total / med(rw) / 1e9, "spill_gbps": total / med(sw) / 1e9,
        "raw_read_gbps": total / med(rr) / 1e9, "reload_gbps": total / med(sr) / 1e9,
        "exists_us_per_page": med(ex) / n * 1e6,
        "staging_peak_bytes": st["staging_peak_bytes"], "staging_cap_bytes": st["staging_cap_bytes"],
        "spill_retries": retries, "io_mode": st["io_mode"][KIND.label],
        "raw_write_s": rw, "spill_s": sw, "raw_read_s": rr, "reload_s": sr,
    })
    if args.skip_hicachefile:
        res["hicache_file"] = "skipped (--skip-hicachefile)"
    else:
        hf, why = hicache_file_rows(root, keys, src, page, args.repeats)
        res["hicache_file"] = why if hf is None else {"write_gbps": total / hf[0] / 1e9,
                                                      "read_gbps": total / hf[1] / 1e9}
    shutil.rmtree(root, ignore_errors=True)
    return res


def render(results: list[dict], args) -> str:
    lines = [f"L3 bench: dir={args.dir} size={args.size_gb} GB/page-size repeats={args.repeats} "
             f"io_threads={args.io_threads} reload_threads={args.reload_threads} batch={args.batch_pages} "
             f"(median of repeats)",
             f"{'page':>9} | {'metric':<34} | {'L3':>10} | {'reference':>10} | {'ratio':>6} | {'target':>7} | ok",
             "-" * 98]

    def row(page, metric, a, b, ratio, target, ok):
        lines.append(f"{page:>9} | {metric:<34} | {a:>10} | {b:>10} | {ratio:>6} | {target:>7} | {ok}")

    for r in results:
        p = r["page_bytes"]
        q = r["spill_gbps"] / r["raw_write_gbps"]
        row(p, "spill->durable vs raw O_DIRECT write", f"{r['spill_gbps']:.2f}GB/s", f"{r['raw_write_gbps']:.2f}GB/s",
            f"{q:.2f}x", ">=0.8x", "PASS" if q >= 0.8 else "FAIL")
        q = r["reload_gbps"] / r["raw_read_gbps"]
        row(p, "reload (O_DIRECT) vs raw O_DIRECT read", f"{r['reload_gbps']:.2f}GB/s", f"{r['raw_read_gbps']:.2f}GB/s",
            f"{q:.2f}x", ">=0.9x", "PASS" if q >= 0.9 else "FAIL")
        e = r["exists_us_per_page"]
        row(p, "batched exists (128/call)", f"{e:.2f}us/pg", "-", "-", "<=20us", "PASS" if e <= 20 else "FAIL")
        q = r["staging_peak_bytes"] / r["staging_cap_bytes"]
        row(p, "peak staging vs cap", f"{r['staging_peak_bytes'] / 2**20:.0f}MiB",
            f"{r['staging_cap_bytes'] / 2**20:.0f}MiB", f"{q:.2f}x", "<=1.0x", "PASS" if q <= 1.0 else "FAIL")
        hf = r["hicache_file"]
        if isinstance(hf, dict):
            row(p, "HiCacheFile write+os.sync (ref)", f"{r['spill_gbps']:.2f}GB/s", f"{hf['write_gbps']:.2f}GB/s",
                f"{r['spill_gbps'] / hf['write_gbps']:.2f}x", "info", "L3/HiCacheFile")
            row(p, "HiCacheFile read, DONTNEED (ref)", f"{r['reload_gbps']:.2f}GB/s", f"{hf['read_gbps']:.2f}GB/s",
                f"{r['reload_gbps'] / hf['read_gbps']:.2f}x", "info", "L3/HiCacheFile")
        else:
            lines.append(f"{p:>9} | {hf}")
        lines.append(f"{'':>9} | io_mode={r['io_mode']} pages={r['pages']} spill retries (staging full)="
                     f"{r['spill_retries']}")
    return "\n".join(lines)


def add_arguments(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The bench's options; `sglang-glm-ext l3 bench` adds the same ones to its subcommand."""
    ap.add_argument("--dir", default="/tmp/l3_bench", help="directory on the disk under test")
    ap.add_argument("--size-gb", type=float, default=2.0, help="data per page size (GB); >= 2 for the record")
    ap.add_argument("--page-bytes", type=int, nargs="+", default=[GLM5_PAGE, 2**20])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--io-threads", type=int, default=4)
    ap.add_argument("--reload-threads", type=int, default=4)
    ap.add_argument("--batch-pages", type=int, default=32)
    ap.add_argument("--staging-mb", type=int, default=256)
    ap.add_argument("--skip-hicachefile", action="store_true")
    ap.add_argument("--json", metavar="PATH", help="also write the raw results as JSON")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = add_arguments(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    args = ap.parse_args(argv)
    return run(args)


def run(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    os.makedirs(args.dir, exist_ok=True)
    results = [bench_page_size(p, args) for p in args.page_bytes]
    print(render(results, args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
