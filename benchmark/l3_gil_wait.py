"""How long another thread of the process waits while reloads run: SGLang's scheduler shares its process (and its GIL)
with HiCache's prefetch thread, which calls the L3 store's reload. A thread sleeps 0.5 ms in a loop and records how
late it wakes (the overshoot: mostly waiting for the GIL); a second thread reloads the same pages over and over with
each ``queues.layer_first_gil_pause`` setting asked for (default "page") and with "off" (the engine's default),
page-first and layer-first host pools, and nothing running as the floor. Sides interleave per round (A B ..., then
backwards); each prints the overshoot's p50 / p99 / max in ms, the reload's GB/s and the process's CPU per GB,
median (min-max) over rounds, and each paused side's p99, GB/s and CPU over the "off" side's of the same round.
Page-first checksums never pause (one call that releases the GIL itself), so page-first's sides run the same code:
their ratios are this disk's and machine's noise.

    python benchmark/l3_gil_wait.py --dir /nvme0/x --page 3274752 --pages 640 --threads 8 --rounds 3 --pauses page 1MiB
Needs numpy, lmdb, xxhash; never torch or SGLang."""
import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import threading
import time

import numpy as np

from sglang_glm_ext.l3.config import parse_gil_pause
from sglang_glm_ext.l3.disk.aligned import AlignedBuffer
from sglang_glm_ext.l3.disk.format import Namespace, slot_bytes_for
from sglang_glm_ext.l3.disk.host_layout import PageLayout
from sglang_glm_ext.l3.engine.store import L3Store
from sglang_glm_ext.l3.tools import bench as B

SLEEP_S = 0.0005


def med(v: list, fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(v))} ({fmt.format(min(v))}-{fmt.format(max(v))})"


def one_side(store, keys, layout, page: int, seconds: float) -> tuple:
    """(p50, p99, max overshoot in ms, reload GB/s, process CPU s per GB reloaded) while ``layout``'s reloads run
    (None: nothing runs; its CPU figure is then per second)."""
    stop, moved = threading.Event(), [0]

    def load():
        while not stop.is_set():
            if layout is None:
                time.sleep(0.01)
                continue
            _, hits = B.reload_all(store, keys, layout)
            moved[0] += hits * page

    th = threading.Thread(target=load, name="prefetch")
    lat = []
    c0 = os.times()
    t0 = time.perf_counter()
    th.start()
    while time.perf_counter() - t0 < seconds:
        s = time.perf_counter()
        time.sleep(SLEEP_S)
        lat.append((time.perf_counter() - s - SLEEP_S) * 1e3)
    stop.set()
    th.join()
    el = time.perf_counter() - t0
    c1 = os.times()
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    lat.sort()
    return (lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))], lat[-1], moved[0] / 1e9 / el,
            cpu / (moved[0] / 1e9) if moved[0] else cpu / el)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--page", type=int, default=1 << 20)
    ap.add_argument("--pages", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=8, help="reload_threads (reads in flight)")
    ap.add_argument("--seconds", type=float, default=3.0, help="per side and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pauses", nargs="+", default=["page"],
                    help='queues.layer_first_gil_pause settings to compare with "off" ("page", a size such as 1MiB)')
    a = ap.parse_args()
    page, n, slot = a.page, max(B.BATCH, a.pages), slot_bytes_for(a.page)
    layers = B.layer_split(page)
    root = os.path.join(a.dir, f"gilwait{page}")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    cfg = B.store_config(root, n, slot, argparse.Namespace(staging_mb=256, batch_pages=32, io_threads=4,
                                                           reload_threads=a.threads))
    rng = np.random.default_rng(page)
    src = [rng.integers(0, 256, page, dtype=np.uint8) for _ in range(16)]
    keys = B._keys(n, f"gilwait{page}")
    host = AlignedBuffer(B.BATCH * page)
    np.frombuffer(host.view, np.uint8).fill(0)
    layouts = {"page_first": PageLayout.page_first(host, page_bytes=page, num_pages=B.BATCH)}
    if layers > 1:
        layouts["layer_first"] = PageLayout.layer_first(host, n_layers=layers, slice_bytes=page // layers,
                                                        num_pages=B.BATCH)
    pauses = ["off"] + [p for p in a.pauses if p != "off"]
    bytes_of = {p: parse_gil_pause(int(p) if p.isdigit() else p) for p in pauses}
    sides = [("idle", None, "off")] + [(f"{name} pause={p}", name, p) for name in layouts for p in pauses]
    ns = Namespace("bench", "bf16", "page_first", 64, 0, 78, "bench")
    res: dict = {}
    try:
        store = L3Store.open(cfg, rank=0, namespace=ns, page_bytes={B.KIND: page})
        try:
            B.spill_all(store, keys, src)
        finally:
            store.close()
        for r in range(a.rounds):
            for label, name, p in sides if r % 2 == 0 else sides[::-1]:
                side_cfg = dataclasses.replace(cfg, cold_start="load", layer_first_gil_pause_bytes=bytes_of[p])
                store = L3Store.open(side_cfg, rank=0, namespace=ns, page_bytes={B.KIND: page})
                try:
                    res.setdefault(label, []).append(one_side(store, keys, layouts.get(name), page, a.seconds))
                finally:
                    store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"page {page} B ({layers} layer chunks), {n} pages, {a.threads} readers, switch interval "
          f"{sys.getswitchinterval() * 1e3:.1f} ms, {a.rounds} rounds of {a.seconds:g} s: a {SLEEP_S * 1e3:g} ms "
          f"sleep's overshoot (ms), the reload's GB/s and the process's CPU s per GB reloaded (idle: per second), "
          f"median (min-max); paused / unpaused: medians of each round's pair")
    print(f"{'side':<28} {'p50 ms':>20} {'p99 ms':>20} {'max ms':>20} {'GB/s':>18} {'CPU s/GB':>20} "
          f"{'p99 ratio':>9} {'GB/s ratio':>10} {'CPU ratio':>9}")
    for label, name, p in sides:
        rows = res[label]
        ratios = ("", "", "")
        if name is not None and p != "off":
            base = res[f"{name} pause=off"]
            ratios = tuple(f"{statistics.median(x[i] / y[i] for x, y in zip(rows, base) if y[i]):.2f}"
                           for i in (1, 3, 4))
        print(f"{label:<28} {med([x[0] for x in rows], '{:.3f}'):>20} {med([x[1] for x in rows], '{:.3f}'):>20} "
              f"{med([x[2] for x in rows]):>20} {med([x[3] for x in rows]):>18} "
              f"{med([x[4] for x in rows], '{:.3f}'):>20} "
              f"{ratios[0]:>9} {ratios[1]:>10} {ratios[2]:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
