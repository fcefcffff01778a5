"""One attention-CP rank of a node as its own process, on a CPU, with SGLang's real HiCache stack and the L3 backend.

DEMO/TEST-ONLY (installs :mod:`.cpu_standins`). ``python -m sglang_glm_ext.l3.demo.cp_ranks PLAN RANK``:
``PLAN`` is a JSON file (world size, gloo init file, L3 config, scenario, output directory); each rank joins a gloo
world whose one group is both SGLang's TP group and its attention-CP group (``attn_cp_size == tp_size``: plain
attention CP, attention TP 1), publishes that topology (``get_parallel``), and builds ``UnifiedRadixCache`` +
``HybridCacheController`` with those groups, so the controller's own MIN agreements (hit counts, per-batch
completion, queue drains) run over gloo between the processes. The L3 plugin (flags, the writer patch) is applied
by ``sglang_glm_ext.register()``. Every rank writes its result to ``<out>/rank<r>.json``; a failed assertion is an
exit status != 0 and the reason in that file.

Scenarios (``plan["scenario"]``):

* ``hits``: every rank inserts the same tokens with the same KV bytes (replicated KV), SGLang writes them back
  (every replica hands every page to its backend; the backend writes the ones it owns), evicts them from L1/L2 and
  prefetches them again: each rank must load all of them, byte-exact. Then ``lag``: rank 1's view of L3 is capped
  (a page committed between two ranks' queries): the MIN gives every rank the same shorter prefix. Then ``fail``:
  rank 1's disk fails every write: the pages it owns never become durable, and every rank loads the same prefix,
  up to the first page rank 1 owns, byte-exact.
* ``crash_write``: like ``hits`` up to durability, then the victim rank keeps writing pages straight through its
  backend and records each flushed (acknowledged) batch, until the test SIGKILLs it; the survivors then read every
  page from the shared index and the victim's slabs while it is dead.
* ``crash_reload``: a fresh world (``cold_start = "load"``): every rank prefetches the first scenario's tokens
  through SGLang (all must hit) and finds every page the victim acknowledged before it died.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

from .cp_layer_split import SCENARIOS as _LAYER_SPLIT
from .cp_rank_kit import PS, counts, drop_l2, durable, flush_all, page_keys, tokens, write_result


def _same(a, b) -> bool:
    import torch

    return len(a) == len(b) and all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b))


def _stack(plan: dict, rank: int, group):
    from . import stack

    n = plan["world"]
    spec = stack.StackSpec(layers=plan.get("layers", 2), device_pages=plan.get("device_pages", 32))
    sa = stack.publish_server_args(
        spec, storage_backend=None, extra_config='{"prefetch_threshold": 64}',
        plugin_values={"enable_cp_l3": True, "cp_l3_config": plan["config"]},
        parallel={"tp_rank": rank, "tp_size": n, "attn_cp_size": n, "attn_tp_size": 1, "moe_tp_size": n})
    st = stack.DsaStack.build(spec, sa, groups={"tp_cache_group": group, "attn_cp_cache_group": group})
    st.timeout = 90.0  # several ranks share 2 loaded cores; the test's own run timeout still bounds a hang
    import torch.distributed as dist

    dist.barrier(group=group)  # ranks finish their attach / cold start at different times
    return st


def _write(st, tokens, seed):
    slots = st.insert(tokens)
    st.fill_device(slots, seed)  # same seed on every rank: the KV is replicated across CP ranks
    want = st.snapshot_device(slots)
    st.write_back_storage(tokens)
    return want


def scenario_hits(plan, rank, group, out):
    import torch.distributed as dist

    from ..hicache.cp_writers import owner_index

    st = _stack(plan, rank, group)
    try:
        be = st.backend
        out["cp_rank"], out["cp_size"], out["l3_rank"] = be.cp_rank, be.cp_size, be.rank
        out["writers"] = list(be.writers.writers)
        t1 = tokens(1, plan.get("pages", 8))
        want = _write(st, t1, seed=1)
        flush_all(st, group)
        out["durable_seen"] = durable(st, page_keys(t1))
        out["after_write"] = counts(st)
        drop_l2(st, t1)
        out["loaded"] = st.prefetch(t1, "hits")
        out["bytes_ok"] = _same(st.snapshot_device(st.load_back(t1)), want)

        # lag: rank 1 sees only `lag` pages (its index view lags): the MIN gives everyone that prefix.
        lag = plan.get("lag", 3)
        drop_l2(st, t1)
        path = be._path  # the data path's per-pool exists is the seam (DataPath._leading)
        if rank == 1:
            real = path._leading
            path._leading = lambda rec, skeys: min(real(rec, skeys), lag)
        out["loaded_lag"] = st.prefetch(t1, "lag")
        if rank == 1:
            path._leading = real
        got = st.snapshot_device(st.load_back(t1[: out["loaded_lag"]]))
        out["bytes_ok_lag"] = _same(got, [w[: out["loaded_lag"]] if w.shape[0] == len(t1) else
                                          w[: out["loaded_lag"] // PS] for w in want])

        # fail: rank 1's disk refuses every write; its pages are misses for all, the rest of the prefix hits.
        from ..disk.slab import fail_write

        if rank == 1:
            for kind in (r.kind for r in be.plan.pools.values()):
                be.store.slab(kind).inject_write_fault(fail_write())
        writers = be.writers.writers

        def first_lost(keys):
            return next((i for i, k in enumerate(keys) if writers[owner_index(bytes.fromhex(k), len(writers))] == 1),
                        len(keys))

        # tokens whose first two pages other ranks own (the same search on every rank): a non-empty prefix survives
        start = next(s for s in range(10_000, 10_000 + 64 * 200, 64)
                     if 2 <= first_lost(page_keys(tokens(s, plan.get("pages", 8)))) < plan.get("pages", 8))
        t2 = tokens(start, plan.get("pages", 8))
        want2 = _write(st, t2, seed=2)
        flush_all(st, group)
        keys2 = page_keys(t2)
        first_lost = first_lost(keys2)
        out["expect_fail_prefix"] = first_lost * PS
        drop_l2(st, t2)
        out["loaded_fail"] = st.prefetch(t2, "fail")
        n = out["loaded_fail"]
        got = st.snapshot_device(st.load_back(t2[:n])) if n else []
        out["bytes_ok_fail"] = (not n) or _same(got, [w[:n] if w.shape[0] == len(t2) else w[: n // PS]
                                                      for w in want2])
        out["final"] = counts(st)
        dist.barrier(group=group)
    finally:
        st.close()


def scenario_crash_write(plan, rank, group, out):
    import numpy as np
    import torch

    st = _stack(plan, rank, group)
    t1 = tokens(1, plan.get("pages", 8))
    _write(st, t1, seed=1)
    flush_all(st, group)
    out["durable_seen"] = durable(st, page_keys(t1))
    be = st.backend
    victim, outdir = plan["victim"], plan["out"]
    if rank == victim:
        # Keep writing (the backend as SGLang's backup thread calls it) until killed; log each acknowledged batch.
        hp = st.controller.mem_pool_host.get_pool(__import__("sglang.srt.mem_cache.hicache_storage",
                                                             fromlist=["PoolName"]).PoolName.KV)
        hp.kv_buffer.view(-1).view(torch.uint8)[: hp.kv_buffer.nbytes // 2].random_(0, 256)
        log = open(os.path.join(outdir, "acked.txt"), "a")
        idx = torch.arange(0, 4 * PS, dtype=torch.int64)
        i = 0
        open(os.path.join(outdir, "writing"), "w").close()
        while True:
            if i >= plan.get("victim_batches", 100):  # bounded: stay below the GC watermark, wait to be killed
                time.sleep(0.05)
                continue
            keys = [f"{rank:02d}{i:06d}{j:02d}".ljust(64, "a") for j in range(4)]
            keys = [k[:64] for k in keys]
            ok = be.batch_set_v1(keys, idx)
            if all(ok) and be.store.flush(30):
                mine = [k for k, o in zip(keys, be.writers.owned([bytes.fromhex(k) for k in keys])) if o]
                for k in mine:
                    log.write(k + "\n")
                log.flush()
                os.fsync(log.fileno())
            i += 1
    # survivors: wait for the victim's death, then read everything it acknowledged (its slabs, no collectives)
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(outdir, "killed")):
        if time.monotonic() > deadline:
            raise TimeoutError("the victim was never killed")
        time.sleep(0.05)
    acked = [ln.strip() for ln in open(os.path.join(outdir, "acked.txt")) if len(ln.strip()) == 64]
    from ..hicache.keys import storage_keys

    kind = be.plan.kv.kind
    out["victim_acked"] = len(acked)
    out["victim_acked_seen"] = be.store.exists(kind, storage_keys(acked), include_staged=False) if acked else 0
    keys1 = page_keys(t1)
    dst = [np.zeros(be.plan.kv.page_bytes, np.uint8) for _ in keys1]
    out["t1_reads_while_victim_dead"] = sum(be.store.reload_into(kind, storage_keys(keys1), dst))
    # no st.close(): the victim is gone and SGLang's teardown may wait for it; main() exits without teardown


def scenario_crash_reload(plan, rank, group, out):
    from ..hicache.keys import storage_keys

    st = _stack(plan, rank, group)
    try:
        be = st.backend
        out["cold_start_loaded_pages"] = be.store.stats()["cold_start_loaded_pages"]
        acked = [ln.strip() for ln in open(os.path.join(plan["acked_dir"], "acked.txt")) if len(ln.strip()) == 64]
        out["victim_acked"] = len(acked)
        out["victim_acked_seen"] = (be.store.exists(be.plan.kv.kind, storage_keys(acked), include_staged=False)
                                    if acked else 0)
        t1 = tokens(1, plan.get("pages", 8))
        out["loaded"] = st.prefetch(t1, "after-restart")
    finally:
        st.close()


SCENARIOS = {"hits": scenario_hits, "crash_write": scenario_crash_write, "crash_reload": scenario_crash_reload}
# DSA cache layer split (each CP rank its own layers of a page): cp_layer_split.py, test_cp_layer_split.py

SCENARIOS.update(_LAYER_SPLIT)


def main(argv: list[str]) -> int:
    plan = json.load(open(argv[0]))
    rank = int(argv[1])
    out: dict = {"rank": rank}
    path = os.path.join(plan["out"], f"rank{rank}.json")
    status = 1
    try:
        import torch.distributed as dist

        from sglang.srt.plugins import load_plugins

        from . import cpu_standins

        load_plugins()  # SGLang's own entry-point loading: the plugin's register() applies its patches
        if plan.get("device", "cpu") == "cpu":  # a GPU run (layer split's gpu test) uses SGLang's real kernels
            cpu_standins.install()
        dist.init_process_group("gloo", init_method=f"file://{plan['init_file']}", rank=rank,
                                world_size=plan["world"])
        group = dist.new_group(list(range(plan["world"])), backend="gloo")
        SCENARIOS[plan["scenario"]](plan, rank, group, out)
        status = 0
    except BaseException as exc:  # noqa: BLE001 - the test reads the reason
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()
    write_result(path, out, status)


if __name__ == "__main__":
    main(sys.argv[1:])
