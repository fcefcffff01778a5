"""Host dedup (``host_dedup``) on gloo processes: one node's attention-CP ranks with SGLang's real HiCache stack.

DEMO/TEST-ONLY (installs :mod:`.cpu_standins`). ``python -m sglang_glm_ext.l3.demo.dedup_ranks PLAN RANK``, as
``cp_ranks.py`` (same plan keys) plus ``plan["dedup"]`` ("on" / "off": ``--hicache-host-dedup``). Every rank
inserts the same tokens with the same KV bytes (replicated MLA/DSA KV), SGLang writes them through to host memory
and back to L3, evicts them from L1 and L2, prefetches them from L3 and loads them back; the rank records its host
pool bytes, the bytes it read from L3 (the engine's own count and ``/proc/self/io``), the load-back time and whether
its device KV is byte-exact. Then ``mismatch``: rank 1's load-plan digest differs (as if its radix tree disagreed):
every rank's load-back is refused, a miss. Then ``corrupt``: bytes of one page rot on the source's disk: its verify
fails, the completion MIN gives every rank the pages before it, byte-exact. The feature's hooks are reached only
through the objects they hang on SGLang's controller (no import across feature folders).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

from .cp_rank_kit import PS, drop_l2, flush_all, page_keys, rot_page, tokens, write_result

RUN_ATTR = "_glm_ext_host_dedup"  # host_dedup/hooks.py: the DedupRun on the controller


def _same(a, b) -> bool:
    import torch

    return len(a) == len(b) and all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b))


def _io() -> dict:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (ln.split(":") for ln in f)}


def _host_bytes(st) -> int:
    total = 0
    for name in ("kv", "indexer"):
        pool = st.host_pool(name)
        for attr in ("kv_buffer", "index_k_with_scale_buffer"):
            buf = getattr(pool, attr, None)
            total += int(buf.nbytes) if buf is not None and hasattr(buf, "nbytes") else 0
    return total


def _l3_read_bytes(st) -> int:
    store = st.backend.store
    return 0 if store is None else int(store.stats()["reload_bytes"])


def _stack(plan, rank, group, extra: dict | None = None):
    """This rank's stack; ``extra``: more keys of SGLang's storage extra config (e.g. ``prefetch_timeout_base``)."""
    from . import stack

    n = plan["world"]
    spec = stack.StackSpec(layers=plan.get("layers", 2), device_pages=plan.get("device_pages", 32))
    sa = stack.publish_server_args(
        spec, storage_backend=None, extra_config=json.dumps({"prefetch_threshold": 64, **(extra or {})}),
        plugin_values={"enable_cp_l3": True, "cp_l3_config": plan["config"], "hicache_host_dedup": plan["dedup"]},
        parallel={"tp_rank": rank, "tp_size": n, "attn_cp_size": n, "attn_tp_size": 1, "moe_tp_size": n})
    st = stack.DsaStack.build(spec, sa, groups={"tp_cache_group": group, "attn_cp_cache_group": group})
    st.timeout = 120.0
    import torch.distributed as dist

    dist.barrier(group=group)
    return st


def _round(st, group, t, seed, out, tag):
    """Write ``t`` through to L3, drop it from L1/L2, prefetch and load it back: what this rank saw."""
    slots = st.insert(t)
    st.fill_device(slots, seed)
    want = st.snapshot_device(slots)
    t0 = time.perf_counter()
    st.write_back_storage(t)
    flush_all(st, group)  # every store durable, then a barrier: the node's time to durable, on every rank
    out[f"spill_s_{tag}"] = time.perf_counter() - t0
    drop_l2(st, t)
    io0, l3_0 = _io(), _l3_read_bytes(st)
    t0 = time.perf_counter()
    out[f"loaded_{tag}"] = st.prefetch(t, tag)
    out[f"prefetch_s_{tag}"] = time.perf_counter() - t0
    io1 = _io()
    out[f"l3_read_bytes_{tag}"] = _l3_read_bytes(st) - l3_0
    out[f"proc_read_bytes_{tag}"] = io1["read_bytes"] - io0["read_bytes"]
    out[f"proc_rchar_{tag}"] = io1["rchar"] - io0["rchar"]
    n = out[f"loaded_{tag}"]
    t0 = time.perf_counter()
    got = st.snapshot_device(st.load_back(t[:n])) if n else []
    out[f"load_back_s_{tag}"] = time.perf_counter() - t0
    out[f"bytes_ok_{tag}"] = (not n) or _same(got, [w[:n] if w.shape[0] == len(t) else w[: n // PS] for w in want])
    return want


def scenario_dedup(plan, rank, group, out):
    import torch.distributed as dist

    st = _stack(plan, rank, group)
    try:
        run = getattr(st.controller, RUN_ATTR, None)
        out["dedup_on"] = run is not None
        out["role"] = "off" if run is None else ("source" if run.plan.is_source else "peer")
        out["host_pool_bytes"] = _host_bytes(st)
        out["l3_stats_dedup"] = st.backend.l3_stats().get("host_dedup")
        pages = plan.get("pages", 8)
        t1 = tokens(1, pages)
        _round(st, group, t1, 1, out, "hits")
        out["load_bytes"] = sum(int(w.nbytes) for w in st.snapshot_device(st.load_back(t1)))

        if plan.get("mismatch", True) and run is not None:
            drop_l2(st, t1)
            out["loaded_mismatch_prefetch"] = st.prefetch(t1, "mismatch")
            hooks = sys.modules[type(run).__module__]
            real = hooks.plan_digest
            if rank == 1:
                hooks.plan_digest = lambda *parts: real(*parts, b"another radix tree")
            try:  # SGLang's load_back answers False for a refused load: nothing reaches the device
                out["mismatch_device_tokens"] = len(st.load_back(t1))
            finally:
                hooks.plan_digest = real
            out["mismatch_counted"] = run.counters["plan_mismatches"]

        # corrupt: the source's copy of page `bad` rots on disk; every rank loads the pages before it
        bad = plan.get("corrupt_page", 5)
        t2 = tokens(100_000, pages)
        be = st.backend
        slots = st.insert(t2)
        st.fill_device(slots, 2)
        want2 = st.snapshot_device(slots)
        st.write_back_storage(t2)
        flush_all(st, group)
        rot_page(be, page_keys(t2), bad)  # by the rank whose store holds it (under dedup: the source)
        dist.barrier(group=group)
        drop_l2(st, t2)
        n = out["loaded_corrupt"] = st.prefetch(t2, "corrupt")
        got = st.snapshot_device(st.load_back(t2[:n])) if n else []
        out["bytes_ok_corrupt"] = (not n) or _same(got, [w[:n] if w.shape[0] == len(t2) else w[: n // PS]
                                                         for w in want2])
        if run is not None:
            out["counters"] = dict(run.counters)
            out["writer_stores"] = (be.l3_stats().get("host_dedup") or {}).get("writer_stores")
        dist.barrier(group=group)
    finally:
        st.close()


SCENARIOS = {"dedup": scenario_dedup}


def main(argv: list[str], scenarios: dict | None = None) -> int:
    """One rank: ``scenarios`` (default :data:`SCENARIOS`) maps ``plan["scenario"]`` to its function."""
    plan = json.load(open(argv[0]))
    rank = int(argv[1])
    out: dict = {"rank": rank}
    path = os.path.join(plan["out"], f"rank{rank}.json")
    status = 1
    try:
        import torch.distributed as dist

        from sglang.srt.plugins import load_plugins

        from . import cpu_standins

        load_plugins()
        cpu_standins.install()
        dist.init_process_group("gloo", init_method=f"file://{plan['init_file']}", rank=rank,
                                world_size=plan["world"])
        group = dist.new_group(list(range(plan["world"])), backend="gloo")
        (scenarios or SCENARIOS)[plan.get("scenario", "dedup")](plan, rank, group, out)
        status = 0
    except BaseException as exc:  # noqa: BLE001 - the test reads the reason
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()
    write_result(path, out, status)


if __name__ == "__main__":
    main(sys.argv[1:])
