"""DSA cache layer split (``--enable-dsa-cache-layer-split``) scenarios for the gloo rank processes of
:mod:`.cp_ranks` (which runs them: ``plan["scenario"]`` names one of :data:`SCENARIOS`). DEMO/TEST-ONLY.

Each rank builds SGLang's real stack with ``LayerSplitDSATokenToKVPool`` for its attention-CP rank (the assembler
then builds the layer-sharded MLA host pool, ``ceil(L / N)`` host layers, and the indexer host pool of its live
layers), the gloo group as SGLang's TP and attention-CP cache groups (so the controller's hit and completion MINs run
over it), and the L3 backend with the plugin's patches. Each rank's device KV is a function of the tokens and the
global layer id (as a model's is), so ranks hold different bytes (other layers), a recomputed prefix has the same
bytes, and every check regenerates what a rank's own layers must hold.

* ``lsplit_hits``: every rank writes back its part, drops L1/L2 and prefetches: every rank loads every page, its own
  layers byte-exact. ``lag``: rank 1's view is capped, the MIN gives every rank that prefix. ``corrupt``: bytes of
  rank 1's copy of one page are flipped on disk: its verify fails there, the completion MIN gives every rank the
  pages before it. ``missing``: rank 1's disk fails every write of a request that shares two pages with the first:
  every rank loads those two pages (rank 1's part of the rest is missing), never more.
* ``lsplit_crash_write`` / ``lsplit_crash_reload``: the victim keeps writing its part until SIGKILLed; a restart of
  the world with ``load`` finds every page it acknowledged, and SGLang's prefetch hits every page on every rank.
* ``lsplit_other_split``: a world of another size on the same disks: another namespace, a clean miss.
"""

from __future__ import annotations

import os
import time

PS = 64


def _stack(plan, rank, group):
    import torch.distributed as dist

    from . import stack

    n = plan["world"]
    # on a CPU SGLang's layer-split backup runs only layer_first with direct I/O (mla.py:900-912); a GPU run
    # (plan["device"] = "cuda") takes kernel I/O and page_first through the JIT one-layer kernel
    spec = stack.StackSpec(layers=plan.get("layers", 5), device_pages=plan.get("device_pages", 32),
                           layout=plan.get("layout", "layer_first"), io_backend=plan.get("io_backend", "direct"),
                           device=plan.get("device", "cpu"), layer_split=True)
    sa = stack.publish_server_args(
        spec, storage_backend=None, extra_config='{"prefetch_threshold": 64}',
        plugin_values={"enable_cp_l3": True, "cp_l3_config": plan["config"]},
        parallel=stack.layer_split_parallel(rank, n, group=group))
    st = stack.DsaStack.build(spec, sa, groups={"tp_cache_group": group, "attn_cp_cache_group": group})
    st.timeout = 90.0  # several ranks share 2 loaded cores; the test's own run timeout still bounds a hang
    dist.barrier(group=group)
    return st


def _page_block(token0: int, layer: int, shape, like, salt: int = 0):
    import torch

    g = torch.Generator().manual_seed(token0 * 1009 + layer * 7 + salt)
    return torch.randint(0, 256, tuple(shape), dtype=torch.uint8, generator=g).to(like.device).view(like.dtype)


def _owned(st):
    """(global layer id, KV buffer) and (global layer id, indexer buffer) of the layers this rank holds."""
    kv = st.kv_pool
    return ([(kv.start_layer + i, b) for i, b in enumerate(kv.kv_buffer) if b.shape[0]],
            [(kv.start_layer + i, b) for i, b in enumerate(kv.index_k_with_scale_buffer) if b.numel()])


