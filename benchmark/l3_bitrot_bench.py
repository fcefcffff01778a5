#!/usr/bin/env python3
"""Issue 24, item 2: what proving the index before it is mapped costs a ``cold_start = "load"`` open. Target: at most
2x today's load time.

For each N: a store whose slab has 2N 4 KiB slots (3,968 B pages), its index filled directly with N entries of this
rank (a load reads the index alone: no slab byte is read, so the slab stays empty). Then each open in a fresh
process (warm page cache: the runs follow each other), interleaved so a shared machine's drift hits all alike, x
``--repeats``:

* ``today``: ``L3Store.open(cold_start="load")`` with the guard off (test/bench-only switch
  ``engine/index.py _UNGUARDED_FOR_TESTS``: the open before issue 24);
* ``fast``: the same open with the guard, ``index.check = "fast"`` (the default; the node's first opener checks);
* ``full``: ``index.check = "full"`` (plus ``lmdb.verify`` in a child beside the walk);
* the same three over an empty index (what any open costs).

Each open reports wall seconds and CPU seconds (the process's own and its waited children's: the verifier child
counted). Printed: medians, and the ratios guarded / today of the whole open (wall and CPU). Then the guard's parts in
this process (medians): the fast check, the full check, and on the damaged path the salvage walk and the rebuild.

Run: PYTHONPATH=. python benchmark/l3_bitrot_bench.py --dir /tmp/bitrot_bench --entries 100000 1000000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

PB = 4096 - 128
TARGET = 2.0
MODES = ("today", "fast", "full")


def _cfg(root: str, n: int, check: str = "fast"):
    from sglang_glm_ext.l3.config import L3Config
    return L3Config.from_dict({
        "deployment_id": "bench", "disks": [{"path": os.path.join(root, "disk"), "budget": 2 * n * 4096}],
        "index": {"path": os.path.join(root, "index"), "map_size": 2**32, "check": check},
        "gc": {"start": 0.9, "stop": 0.8}})


def _ns():
    from sglang_glm_ext.l3.disk.format import Namespace
    return Namespace("bench", "bf16", "page_first", 64, 0, 78, "bench")


def build(root: str, n: int, fill: bool = True) -> None:
    from sglang_glm_ext.l3.disk.format import PayloadKind
    from sglang_glm_ext.l3.engine.index import IndexEntry
    from sglang_glm_ext.l3.engine.store import L3Store
    shutil.rmtree(root, ignore_errors=True)
    s = L3Store.open(_cfg(root, n), rank=0, namespace=_ns(), page_bytes={PayloadKind.TARGET_KV: PB},
                     cold_start="clear")
    try:
        if fill:
            ikey, disk = s.diagnostics().index_key, s.disk
            for b in range(0, n, 20000):
                items = [(ikey(PayloadKind.TARGET_KV, i.to_bytes(32, "big")), IndexEntry(0, disk, i, 10**15 + i))
                         for i in range(b, min(n, b + 20000))]
                assert s.index.commit_puts(items) == [None] * len(items)
    finally:
        s.close()


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def child_open(root: str, n: int, mode: str) -> None:
    from sglang_glm_ext.l3.disk.format import PayloadKind
    from sglang_glm_ext.l3.engine import index as index_mod
    from sglang_glm_ext.l3.engine.store import L3Store
    index_mod._UNGUARDED_FOR_TESTS = mode == "today"  # bench-only: the open before issue 24, as the baseline
    cfg = _cfg(root, n, "fast" if mode == "today" else mode)
    t0, c0, k0 = time.perf_counter(), time.process_time(), _cpu_children()
    s = L3Store.open(cfg, rank=0, namespace=_ns(), page_bytes={PayloadKind.TARGET_KV: PB}, cold_start="load")
    dt = time.perf_counter() - t0
    dc = time.process_time() - c0 + _cpu_children() - k0
    out = {"open_s": dt, "open_cpu_s": dc, "loaded": s.loaded_pages, "check": s.stats()["index_check"]}
    s.close()
    print(json.dumps(out))


def timed_open(root: str, n: int, mode: str) -> dict:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, os.path.abspath(__file__), "--child-open", root, "--mode", mode,
                          "--entries", str(n)], capture_output=True, text=True, env=env, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def parts(root: str) -> dict:
    """The guard's parts in this process: wall (``*_s``) and CPU (``*_cpu``, this process and its children)."""
    from sglang_glm_ext.l3.engine import index_check as ic
    idx = os.path.join(root, "index")
    out = {}

    def timed(name, fn):
        t, c = time.perf_counter(), time.process_time() + _cpu_children()
        r = fn()
        out[name + "_s"] = time.perf_counter() - t
        out[name + "_cpu"] = time.process_time() + _cpu_children() - c
        return r

    for m in ("fast", "full"):
        ok, problems = timed(f"check_{m}", lambda: ic.check_index(idx, m))
        assert ok, problems[:3]
    recs, info = timed("salvage_walk", lambda: ic.salvage_records(os.path.join(idx, "data.mdb")))
    assert len(recs) == info["claimed"], info
    tmp = os.path.join(root, "rebuilt")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    with open(os.path.join(tmp, "data.mdb"), "wb") as f:
        f.write(b"damaged")
    timed("rebuild", lambda: ic.rebuild_index(tmp, recs, 2**32, os.path.join(tmp, "aside")))
    out["data_mdb_bytes"] = os.path.getsize(os.path.join(idx, "data.mdb"))
    out["rebuilt_bytes"] = os.path.getsize(os.path.join(tmp, "data.mdb"))
    shutil.rmtree(tmp)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/tmp/bitrot_bench", help="work directory (created, emptied per N)")
    ap.add_argument("--entries", type=int, nargs="+", default=[100000, 1000000], help="index sizes to measure")
    ap.add_argument("--repeats", type=int, default=3, help="opens per mode and N (interleaved), medians reported")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--child-open", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child_open:
        child_open(a.child_open, a.entries[0], a.mode)
        return 0
    med = statistics.median
    rows, failed = [], False
    for n in a.entries:
        root, empty = os.path.join(a.dir, f"n{n}"), os.path.join(a.dir, f"empty{n}")
        t0 = time.perf_counter()
        build(root, n)
        build(empty, n, fill=False)
        row: dict = {"entries": n, "fill_s": round(time.perf_counter() - t0, 2)}
        runs: dict = {f"{w}{m}": [] for w in ("", "empty_") for m in MODES}
        for _ in range(a.repeats):
            for path, prefix in ((root, ""), (empty, "empty_")):
                for m in MODES:
                    r = timed_open(path, n, m)
                    assert r["loaded"] == (n if path == root else 0), r
                    assert r["check"] == (None if m == "today" else "verified"), r  # the guard ran, or not
                    runs[prefix + m].append(r)
        for name, rs in runs.items():
            row[f"{name}_s"] = round(med(r["open_s"] for r in rs), 4)
            row[f"{name}_cpu"] = round(med(r["open_cpu_s"] for r in rs), 4)
        for m in ("fast", "full"):
            for unit in ("s", "cpu"):
                row[f"ratio_{m}_{unit}"] = round(row[f"{m}_{unit}"] / row[f"today_{unit}"], 3)
        ps = [parts(root) for _ in range(a.repeats)]
        for k in ps[0]:
            row[k] = round(med(p[k] for p in ps), 4) if k.endswith(("_s", "_cpu")) else ps[0][k]
        rows.append(row)
        print(f"\n== {n:,} entries (data.mdb {row['data_mdb_bytes'] / 1e6:.1f} MB), medians of {a.repeats}, "
              f"wall s / CPU s")
        for m in MODES:
            print(f"  open {m:5s}: {row[m + '_s']:.3f} / {row[m + '_cpu']:.3f}"
                  + ("" if m == "today" else f"   ratio vs today {row[f'ratio_{m}_s']:.2f}x wall, "
                                             f"{row[f'ratio_{m}_cpu']:.2f}x CPU"))
        print("  empty index: " + ", ".join(f"{m} {row['empty_' + m + '_s']:.3f}" for m in MODES))
        print(f"  parts: check fast {row['check_fast_s']:.3f} s, check full {row['check_full_s']:.3f} s "
              f"({row['check_full_cpu']:.3f} CPU s), salvage walk {row['salvage_walk_s']:.3f} s, "
              f"rebuild {row['rebuild_s']:.3f} s")
        for m in ("fast", "full"):
            worst = max(row[f"ratio_{m}_s"], row[f"ratio_{m}_cpu"])
            ok = worst <= TARGET
            failed |= m == "fast" and not ok
            print(f"  {m}: {worst:.2f}x of today's load (worst of wall and CPU), target <= {TARGET:g}x: "
                  f"{'PASS' if ok else 'FAIL'}")
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(empty, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 3 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
