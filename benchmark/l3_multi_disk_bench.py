#!/usr/bin/env python3
"""L3 spill / reload of one rank: its slabs on N drives (``ranks.mapping = "all"``) vs one, side by side.

One store (rank 0), 1 MiB pages by default. Each round spills fresh pages (``spill(wait=...)``: staging never drops
one) until ``flush()`` says every page is durable, then reloads them all (``reload_into``, 64 pages a call) and
checks every byte. The configs alternate A-B / B-A each round, each in its own directories, cleared in between.
Printed per config: spill and reload GB/s (median of the rounds, with the range), CPU seconds per GB, pages per
drive; then the ratios N drives / 1 drive.

A third row shows a slow drive's cost: the N-drive store with one drive slowed by ``--slow-ms`` per slab write (an
injected delay, ``DiskSlab.inject_write_fault``), against the same store with none slowed: spill GB/s, and the
share of the pages that still went to the slow drive (the rest it shed to the others).

``--dir`` puts every "drive" in a directory under it: on one device (the dev VM, one virtio disk) N directories
share the device, so the N-drive spill and reload cannot be faster than one: the ratio then measures what the
spreading costs (N committers, N fdatasyncs per round instead of one). ``--disk-dirs /nvme0,/nvme1,...`` puts drive
i on its own mount: there the ratio is what several drives per rank buy.

Run: PYTHONPATH=. python benchmark/l3_multi_disk_bench.py --dir /tmp/mdb --drives 3 --size-mb 512 --rounds 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sglang_glm_ext.l3.config import L3Config  # noqa: E402
from sglang_glm_ext.l3.disk.format import Namespace, PayloadKind, slot_bytes_for  # noqa: E402
from sglang_glm_ext.l3.engine.store import L3Store  # noqa: E402

K = PayloadKind.TARGET_KV
NS = Namespace("bench", "fp8", "page_first", 64, 0, 1, "replicated")
CALL = 64  # pages per spill / reload call (SGLang's batches are of this order)


def _config(roots: list[str], index: str, budget: int, all_disks: bool) -> L3Config:
    return L3Config.from_dict({
        "deployment_id": "mdbench", "cold_start": "clear",
        "disks": [{"path": r, "budget": budget} for r in roots],
        "ranks": {"mapping": "all" if all_disks else [0]},
        "index": {"path": index, "map_size": "1GiB"},
        "queues": {"staging_bytes": "256MiB", "max_inflight": 1024, "write_batch_pages": 32, "io_threads": 4,
                   "reload_threads": 4},
    })


def _pages(n: int, pb: int, salt: str):
    keys = [hashlib.sha256(f"{salt}:{i}".encode()).hexdigest() for i in range(n)]
    base = np.frombuffer(hashlib.shake_256(salt.encode()).digest(pb), np.uint8)
    pages = []
    for i in range(n):
        p = base.copy()
        p[:8] = np.frombuffer(i.to_bytes(8, "little"), np.uint8)  # each page distinct, cheap to make
        pages.append(p)
    return keys, pages


def _run(cfg: L3Config, n: int, pb: int, salt: str, slow_s: float = 0.0) -> dict:
    s = L3Store.open(cfg, rank=0, namespace=NS, page_bytes={K: pb})
    try:
        if slow_s:
            def slow(fd, data, offset):
                time.sleep(slow_s)
                return os.pwrite(fd, data, offset)
            s.slab(K, disk=cfg.disks_for_rank(0)[-1]).inject_write_fault(slow)
        keys, pages = _pages(n, pb, salt)
        c0, t0, wall0 = time.process_time(), time.perf_counter(), time.time()
        for i in range(0, n, CALL):
            ok = s.spill(K, keys[i:i + CALL], pages[i:i + CALL], wait=120)
            assert all(ok), "spill dropped a page"
        assert s.flush(600), "flush timed out"
        spill_s, spill_cpu = time.perf_counter() - t0, time.process_time() - c0
        st = s.stats()
        assert st["spilled"] == n and st["write_errors"] == 0, st
        per_disk = {d: row["pages"] for d, row in st["per_disk"].items()}
        # An entry's last_access is its commit time until a reload touches it: when each drive's last page was
        # durable, so the other drives' rate can be told apart from the slow one's drain.
        entries = s.index.get_many([s.diagnostics().index_key(K, k) for k in keys])
        done = {}
        for e in entries:
            done[e.disk] = max(done.get(e.disk, 0.0), e.last_access / 1e6 - wall0)
        dst = [np.empty(pb, np.uint8) for _ in range(CALL)]
        c0, t0 = time.process_time(), time.perf_counter()
        bad = 0
        for i in range(0, n, CALL):
            ks = keys[i:i + CALL]
            ok = s.reload_into(K, ks, dst[:len(ks)])
            bad += len(ks) - sum(ok)
            bad += sum(1 for j, d in enumerate(dst[:len(ks)]) if not np.array_equal(d, pages[i + j]))
        reload_s, reload_cpu = time.perf_counter() - t0, time.process_time() - c0
        assert bad == 0, f"{bad} pages did not reload byte-exact"
        gb = n * pb / 1e9
        return {"spill_gbs": gb / spill_s, "reload_gbs": gb / reload_s, "spill_cpu_s_per_gb": spill_cpu / gb,
                "reload_cpu_s_per_gb": reload_cpu / gb, "per_disk": per_disk,
                "durable_s_by_disk": done, "slow_disk": cfg.disks_for_rank(0)[-1] if slow_s else None}
    finally:
        s.close()


def _med(rows: list[dict], k: str) -> tuple[float, float, float]:
    v = [r[k] for r in rows]
    return statistics.median(v), min(v), max(v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/tmp/l3_multi_disk_bench", help="every drive a directory under it")
    ap.add_argument("--disk-dirs", default="", help="comma-separated mounts, one per drive (overrides --drives)")
    ap.add_argument("--drives", type=int, default=3)
    ap.add_argument("--size-mb", type=int, default=512, help="payload MB spilled and reloaded per run")
    ap.add_argument("--page-kib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--slow-ms", type=float, default=100.0, help="the slow-drive row's delay per slab write (0: skip)")
    ap.add_argument("--json", default="", help="also write the results here")
    args = ap.parse_args(argv)

    pb = args.page_kib * 1024
    n = max(CALL, args.size_mb * 10**6 // pb)
    mounts = [m for m in args.disk_dirs.split(",") if m] or [os.path.join(args.dir, f"drive{i}")
                                                              for i in range(args.drives)]
    base = os.path.join(args.dir, "work")
    budget = 2 * n * slot_bytes_for(pb)  # every run fits on each drive alone: no GC in the measurement

    def cfg(name: str, drives: list[str]) -> L3Config:
        roots = [os.path.join(m, "mdbench", name) for m in drives]
        for r in roots:
            shutil.rmtree(r, ignore_errors=True)
        idx = os.path.join(base, name, "index")
        shutil.rmtree(idx, ignore_errors=True)
        return _config(roots, idx, budget, all_disks=len(drives) > 1)

    configs = {"1 drive": [mounts[0]], f"{len(mounts)} drives": mounts}
    results: dict[str, list[dict]] = {k: [] for k in configs}
    slow: dict[str, list[dict]] = {"none slowed": [], f"one slowed {args.slow_ms:g} ms/write": []}
    for r in range(args.rounds):
        order = list(configs) if r % 2 == 0 else list(reversed(configs))
        for name in order:
            results[name].append(_run(cfg(name.replace(" ", "_"), configs[name]), n, pb, f"{name}{r}"))
        if args.slow_ms and len(mounts) > 1:
            order = list(slow) if r % 2 == 0 else list(reversed(slow))
            for name in order:
                delay = args.slow_ms / 1000 if name != "none slowed" else 0.0
                slow[name].append(_run(cfg("slow", mounts), n, pb, f"s{name}{r}", slow_s=delay))

    print(f"L3 one rank, {pb} B pages, {n} pages ({n * pb / 1e9:.2f} GB) per run, {args.rounds} rounds A-B/B-A; "
          f"drives: {', '.join(mounts)}")
    print(f"{'config':<28} {'spill GB/s (range)':>22} {'reload GB/s (range)':>22} {'spill CPU s/GB':>15} "
          f"{'reload CPU s/GB':>16}  pages per drive (last round)")
    for name, rows in {**results, **({k: v for k, v in slow.items() if v})}.items():
        sp, rl = _med(rows, "spill_gbs"), _med(rows, "reload_gbs")
        print(f"{name:<28} {sp[0]:>8.2f} ({sp[1]:.2f}-{sp[2]:.2f}) {rl[0]:>10.2f} ({rl[1]:.2f}-{rl[2]:.2f}) "
              f"{_med(rows, 'spill_cpu_s_per_gb')[0]:>15.3f} {_med(rows, 'reload_cpu_s_per_gb')[0]:>16.3f}  "
              f"{rows[-1]['per_disk']}")
    one, many = results["1 drive"], results[f"{len(mounts)} drives"]
    print(f"ratio {len(mounts)} drives / 1 drive: spill {_med(many, 'spill_gbs')[0] / _med(one, 'spill_gbs')[0]:.2f}x, "
          f"reload {_med(many, 'reload_gbs')[0] / _med(one, 'reload_gbs')[0]:.2f}x"
          + ("  (directories of one device: the device's limit is the same; a ratio above 1 is the store's own "
             "concurrency, N committers and I/O pools, not more bandwidth)" if not args.disk_dirs else ""))
    if all(slow.values()) and len(mounts) > 1:
        a, b = slow["none slowed"], slow[f"one slowed {args.slow_ms:g} ms/write"]
        for r in b:  # the other drives' pages: bytes over the time their last page was durable
            others = [d for d in r["per_disk"] if d != r["slow_disk"]]
            r["others_gbs"] = sum(r["per_disk"][d] for d in others) * pb / 1e9 / max(
                r["durable_s_by_disk"].get(d, 0.0) for d in others)
        last = b[-1]["per_disk"]
        share = last[b[-1]["slow_disk"]] / max(1, sum(last.values()))
        print(f"one drive slowed: the other drives' pages durable at {_med(b, 'others_gbs')[0]:.2f} GB/s = "
              f"{_med(b, 'others_gbs')[0] / _med(a, 'spill_gbs')[0]:.2f}x of every page with none slowed; the whole "
              f"spill incl. the slow drive's backlog {_med(b, 'spill_gbs')[0] / _med(a, 'spill_gbs')[0]:.2f}x; the "
              f"slow drive took {share:.1%} of the pages (its even share {1 / len(mounts):.1%})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"pages": n, "page_bytes": pb, "drives": mounts, "results": results, "slow": slow}, f,
                      indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