def _fill(st, tokens, slots) -> None:
    """Device KV of ``tokens`` at ``slots``: each page's rows per layer a function of (its first token, layer)."""
    kv, ix = _owned(st)
    for p in range(len(tokens) // PS):
        rows = slots[p * PS:(p + 1) * PS]
        for layer, buf in kv:
            buf[rows] = _page_block(tokens[p * PS], layer, (PS, *buf.shape[1:]), buf)
        for layer, buf in ix:
            buf[int(rows[0]) // PS] = _page_block(tokens[p * PS], layer, buf.shape[1:], buf, salt=1)


def _check(st, tokens, slots) -> bool:
    """Do the device rows at ``slots`` hold this rank's layers of ``tokens``, byte-exact?"""
    import torch

    if len(slots) != len(tokens):
        return False
    kv, ix = _owned(st)
    for p in range(len(tokens) // PS):
        rows = slots[p * PS:(p + 1) * PS]
        for layer, buf in kv:
            want = _page_block(tokens[p * PS], layer, (PS, *buf.shape[1:]), buf)
            if not torch.equal(buf[rows].view(torch.uint8), want.view(torch.uint8)):
                return False
        for layer, buf in ix:
            want = _page_block(tokens[p * PS], layer, buf.shape[1:], buf, salt=1)
            if not torch.equal(buf[int(rows[0]) // PS].view(torch.uint8), want.view(torch.uint8)):
                return False
    return True


def _write(st, tokens):
    slots = st.insert(tokens)
    _fill(st, tokens, slots)
    st.write_back_storage(tokens)


def _load(st, tokens, rid):
    """Prefetch ``tokens`` through SGLang (its MINs decide the prefix); (loaded tokens, bytes of this rank's layers
    of that prefix exact after the load-back)."""
    n = st.prefetch(tokens, rid)
    return n, (not n) or _check(st, tokens[:n], st.load_back(tokens[:n]))


def _identity(st, out) -> None:
    import torch.distributed as dist

    from ..hooks import sync_group_ranks

    be = st.backend
    ns = be.namespace
    out["cp_rank"], out["cp_size"], out["l3_rank"] = be.cp_rank, be.cp_size, be.rank
    out["shard"], out["digest"] = ns.shard.tag(), ns.sealed_digest().hex()
    out["layers"] = [ns.layer_start, ns.layer_end]
    out["writers"] = list(be.writers.writers)
    # the attach check read the MIN groups off the controller (the l3.storage_kv_dtype hook); SGLang's own groups:
    cc = st.controller
    out["sync_groups_hook"] = be.storage_config.extra_config.get("sync_group_ranks")
    out["sync_groups_sglang"] = [list(dist.get_process_group_ranks(g)) for g in cc.prefetch_hits_sync_groups]
    out["sync_groups_recomputed"] = sync_group_ranks(cc)


def scenario_lsplit_hits(plan, rank, group, out):
    import torch.distributed as dist

    from .cp_rank_kit import counts, drop_l2, durable, flush_all, page_keys, rot_page, tokens

    st = _stack(plan, rank, group)
    try:
        be = st.backend
        _identity(st, out)
        pages = plan.get("pages", 8)
        t1 = tokens(1, pages)
        _write(st, t1)
        flush_all(st, group)
        out["durable_seen"] = durable(st, page_keys(t1))
        out["after_write"] = counts(st)
        drop_l2(st, t1)
        out["loaded"], out["bytes_ok"] = _load(st, t1, "hits")

        # lag: rank 1 sees only `lag` pages of its part: the hit MIN gives every rank that prefix
        lag = plan.get("lag", 3)
        drop_l2(st, t1)
        path = be._path
        if rank == 1:
            real = path._leading
            path._leading = lambda rec, skeys: min(real(rec, skeys), lag)
        out["loaded_lag"], out["bytes_ok_lag"] = _load(st, t1, "lag")
        if rank == 1:
            path._leading = real

        # corrupt: rank 1's copy of page `bad` rots on disk: its verify fails, the completion MIN cuts every rank
        bad = plan.get("corrupt_page", 5)
        if rank == 1:
            rot_page(be, page_keys(t1), bad)
        dist.barrier(group=group)
        drop_l2(st, t1)
        out["loaded_corrupt"], out["bytes_ok_corrupt"] = _load(st, t1, "corrupt")

        # missing: rank 1's disk fails every write from now; a request sharing `keep` pages with t1 (durable on
        # every rank: same tokens, same KV) and new pages after them: rank 1's part of the new pages never lands
        from ..disk.slab import fail_write

        if rank == 1:
            for kind in (r.kind for r in be.plan.pools.values()):
                be.store.slab(kind).inject_write_fault(fail_write())
        keep = plan.get("keep", 2)
        t2 = t1[: keep * PS] + tokens(50_000, pages - keep)
        _write(st, t2)
        flush_all(st, group)
        out["durable_t2"] = durable(st, page_keys(t2))
        drop_l2(st, t2)
        out["loaded_missing"], out["bytes_ok_missing"] = _load(st, t2, "missing")
        out["final"] = counts(st)
        out["final"]["verify_failures"] = be.store.stats()["verify_failures"]
        dist.barrier(group=group)
    finally:
        st.close()


def scenario_lsplit_crash_write(plan, rank, group, out):
    import torch

    from .cp_rank_kit import durable, flush_all, page_keys, tokens

    st = _stack(plan, rank, group)
    t1 = tokens(1, plan.get("pages", 8))
    _write(st, t1)
    flush_all(st, group)
    out["durable_seen"] = durable(st, page_keys(t1))
    be = st.backend
    out["digest"] = be.namespace.sealed_digest().hex()
    victim, outdir = plan["victim"], plan["out"]
    if rank == victim:
        # Keep writing its part (the backend as SGLang's backup thread calls it) until killed; log each flushed
        # (acknowledged) batch. Every page of its part is its own to write (attention TP 1).
        hp = st.host_pool("kv")
        hp.kv_buffer.view(-1).view(torch.uint8)[: hp.kv_buffer.nbytes // 2].random_(0, 256)
        log = open(os.path.join(outdir, "acked.txt"), "a")
        idx = torch.arange(0, 4 * PS, dtype=torch.int64)
        # bounded: stay well below the GC watermark (a part is a fraction of a page, so a rank holds many), then
        # wait to be killed: GC may drop cold pages by design, this is about a crash
        slots = min(k["total"] for k in be.store.stats()["slots"].values())
        batches = max(2, (int(slots * 0.7) - len(t1) // PS) // 4)  # t1's pages hold slots already
        out_batches = open(os.path.join(outdir, "victim_batches"), "w")
        out_batches.write(f"{batches} of {slots} slots\n")
        out_batches.close()
        i = 0
        while True:
            if i >= batches:
                time.sleep(0.05)
                continue
            keys = [f"{rank:02d}{i:06d}{j:02d}".ljust(64, "a")[:64] for j in range(4)]
            if all(be.batch_set_v1(keys, idx)) and be.store.flush(30):
                log.write("".join(k + "\n" for k in keys))
                log.flush()
                os.fsync(log.fileno())
            i += 1
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(outdir, "killed")):
        if time.monotonic() > deadline:
            raise TimeoutError("the victim was never killed")
        time.sleep(0.05)
    from ..hicache.keys import storage_keys

    acked = [ln.strip() for ln in open(os.path.join(outdir, "acked.txt")) if len(ln.strip()) == 64]
    # another part's pages are never this rank's: the victim's acknowledged pages are invisible here
    out["victim_acked_seen_by_other_part"] = (be.store.exists(be.plan.kv.kind, storage_keys(acked),
                                                              include_staged=False) if acked else 0)
    # no st.close(): the victim is gone and SGLang's teardown may wait for it; main() exits without teardown


def scenario_lsplit_crash_reload(plan, rank, group, out):
    from ..hicache.keys import storage_keys
    from .cp_rank_kit import tokens

    st = _stack(plan, rank, group)
    try:
        be = st.backend
        out["digest"] = be.namespace.sealed_digest().hex()
        out["cold_start_loaded_pages"] = be.store.stats()["cold_start_loaded_pages"]
        acked = [ln.strip() for ln in open(os.path.join(plan["acked_dir"], "acked.txt")) if len(ln.strip()) == 64]
        out["victim_acked"] = len(acked)
        out["victim_acked_seen"] = (be.store.exists(be.plan.kv.kind, storage_keys(acked), include_staged=False)
                                    if acked else 0)
        t1 = tokens(1, plan.get("pages", 8))
        out["loaded"], out["bytes_ok"] = _load(st, t1, "after-restart")
    finally:
        st.close()


def scenario_lsplit_other_split(plan, rank, group, out):
    from .cp_rank_kit import tokens

    st = _stack(plan, rank, group)
    try:
        be = st.backend
        out["digest"] = be.namespace.sealed_digest().hex()
        out["shard"] = be.namespace.shard.tag()
        s = be.store.stats()
        out["cold_start_other_namespace_pages"] = s["cold_start_other_namespace_pages"]
        out["loaded"] = st.prefetch(tokens(1, plan.get("pages", 8)), "other-split")
        s = be.store.stats()
        out["reload_hits"], out["errors"] = s["reload_hits"], be.l3_stats()["backend"]["errors"]
    finally:
        st.close()


SCENARIOS = {"lsplit_hits": scenario_lsplit_hits, "lsplit_crash_write": scenario_lsplit_crash_write,
             "lsplit_crash_reload": scenario_lsplit_crash_reload, "lsplit_other_split": scenario_lsplit_other_split}
