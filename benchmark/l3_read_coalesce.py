"""Reloads with adjacent slots read together (``queues.read_coalesce_bytes``) at several sizes, side by side with the
per-page reads (0) and with "raw read + xxh3 in place" (the CPU reference of `sglang-glm-ext l3 bench`), the same
pages, interleaved per round (A B C ..., then backwards): GB/s and process CPU s/GB, median (min-max), and each size's
ratios to 0 and to the reference. Page-first and layer-first host pools, one store per size over the same slab.

    python benchmark/l3_read_coalesce.py --dir /nvme0/x --page 1048576 --pages 2048 --threads 8 --sizes 0 4 8 16
Needs numpy, lmdb, xxhash; never torch or SGLang."""
import argparse
import dataclasses
import os
import shutil
import statistics
import sys

import numpy as np

from sglang_glm_ext.l3.disk.aligned import AlignedBuffer
from sglang_glm_ext.l3.disk.format import Namespace, slot_bytes_for
from sglang_glm_ext.l3.disk.host_layout import PageLayout
from sglang_glm_ext.l3.engine.store import L3Store
from sglang_glm_ext.l3.tools import bench as B


def med(rows: list, i: int) -> str:
    v = [r[i] for r in rows]
    return f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--page", type=int, default=1 << 20)
    ap.add_argument("--pages", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--sizes", type=int, nargs="+", default=[0, 4, 8, 16], help="read_coalesce_bytes, MiB")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    page, n, slot = a.page, max(B.BATCH, a.pages), slot_bytes_for(a.page)
    layers = B.layer_split(page)
    root = os.path.join(a.dir, f"coalesce{page}")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    args = argparse.Namespace(staging_mb=256, batch_pages=32, io_threads=4, reload_threads=a.threads)
    cfg = B.store_config(root, n, slot, args)
    rng = np.random.default_rng(page)
    src = [rng.integers(0, 256, page, dtype=np.uint8) for _ in range(16)]
    keys = B._keys(n, f"coalesce{page}")
    host = AlignedBuffer(B.BATCH * page)
    harr = np.frombuffer(host.view, np.uint8)
    harr.fill(0)
    layouts = {"page_first": PageLayout.page_first(host, page_bytes=page, num_pages=B.BATCH)}
    if layers > 1:
        layouts["layer_first"] = PageLayout.layer_first(host, n_layers=layers, slice_bytes=page // layers,
                                                        num_pages=B.BATCH)
    views = {name: B.page_views(harr, page, layers, name) for name in layouts}
    ns = Namespace("bench", "bf16", "page_first", 64, 0, 78, "bench")
    raw = os.path.join(root, "raw.bin")
    store = L3Store.open(cfg, rank=0, namespace=ns, page_bytes={B.KIND: page})
    try:
        B.spill_all(store, keys, src)
    finally:
        store.close()
    B.raw_write(raw, n, slot, 4, src, page)
    cfgs = {m: dataclasses.replace(cfg, cold_start="load", read_coalesce_bytes=m << 20) for m in a.sizes}
    res: dict = {}
    gb = n * page / 1e9
    try:
        for r in range(a.rounds):
            order = list(a.sizes) + ["ref"]
            for side in order if r % 2 == 0 else order[::-1]:
                if side == "ref":
                    for name in layouts:
                        t, _ = B.raw_read_xxh3(raw, n, slot, a.threads, page, views[name])
                        res.setdefault((name, side), []).append((gb / t.wall, t.cpu / gb))
                    continue
                st = L3Store.open(cfgs[side], rank=0, namespace=ns, page_bytes={B.KIND: page})
                try:
                    for name, layout in layouts.items():
                        t, hits = B.reload_all(st, keys, layout)
                        if hits != n:
                            raise RuntimeError(f"reload hit {hits} of {n}")
                        res.setdefault((name, side), []).append((gb / t.wall, t.cpu / gb))
                finally:
                    st.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"page {page} B, {n} pages, {a.threads} reload threads, {a.rounds} rounds: median (min-max); ratios are "
          f"medians of each round's pair")
    print(f"{'layout':<12} {'coalesce':>9} {'GB/s':>22} {'CPU s/GB':>22} {'GB/s / 0':>9} {'CPU / 0':>8} "
          f"{'GB/s / ref':>10} {'CPU / ref':>9}")
    for name in layouts:
        base, ref = res[(name, a.sizes[0])], res[(name, "ref")]
        for side in list(a.sizes) + ["ref"]:
            rows = res[(name, side)]
            q = [statistics.median(x[i] / y[i] for x, y in zip(rows, other)) for other in (base, ref) for i in (0, 1)]
            label = "raw+xxh3" if side == "ref" else f"{side} MiB"
            print(f"{name:<12} {label:>9} {med(rows, 0):>22} {med(rows, 1):>22} {q[0]:>9.2f} {q[1]:>8.2f} "
                  f"{q[2]:>10.2f} {q[3]:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
