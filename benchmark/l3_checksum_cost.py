"""The L3 checksum's own cost: xxh3_64 GB/s on one core against that core's memory bandwidth (issue 28, item 3).

Pinned to one CPU. For GLM-5's 3,274,752 B page and a 1 MiB page, the engine's own checksum functions
(``payload_checksum``: one call over a page-first page; ``checksum_views``: a layer-first page's 78 / 64 chunks,
as a reload hashes them where they landed):

* hot: the same page again and again (it stays in L2 / L3);
* cold: each page-sized piece of a ``--cold-gib`` array (larger than the last-level cache) once per pass -- what a
  reload pays, the page having just come from the disk by DMA;
* memory: a large ``np.copyto`` (bytes copied per second; the DRAM traffic is 2-3x that) and a streaming read
  (1 MiB pieces moved into one cache-hot 1 MiB buffer), on the same core.

Prints the xxhash build and the vector unit XXH3 runs on (``checksum_build``), a table, and ``--json``.

    python benchmark/l3_checksum_cost.py [--cold-gib 2] [--seconds 0.5] [--json out.json]
Needs numpy and xxhash; never torch.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import time

import numpy as np

from sglang_glm_ext.l3.disk.format import checksum_build, checksum_views, payload_checksum

PAGES = {"GLM-5 3,274,752 B": (3_274_752, 78), "1 MiB": (1 << 20, 64)}  # (page bytes, layer-first chunks)


def rate(fn, nbytes: int, seconds: float) -> float:
    fn()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return n * nbytes / dt / 1e9


def chunks(mv: memoryview, layers: int) -> list:
    c = len(mv) // layers
    return [mv[i:i + c] for i in range(0, len(mv), c)]


def best_pass(fns: list, nbytes: int, passes: int = 2) -> float:
    best = 0.0
    for _ in range(passes):
        t0 = time.perf_counter()
        for f in fns:
            f()
        best = max(best, nbytes / (time.perf_counter() - t0) / 1e9)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=0.5, help="per hot measurement")
    ap.add_argument("--cold-gib", type=float, default=2.0, help="array walked for the cold rows (above the LLC)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    cpu = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    out: dict = {"build": checksum_build(), "cpu": cpu, "cold_gib": a.cold_gib, "gbps": {}}
    g = out["gbps"]
    rng = np.random.default_rng(1)
    for name, (size, layers) in PAGES.items():
        mv = memoryview(rng.integers(0, 256, size, dtype=np.uint8))
        views = chunks(mv, layers)
        g[f"hot one-shot, {name}"] = rate(lambda: payload_checksum(mv), size, a.seconds)
        g[f"hot {layers} layer chunks, {name}"] = rate(lambda: checksum_views(views), size, a.seconds)
    big = np.arange(int(a.cold_gib * 2**30) // 8, dtype=np.uint64).view(np.uint8)
    bmv = memoryview(big)
    for name, (size, layers) in PAGES.items():
        pages = [bmv[i * size:(i + 1) * size] for i in range(len(big) // size)]
        total = len(pages) * size
        g[f"cold one-shot, {name}"] = best_pass([lambda v=v: payload_checksum(v) for v in pages], total)
        cviews = [chunks(v, layers) for v in pages]
        g[f"cold {layers} layer chunks, {name}"] = best_pass([lambda c=c: checksum_views(c) for c in cviews], total)
    dst = np.empty_like(big)
    dst.fill(1)
    g["memory: np.copyto, bytes copied"] = best_pass([lambda: np.copyto(dst, big)], len(big))
    dst = None  # the copy's 2nd array: freed before the streaming read
    hot = np.empty(1 << 20, np.uint8)
    hot_addr, base = hot.ctypes.data, big.ctypes.data
    offs = range(0, len(big) - (1 << 20) + 1, 1 << 20)
    g["memory: streaming read (memmove into a hot 1 MiB)"] = best_pass(
        [lambda: [ctypes.memmove(hot_addr, base + o, 1 << 20) for o in offs]], len(offs) * (1 << 20))
    b = out["build"]
    print(f"xxhash {b['version']} (xxHash {b['xxhash_c']}): XXH3 on {b['vector']} ({b['how']}); CPU best "
          f"{b['cpu_best']}; pinned to CPU {cpu}; cold rows walk {a.cold_gib} GiB"
          + (f"\nWARNING: {b['warning']}" if b["warning"] else ""))
    for k, v in g.items():
        print(f"  {k:<50} {v:7.2f} GB/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
