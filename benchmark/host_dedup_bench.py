"""Host dedup on one node: host bytes, disk bytes and load-back time, dedup on vs off, side by side in one run.

``python benchmark/host_dedup_bench.py [--ranks 1 2 4] [--pages 8] [--layers 2] [--dir DIR]``: for each rank count,
one world of gloo processes per mode (``sglang_glm_ext/l3/demo/dedup_ranks.py``: SGLang's real HiCache stack and
controllers on a CPU, the L3 backend) writes the same replicated MLA/DSA KV back to L3, drops it from L1/L2,
prefetches it and loads it back. Per node: host pool bytes (all ranks), L3 bytes read (the engine's count; and
``/proc/<pid>/io`` read_bytes, 0 where the disk is tmpfs or the page cache served it), load-back seconds per GB of
device KV landed (every rank's device KV counted: under dedup that includes the broadcast), and the hit time: the
slowest rank's prefetch from L3 plus its load-back (the storage part of a hit's time to first token), and the spill
time: from SGLang's write-back to L3 until every store of the node is durable (under dedup one process, the source,
writes every rank's pages into that rank's store). A CPU/gloo measurement:
it proves the byte counts; the time is not a GPU number. Results of a run go in docs_internal/host_dedup.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(d: str, ranks: int) -> str:
    sys.path.insert(0, REPO)
    from sglang_glm_ext.l3.config import example_config

    os.makedirs(d, exist_ok=True)
    text = example_config(d).replace('budget = "1GiB"', 'budget = "64MiB"').replace("count = 1", f"count = {ranks}")
    p = os.path.join(d, "l3.toml")
    with open(p, "w") as f:
        f.write(text)
    return p


def run_world(root: str, ranks: int, dedup: str, pages: int, layers: int, timeout: float = 600) -> list[dict]:
    d = os.path.join(root, f"r{ranks}-{dedup}")
    out = os.path.join(d, "out")
    os.makedirs(out, exist_ok=True)
    plan = {"world": ranks, "init_file": os.path.join(d, "gloo-init"), "config": _config(os.path.join(d, "l3"), ranks),
            "out": out, "dedup": dedup, "pages": pages, "layers": layers, "mismatch": False}
    with open(os.path.join(d, "plan.json"), "w") as f:
        json.dump(plan, f)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-m", "sglang_glm_ext.l3.demo.dedup_ranks",
                               os.path.join(d, "plan.json"), str(r)], cwd=REPO, env=env,
                              stdout=open(os.path.join(out, f"log{r}"), "w"), stderr=subprocess.STDOUT)
             for r in range(ranks)]
    deadline = time.monotonic() + timeout
    for p in procs:
        p.wait(max(1.0, deadline - time.monotonic()))
    got = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(ranks)]
    bad = [g for g in got if "error" in g]
    if bad:
        raise RuntimeError(f"{ranks} ranks, dedup {dedup}: rank {bad[0]['rank']}: {bad[0]['error']}\n"
                           f"{bad[0].get('traceback', '')}")
    return got


def summary(got: list[dict]) -> dict:
    landed = sum(g["load_bytes"] for g in got)
    secs = max(g["load_back_s_hits"] for g in got)
    return {"host_bytes": sum(g["host_pool_bytes"] for g in got),
            "l3_read_bytes": sum(g["l3_read_bytes_hits"] for g in got),
            "proc_read_bytes": sum(g["proc_read_bytes_hits"] for g in got),
            "exact": all(g["bytes_ok_hits"] and g["loaded_hits"] for g in got),
            "load_s_per_gb": secs / (landed / 1e9) if landed else float("nan"),
            "hit_ms": 1000 * max(g["prefetch_s_hits"] + g["load_back_s_hits"] for g in got),
            "spill_ms": 1000 * max(g["spill_s_hits"] for g in got)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--pages", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one); L3 slabs go here")
    a = ap.parse_args(argv)
    root = a.dir or tempfile.mkdtemp(prefix="host_dedup_bench_")
    print(f"# host dedup bench: {a.pages} pages x {a.layers} layers, DSA (fp8 KV + indexer), gloo on CPU, in {root}")
    print("| ranks | host bytes off | host bytes on | ratio | L3 bytes off | L3 bytes on | ratio | /proc read off | "
          "/proc read on | load s/GB off | load s/GB on | hit ms off | hit ms on | spill ms off | spill ms on | "
          "byte-exact |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in a.ranks:
        off = summary(run_world(root, n, "off", a.pages, a.layers))
        on = summary(run_world(root, n, "on", a.pages, a.layers))
        print(f"| {n} | {off['host_bytes']} | {on['host_bytes']} | {on['host_bytes'] / off['host_bytes']:.3f} | "
              f"{off['l3_read_bytes']} | {on['l3_read_bytes']} | "
              f"{on['l3_read_bytes'] / max(off['l3_read_bytes'], 1):.3f} | {off['proc_read_bytes']} | "
              f"{on['proc_read_bytes']} | {off['load_s_per_gb']:.2f} | {on['load_s_per_gb']:.2f} | "
              f"{off['hit_ms']:.0f} | {on['hit_ms']:.0f} | {off['spill_ms']:.0f} | {on['spill_ms']:.0f} | "
              f"{off['exact'] and on['exact']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
