"""Where a reload's time and CPU go, against the reads it cannot avoid (issue 28: 1 MiB reloads above 1.2x the CPU of
"raw read + xxh3 in place", layer-first reloads below 0.95x of the bench's raw read).

Part A, the transfer alone (no store), T threads, the same file of slots, modes interleaved per round:
  one          each slot in one O_DIRECT read into a ring of slot-sized buffers (the bench's raw read)
  vec_layer    the page's layer chunks where a layer-first pool keeps them + a tail buffer (the store's read)
  vec_adjacent as many iovecs, but adjacent in one page-sized buffer (the iovec count without the scatter)
  single_copy  one read into a bounce buffer, then one strided copy into the layer chunks (numpy, GIL released)
and each of vec_layer / single_copy again with the checksum (xxh3 per chunk / one-shot over the bounce buffer).
Part B, the store's reload of the same pages (page-first and layer-first) beside "raw read + xxh3 in place", with
every thread's CPU (its CPU-time clock) summed by role: the caller, the readers, the hash helpers, the writer,
the rest.

    python benchmark/l3_reload_cpu.py --dir /nvme0/x --gb 1 --page 1048576 --threads 8 --rounds 3 [--json F]
Needs numpy, lmdb, xxhash; never torch or SGLang."""
import argparse
import json
import os
import shutil
import statistics
import sys
import threading
import time

import numpy as np
import xxhash

from sglang_glm_ext.l3.disk.aligned import AlignedBuffer
from sglang_glm_ext.l3.disk.format import Namespace, slot_bytes_for
from sglang_glm_ext.l3.disk.host_layout import PageLayout
from sglang_glm_ext.l3.engine.store import L3Store
from sglang_glm_ext.l3.tools import bench as B


def thread_cpu() -> dict:
    """CPU seconds of every live Python thread of this process (its CPU-time clock, ns resolution), by name."""
    out = {}
    for t in threading.enumerate():
        try:
            out[t.name] = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, TypeError, AttributeError):  # a thread that ended in between
            pass
    return out


def role(name: str) -> str:
    for prefix, r in (("l3-rd", "readers"), ("l3-xxh", "hash helpers"), ("MainThread", "caller"),
                      ("l3-writer", "writer"), ("l3-io", "io"), ("l3-commit", "committer")):
        if name.startswith(prefix):
            return r
    return "other"


def by_role(before: dict, after: dict) -> dict:
    out: dict = {}
    for name, c in after.items():
        r = role(name)
        out[r] = out.get(r, 0.0) + c - before.get(name, 0.0)
    return out


def part_a(path: str, n: int, slot: int, page: int, layers: int, threads: int, rounds: int) -> dict:
    chunk = page // layers
    ring = B._touched([AlignedBuffer(slot) for _ in range(B.BATCH)])
    host = AlignedBuffer(B.BATCH * page)
    harr = np.frombuffer(host.view, np.uint8)
    harr.fill(0)
    chunks = harr.reshape(layers, B.BATCH, chunk)
    tails = B._touched([AlignedBuffer(slot - page) for _ in range(threads)])
    adj = B._touched([AlignedBuffer(page) for _ in range(B.BATCH)])
    layer_views = [[memoryview(chunks[l, p]) for l in range(layers)] for p in range(B.BATCH)]
    adj_views = [[adj[p].view[l * chunk:(l + 1) * chunk] for l in range(layers)] for p in range(B.BATCH)]
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)

    def one(k, i):
        os.preadv(fd, [ring[i % B.BATCH].view], i * slot)

    def vec(views, hashed):
        def f(k, i):
            v = views[i % B.BATCH]
            os.preadv(fd, v + [tails[k].view], i * slot)
            if hashed:
                h = xxhash.xxh3_64()
                for c in v:
                    h.update(c)
                h.intdigest()
        return f

    def single_copy(hashed):
        def f(k, i):
            p = i % B.BATCH
            b = ring[p].view
            os.preadv(fd, [b], i * slot)
            src = np.frombuffer(b, np.uint8, count=page).reshape(layers, chunk)
            if hashed:
                xxhash.xxh3_64_intdigest(b[:page])
            np.copyto(chunks[:, p, :], src)
        return f

    modes = {"one": one, "vec_layer": vec(layer_views, False), "vec_adjacent": vec(adj_views, False),
             "single_copy": single_copy(False), "vec_layer+xxh3": vec(layer_views, True),
             "single_copy+xxh3": single_copy(True)}
    res: dict = {m: [] for m in modes}
    try:
        for r in range(rounds):
            order = list(modes) if r % 2 == 0 else list(modes)[::-1]
            for m in order:
                with B.Timed() as t:
                    B._parallel(threads, n, modes[m])
                res[m].append({"gbps": n * page / t.wall / 1e9, "cpu_s_per_gb": t.cpu / (n * page / 1e9)})
    finally:
        os.close(fd)  # the buffers go with the process (views of them are still alive here)
    return res


