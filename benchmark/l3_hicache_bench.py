#!/usr/bin/env python3
"""L3 HiCache backend vs the L3 engine it wraps, in one run, on one disk, on SGLang's real host pools.

What it proves: the backend adds no copy and no per-page work beyond the engine's. For GLM-5-shaped DSA host pools
(MLA KV 64 x 78 x 656 B = 3,274,752 B per page + the indexer page) in one host layout, rounds alternate A-B / B-A:

* backend: ``batch_set_v1`` (KV) + ``batch_set_v2`` (indexer) in SGLang's 128-page batches, ``flush`` ->
  durable; then ``batch_get_v1`` + ``batch_get_v2`` back into the zeroed host pool;
* engine: the same pages straight through ``L3Store.spill_from_layout`` / ``reload_into_layout`` with the
  backend's own plans (what the backend calls), same store, fresh keys.

It prints GB/s per path, the ratio backend / engine, and the backend's own per-batch cost (host-index validation +
key mapping), and checks the bytes read back. CPU-only (the demo stand-ins unpin the host pools); on a GPU node the
same script runs against pinned pools if the stand-ins are skipped (``--no-standins``).

Run: PYTHONPATH=. TORCH_EXTENSIONS_DIR=.torch_extensions python benchmark/l3_hicache_bench.py --pages 64
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

BATCH = 128


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=64,
                    help="host pages per round (each KV + indexer); slabs for 2*repeats+1 rounds are preallocated")
    ap.add_argument("--layers", type=int, default=78)
    ap.add_argument("--layout", default="page_first", choices=("page_first", "page_first_direct", "layer_first"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", help="where the L3 slabs go (default: a temp dir on /var/tmp)")
    ap.add_argument("--no-standins", action="store_true", help="do not install the CPU stand-ins (GPU node)")
    args = ap.parse_args(argv)

    import sglang_glm_ext
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

    from sglang_glm_ext.l3.config import example_config
    from sglang_glm_ext.l3.hicache.backend import L3HiCacheStorage
    from sglang_glm_ext.l3.hicache.keys import storage_keys
    from sglang_glm_ext.l3.demo import cpu_standins, stack
    from sglang_glm_ext.l3.demo.pools import build_host_pools, storage_config

    sglang_glm_ext.register()
    if not args.no_standins:
        cpu_standins.install()
    stack.publish_server_args(stack.StackSpec(), storage_backend=None, extra_config=None)
    work = args.dir or tempfile.mkdtemp(prefix="l3_hicache_bench_", dir="/var/tmp")
    os.makedirs(work, exist_ok=True)
    try:
        hp = build_host_pools("dsa", args.layout, layers=args.layers, device_pages=args.pages // 2 + 1)
        pages = list(range(min(args.pages, hp.kv.page_num - 1)))
        rounds = 2 * args.repeats + 1  # every round writes fresh keys: size the slabs for all of them
        cfg_text = example_config(work).replace('budget = "1GiB"', f"budget = {rounds * len(pages) * 4_100_000}")
        cfg_text = cfg_text.replace('staging_bytes = "256MiB"', 'staging_bytes = "1GiB"')
        cfg_text = cfg_text.replace("max_inflight = 256", "max_inflight = 4096")
        cfg = os.path.join(work, "l3.toml")
        with open(cfg, "w") as f:
            f.write(cfg_text)
        be = L3HiCacheStorage(storage_config(cfg), {})
        be.register_mem_pool_host(hp.kv)
        for name, pool in hp.pools.items():
            be.register_mem_host_pool_v2(pool, PoolName(name))
        be.on_host_pools_registered()
        pools = be.plan.pools  # the attach plan (hicache/plan.py): each served pool's PoolPlan and payload kind
        store, kv_plan, idx_plan = be.store, pools["kv"].plan, pools["indexer"].plan
        kv_kind, idx_kind = pools["kv"].kind, pools["indexer"].kind
        kv_plan_bytes = kv_plan.page_bytes + idx_plan.page_bytes
        hp.fill_random(1)
        total = len(pages) * kv_plan_bytes
        print(f"L3 HiCache backend vs engine: {len(pages)} pages x ({kv_plan.page_bytes:,} KV + "
              f"{idx_plan.page_bytes:,} indexer) B = {total / 1e9:.2f} GB per round, layout {args.layout}, "
              f"io {store.stats()['io_mode']['target_kv']}, {args.repeats} repeats, dir {work}")

        def batches(tag):
            for i in range(0, len(pages), BATCH):
                chunk = pages[i:i + BATCH]
                yield [f"{tag}-{p}" for p in chunk], chunk, hp.page_tokens(chunk)

        def via_backend(tag):
            t = time.perf_counter()
            for keys, _, idx in batches(tag):
                be.batch_set_v2([PoolTransfer(name=PoolName.INDEXER, host_indices=idx, keys=keys)])
                assert all(be.batch_set_v1(keys, idx))
            store.flush(None)
            w = time.perf_counter() - t
            hp.zero()
            t = time.perf_counter()
            for keys, _, idx in batches(tag):
                assert all(be.batch_get_v1(keys, idx))
                assert all(be.batch_get_v2([PoolTransfer(name=PoolName.INDEXER, host_indices=idx,
                                                         keys=keys)])[PoolName.INDEXER])
            return w, time.perf_counter() - t

        def via_engine(tag):
            t = time.perf_counter()
            for keys, chunk, _ in batches(tag):
                sk = storage_keys(keys)
                store.spill_from_layout(idx_kind, sk, idx_plan.layout, chunk)
                assert all(store.spill_from_layout(kv_kind, sk, kv_plan.layout, chunk))
            store.flush(None)
            w = time.perf_counter() - t
            hp.zero()
            t = time.perf_counter()
            for keys, chunk, _ in batches(tag):
                sk = storage_keys(keys)
                assert all(store.reload_into_layout(kv_kind, sk, kv_plan.layout, chunk))
                assert all(store.reload_into_layout(idx_kind, sk, idx_plan.layout, chunk))
            return w, time.perf_counter() - t

        ref = {n: [bytes(hp.page_bytes(n, p)) for p in (pages[0], pages[-1])] for n in hp.pools}
        via_engine("warm")  # first-touch of slabs and staging outside the timed rounds
        res = {"backend": [], "engine": []}
        for r in range(args.repeats):
            order = (("backend", via_backend), ("engine", via_engine))
            for name, fn in (order if r % 2 == 0 else order[::-1]):
                hp.fill_random(1)
                res[name].append(fn(f"{name}{r}"))
                got = {n: [bytes(hp.page_bytes(n, p)) for p in (pages[0], pages[-1])] for n in hp.pools}
                if got != ref:
                    print(f"BYTES DIFFER after the {name} round {r}", file=sys.stderr)
                    return 1
        # backend-only work per 128-page batch: index validation + key mapping (no engine call)
        idx = hp.page_tokens(pages[:BATCH])
        keys = [f"cost-{p}" for p in pages[:BATCH]]
        t = time.perf_counter()
        n_iter = 200
        for _ in range(n_iter):
            kv_plan.pages(idx.numpy(), len(keys))
            storage_keys(keys)
        own_us = (time.perf_counter() - t) / n_iter * 1e6
        print(f"{'path':<10} {'spill->durable GB/s':>20} {'reload GB/s':>12}")
        med = {}
        for name in ("backend", "engine"):
            w = statistics.median(x[0] for x in res[name])
            rd = statistics.median(x[1] for x in res[name])
            med[name] = (total / w / 1e9, total / rd / 1e9)
            print(f"{name:<10} {med[name][0]:>20.2f} {med[name][1]:>12.2f}")
        wr, rr = med["backend"][0] / med["engine"][0], med["backend"][1] / med["engine"][1]
        print(f"{'ratio':<10} {wr:>19.2f}x {rr:>11.2f}x   (backend / engine, same store, same pages; 1.0 = no "
              "overhead)")
        print(f"backend's own work per {len(keys)}-page batch (index check + key mapping): {own_us:.0f} us "
              f"= {own_us / len(keys):.2f} us/page; bytes checked after every round: exact")
        be.close()
        return 0
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
