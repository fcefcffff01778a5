#!/usr/bin/env python3
"""L3 write throughput under attention CP: pages spread over the node's CP ranks vs one writer, side by side.

N processes (gloo, default 4) play the CP ranks of one node; each maps to its own disk directory
(``ranks.mapping = [0, 1, ..., N-1]``), the way a GLM-5 prefill node maps its CP ranks to its NVMe drives. Each
rank attaches the L3 backend to SGLang's real GLM-5-shaped DSA host pools (MLA KV 64 x 78 x 656 B + the indexer
page) with the storage config the plugin's ``l3.cp_storage_writers`` patch hands it, and calls exactly what SGLang's
backup thread calls on every replica once the patch made each one a writer: ``batch_set_v2`` (indexer) +
``batch_set_v1`` (KV) for every page of the operation, in 128-page batches, then ``flush`` (durable).

* ``spread``: ``[writers] mode = "spread"``: each page written by its content owner (1/N of the pages per rank).
* ``one_per_node``: the node's first rank writes every page (what stock SGLang's single MLA writer does).

The two modes use separate directories (own disks, own index) and alternate A-B / B-A each round with fresh keys.
A round's time runs from a barrier before the first write to a barrier after every rank's flush returned (every
page durable). Printed: GB/s of distinct page bytes made durable per round and the ratio spread / one writer.

On one shared virtual disk (the dev VM) the ratio measures what spreading costs or buys when every rank's
"disk" is the same device: submission and fdatasync run on N threads instead of one, the device is the same. On
a node with one NVMe drive per CP rank the spread write bandwidth is bounded by N drives instead of one.

Run: PYTHONPATH=. TORCH_EXTENSIONS_DIR=.torch_extensions python benchmark/l3_cp_writers_bench.py --ranks 4
(a node with one drive per rank: ``--disk-dirs /nvme0,/nvme1,/nvme2,/nvme3``; needs SGLang installed, CPU stand-ins).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

BATCH = 128
MODES = ("spread", "one_per_node")



def _dropped(stats: dict) -> int:
    return stats["dropped_staging"] + stats["dropped_pool_full"] + stats["dropped_bad_input"]

def _config(base: str, mode: str, ranks: int, budget: int, disk_dirs: list[str]) -> str:
    from sglang_glm_ext.l3.config import example_config

    d = os.path.join(base, mode)
    os.makedirs(d, exist_ok=True)
    text = example_config(d).replace('mode = "spread"', f'mode = "{mode}"')
    roots = [os.path.join(disk_dirs[i % len(disk_dirs)], os.path.basename(base), mode) if disk_dirs else d
             for i in range(ranks)]
    disks = "".join(f'[[disks]]\npath = "{roots[i]}/disk{i}"\nbudget = {budget}\n\n' for i in range(ranks))
    head, _, rest = text.partition("[[disks]]")
    rest = rest.split("[ranks]", 1)[1]
    text = (head + disks + "[ranks]" + rest).replace("count = 1", f"count = {ranks}").replace(
        'mapping = "balanced"', f"mapping = {list(range(ranks))}").replace('deployment_id = "example"',
                                                                              'deployment_id = "cpbench"')
    path = os.path.join(d, "l3.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def worker(args) -> int:
    import torch
    import torch.distributed as dist
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import get_parallel

    from sglang_glm_ext.l3.hicache.backend import L3HiCacheStorage
    from sglang_glm_ext.l3.demo import cpu_standins, stack
    from sglang_glm_ext.l3.demo.pools import build_host_pools, storage_config

    rank, n = args.rank, args.ranks
    load_plugins()
    cpu_standins.install()
    dist.init_process_group("gloo", init_method=f"file://{args.init}", rank=rank, world_size=n)
    stack.publish_server_args(stack.StackSpec(), storage_backend=None, extra_config=None)
    get_parallel().override_permanently(tp_rank=rank, tp_size=n, attn_cp_size=n, attn_tp_size=1, moe_tp_size=n)
    hp = build_host_pools("dsa", "page_first", layers=args.layers, device_pages=args.pages // 2)
    hp.fill_random(1234)  # replicated KV: the same bytes on every CP rank
    bes = {}
    for mode in MODES:
        be = L3HiCacheStorage(storage_config(args.configs[mode], tp_rank=rank, tp_size=n, attn_cp_rank=rank,
                                             attn_cp_size=n, writers_patch=True), {})
        be.register_mem_pool_host(hp.kv)
        for name, pool in hp.pools.items():
            be.register_mem_host_pool_v2(pool, PoolName(name))
        be.on_host_pools_registered()
        bes[mode] = be
    pages = min(args.pages, hp.kv.page_num)
    page_bytes = sum(p.page_bytes for p in bes["spread"].plans.values())
    idx_all = torch.arange(0, pages * hp.page_size, dtype=torch.int64)
    times = {m: [] for m in MODES}
    for rnd in range(args.rounds):
        order = MODES if rnd % 2 == 0 else MODES[::-1]
        for mode in order:
            be = bes[mode]
            keys = [hashlib.sha256(f"{rnd}-{mode}-{i}".encode()).hexdigest() for i in range(pages)]
            dist.barrier()
            t0 = time.perf_counter()
            for s in range(0, pages, BATCH):
                k = keys[s:s + BATCH]
                idx = idx_all[s * hp.page_size:(s + len(k)) * hp.page_size]
                be.batch_set_v2([PoolTransfer(name=PoolName.INDEXER, host_indices=idx, keys=list(k))])
                be.batch_set_v1(k, idx)
            assert be.store.flush(300)
            dist.barrier()
            times[mode].append(time.perf_counter() - t0)
    counts = {m: bes[m].store.stats()["spill_accepted"] for m in MODES}
    dropped = {m: _dropped(bes[m].store.stats()) + bes[m].store.stats()["write_errors"] for m in MODES}
    for be in bes.values():
        be.close()
    gathered = [None] * n
    dist.all_gather_object(gathered, {"rank": rank, "counts": counts, "dropped": dropped})
    if rank == 0:
        with open(args.result, "w") as f:
            json.dump({"times": times, "ranks": gathered, "pages": pages, "page_bytes": page_bytes}, f)
    dist.barrier()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4, help="CP ranks of the node (processes), one disk dir each")
    ap.add_argument("--pages", type=int, default=48, help="pages per round (each KV + indexer), fresh keys")
    ap.add_argument("--layers", type=int, default=78)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--dir", help="where the slabs go (default: a temp dir on /var/tmp; removed afterwards)")
    ap.add_argument("--disk-dirs", default="",
                    help="comma-separated mount points, one per drive: rank i's disk goes on drive i %% len (a node "
                         "with one NVMe per CP rank); default: every rank's disk under --dir")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--init", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--configs", type=json.loads, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)

    base = tempfile.mkdtemp(prefix="l3-cp-bench-", dir=args.dir or "/var/tmp")
    try:
        # each rank's disk holds one round of every page (the one-writer case) plus GC headroom; page ~3.9 MB
        approx_page = 64 * args.layers * (656 + 164)
        budget = int(args.pages * approx_page * 1.4) + (16 << 20)
        disk_dirs = [x for x in args.disk_dirs.split(",") if x]
        configs = {m: _config(base, m, args.ranks, budget, disk_dirs) for m in MODES}
        result = os.path.join(base, "result.json")
        init = os.path.join(base, "gloo-init")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--ranks", str(args.ranks), "--pages",
               str(args.pages), "--layers", str(args.layers), "--rounds", str(args.rounds), "--init", init,
               "--result", result, "--configs", json.dumps(configs)]
        procs = [subprocess.Popen(cmd + ["--rank", str(r)]) for r in range(args.ranks)]
        deadline = time.monotonic() + 1800
        for p in procs:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                print("benchmark timed out", file=sys.stderr)
                return 2
        if any(p.returncode for p in procs):
            print(f"a rank failed: {[p.returncode for p in procs]}", file=sys.stderr)
            return 1
        with open(result) as f:
            res = json.load(f)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        for x in [x for x in args.disk_dirs.split(",") if x]:
            shutil.rmtree(os.path.join(x, os.path.basename(base)), ignore_errors=True)

    nbytes = res["pages"] * res["page_bytes"]
    print(f"{args.ranks} CP ranks, one disk dir each; {res['pages']} pages x {res['page_bytes']:,} B "
          f"(KV + indexer) per round = {nbytes / 1e6:.0f} MB; rounds alternate A-B / B-A")
    print(f"{'round':>5}  {'spread GB/s':>11}  {'one writer GB/s':>15}  {'spread / one':>12}")
    ratios = []
    for i, (ts, t1) in enumerate(zip(res["times"]["spread"], res["times"]["one_per_node"])):
        a, b = nbytes / ts / 1e9, nbytes / t1 / 1e9
        ratios.append(a / b)
        print(f"{i:>5}  {a:>11.3f}  {b:>15.3f}  {a / b:>11.2f}x")
    med = {m: statistics.median(nbytes / t / 1e9 for t in res["times"][m]) for m in MODES}
    print(f"{'median':>5}  {med['spread']:>11.3f}  {med['one_per_node']:>15.3f}  "
          f"{statistics.median(ratios):>11.2f}x (median of per-round ratios)")
    for m in MODES:
        per = [r["counts"][m] for r in sorted(res["ranks"], key=lambda r: r["rank"])]
        drops = sum(r["dropped"][m] for r in res["ranks"])
        print(f"pages written per rank ({m}, KV + indexer, all rounds): {per}; dropped/failed: {drops}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
