"""Layer-first reloads: the checksum through xxhash's update() (python-xxhash holds the GIL for pieces <= 64 KiB,
so while a layer-first page is checked no reader can issue its next read) vs ctypes calls into the same library
(the GIL released for every chunk), on the store's own reload path, same pages, interleaved rounds; page-first
(one-shot hash, GIL released) beside as the reference. Prints medians (min-max) of GB/s and CPU s/GB per mode.
The choice it informs is written where it is made (sglang_glm_ext/l3/engine/reload.py, above _NOT_BLAMED).

    python benchmark/l3_layer_first_gil.py --dir /nvme0/g --gb 1 --page 1048576 --threads 4 --rounds 3
Needs numpy, lmdb, xxhash >= 4.1.0 (its extension exports the XXH3 streaming functions); never torch."""
import argparse
import ctypes
import hashlib
import json
import os
import resource
import shutil
import statistics
import threading
import time

import numpy as np
import xxhash

from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.disk.aligned import AlignedBuffer
from sglang_glm_ext.l3.disk.format import Namespace, PayloadKind, slot_bytes_for
from sglang_glm_ext.l3.disk.host_layout import PageLayout
from sglang_glm_ext.l3.engine import reload as R
from sglang_glm_ext.l3.engine.store import L3Store

lib = ctypes.CDLL(xxhash._xxhash.__file__)
create = lib.XXH3_createState
create.restype = ctypes.c_void_p
reset = lib.XXH3_64bits_reset
reset.argtypes = [ctypes.c_void_p]
upd = getattr(lib, "XXH3_64bits_update_dispatch", None) or lib.XXH3_64bits_update
upd.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
dig = lib.XXH3_64bits_digest
dig.argtypes = [ctypes.c_void_p]
dig.restype = ctypes.c_uint64
tls = threading.local()
real = R.checksum_views


def nogil(views):
    """checksum_views with the GIL released for every chunk (a page-first page's one view: as the engine does)."""
    if len(views) == 1:
        return real(views)
    st = getattr(tls, "st", None)
    if st is None:
        st = tls.st = create()
    reset(st)
    for v in views:
        upd(st, np.frombuffer(v, np.uint8).ctypes.data, len(v))
    return dig(st)


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/tmp/l3_gil")
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--page", type=int, default=1 << 20, help="page bytes (78 layers if divisible, else 64)")
    ap.add_argument("--threads", type=int, default=4, help="reload_threads (reads in flight)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    page, layers = a.page, (78 if a.page % 78 == 0 else 64)
    slot = slot_bytes_for(page)
    n = max(128, int(a.gb * 1e9) // page) // 128 * 128
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    cfg = L3Config.from_dict({
        "deployment_id": "g", "disks": [{"path": a.dir + "/disk", "budget": (n + 2) * slot}],
        "index": {"path": a.dir + "/index", "map_size": 1 << 30}, "gc": {"start": 1.0, "stop": 0.99},
        "queues": {"staging_bytes": 256 << 20, "max_inflight": 4096, "io_threads": 4, "reload_threads": a.threads}})
    K = PayloadKind.TARGET_KV
    s = L3Store.open(cfg, rank=0, namespace=Namespace("g", "bf16", "page_first", 64, 0, 78, "g"),
                     page_bytes={K: page})
    host = AlignedBuffer(128 * page)
    try:
        rng = np.random.default_rng(0)
        src = [rng.integers(0, 256, page, dtype=np.uint8) for _ in range(16)]
        keys = [hashlib.sha256(f"g{i}".encode()).hexdigest() for i in range(n)]
        i = 0
        while i < n:
            ok = s.spill(K, keys[i:i + 128], [src[(i + j) % 16] for j in range(len(keys[i:i + 128]))])
            i += len(ok) if all(ok) else ok.index(False)
            if not all(ok):
                time.sleep(0.001)  # staging full: the writer drains it
        assert s.flush(600)
        np.frombuffer(host.view, np.uint8).fill(0)
        lay = {"page_first": PageLayout.page_first(host, page_bytes=page, num_pages=128),
               "layer_first": PageLayout.layer_first(host, n_layers=layers, slice_bytes=page // layers,
                                                     num_pages=128)}
        modes = {"page_first": ("page_first", real), "layer_first_update": ("layer_first", real),
                 "layer_first_ctypes": ("layer_first", nogil)}
        res = {m: {"gbps": [], "cpu": []} for m in modes}
        for r in range(a.rounds):
            for m in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
                layout_name, fn = modes[m]
                R.checksum_views = fn
                c0, t0, hits = cpu(), time.perf_counter(), 0
                try:
                    for b in range(0, n, 128):
                        hits += sum(s.reload_into_layout(K, keys[b:b + 128], lay[layout_name], list(range(128))))
                finally:
                    R.checksum_views = real
                dt, dc = time.perf_counter() - t0, cpu() - c0
                if hits != n:
                    raise SystemExit(f"{m}: {hits} of {n} pages hit")
                res[m]["gbps"].append(n * page / dt / 1e9)
                res[m]["cpu"].append(dc / (n * page / 1e9))
        del lay
    finally:
        s.close()
        shutil.rmtree(a.dir, ignore_errors=True)
    print(f"page={page} layers={layers} pages={n} reload_threads={a.threads} helpers={R.hash_helpers(a.threads)} "
          f"rounds={a.rounds} xxhash={xxhash.VERSION} (median (min-max))")
    for m, v in res.items():
        g, c = v["gbps"], v["cpu"]
        print(f"  {m:<20} {statistics.median(g):.3f} ({min(g):.3f}-{max(g):.3f}) GB/s   CPU "
              f"{statistics.median(c):.3f} ({min(c):.3f}-{max(c):.3f}) s/GB")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"page": page, "threads": a.threads, "res": res}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