def part_b(root: str, n: int, page: int, layers: int, threads: int, rounds: int) -> dict:
    slot = slot_bytes_for(page)
    args = argparse.Namespace(staging_mb=256, batch_pages=32, io_threads=4, reload_threads=threads)
    cfg = B.store_config(root, n, slot, args)
    rng = np.random.default_rng(page)
    src = [rng.integers(0, 256, page, dtype=np.uint8) for _ in range(16)]
    keys = B._keys(n, f"cpu{page}")
    host = AlignedBuffer(B.BATCH * page)
    harr = np.frombuffer(host.view, np.uint8)
    harr.fill(0)
    layouts = {"page_first": PageLayout.page_first(host, page_bytes=page, num_pages=B.BATCH),
               "layer_first": PageLayout.layer_first(host, n_layers=layers, slice_bytes=page // layers,
                                                     num_pages=B.BATCH)}
    views = {name: B.page_views(harr, page, layers, name) for name in layouts}
    ns = Namespace("bench", "bf16", "page_first", 64, 0, 78, "bench")
    store = L3Store.open(cfg, rank=0, namespace=ns, page_bytes={B.KIND: page})
    raw_path = os.path.join(root, "raw.bin")
    res: dict = {}
    try:
        B.spill_all(store, keys, src)
        B.raw_write(raw_path, n, slot, 4, src, page)
        gb = n * page / 1e9
        for r in range(rounds):
            for name, layout in layouts.items():
                pair = ["ref", "store"] if r % 2 == 0 else ["store", "ref"]
                for side in pair:
                    c0 = thread_cpu()
                    if side == "ref":
                        t, _ = B.raw_read_xxh3(raw_path, n, slot, threads, page, views[name])
                    else:
                        t, hits = B.reload_all(store, keys, layout)
                        if hits != n:
                            raise RuntimeError(f"reload hit {hits} of {n}")
                    # The reference's threads are gone by now (their CPU is in the total only).
                    roles = {k: v / gb for k, v in by_role(c0, thread_cpu()).items() if v > 0} if side == "store" \
                        else {}
                    res.setdefault(f"{name}/{side}", []).append(
                        {"gbps": gb / t.wall, "cpu_s_per_gb": t.cpu / gb, "roles_s_per_gb": roles})
    finally:
        store.close()
    return res


def med(rows: list, key: str) -> str:
    v = [r[key] for r in rows]
    return f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--page", type=int, default=1 << 20)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-store", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    page, slot = a.page, slot_bytes_for(a.page)
    layers = B.layer_split(page)
    if layers == 1:
        sys.exit(f"a {page} B page has no layer split here (78 or 64 layers)")
    n = max(B.BATCH, int(a.gb * 1e9) // page)
    root = os.path.join(a.dir, f"p{page}")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    out = {"page": page, "slot": slot, "layers": layers, "threads": a.threads, "pages": n}
    try:
        path = os.path.join(root, "a.bin")
        rng = np.random.default_rng(1)
        B.raw_write(path, n, slot, 4, [rng.integers(0, 256, page, dtype=np.uint8) for _ in range(4)], page)
        out["a"] = part_a(path, n, slot, page, layers, a.threads, a.rounds)
        os.unlink(path)
        print(f"page {page} B ({layers} x {page // layers} B), {n} slots of {slot} B, {a.threads} threads, "
              f"{a.rounds} rounds: median (min-max)")
        print(f"{'transfer mode':<20} {'GB/s':>22} {'CPU s/GB':>22}")
        for m, rows in out["a"].items():
            print(f"{m:<20} {med(rows, 'gbps'):>22} {med(rows, 'cpu_s_per_gb'):>22}")
        if not a.skip_store:
            out["b"] = part_b(root, n, page, layers, a.threads, a.rounds)
            print(f"\n{'store vs reference':<20} {'GB/s':>22} {'CPU s/GB':>22}  CPU s/GB by thread role (median)")
            for k, rows in out["b"].items():
                rl = sorted({r for row in rows for r in row["roles_s_per_gb"]})
                roles = ", ".join(f"{r} {statistics.median(row['roles_s_per_gb'].get(r, 0) for row in rows):.3f}"
                                  for r in rl)
                print(f"{k:<20} {med(rows, 'gbps'):>22} {med(rows, 'cpu_s_per_gb'):>22}  {roles}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
