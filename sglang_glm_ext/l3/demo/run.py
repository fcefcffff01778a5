"""``sglang-glm-ext demo``: the L3 tier under SGLang's real HiCache, end to end, on a CPU-only machine.

SGLang's own ``UnifiedRadixCache`` + ``HybridCacheController`` + DSA host pool group (MLA KV anchor + indexer) for a
GLM-5-shaped model, with the plugin's L3 backend selected by ``--enable-cp-l3`` exactly as in a server, driven the
way the scheduler drives it: insert -> write-through -> write-back to L3 -> L2 eviction (device and host) ->
prefetch from L3 -> load-back, then a restart (``cold_start = "load"``) and the same prefetch on the new cache.
Every phase checks the KV and indexer bytes against what was written and prints hits, pages and GB/s.

Embedded defaults: a temporary directory with the L3 slabs and the embedded LMDB index, removed afterwards unless
``--keep``; ``--dir DIR`` puts them in DIR instead (created if missing), which is never removed. It runs on the CPU
stand-ins for SGLang's GPU copy ops (``demo/cpu_standins.py``), which refuse where a GPU is visible: on a GPU node,
run a real server instead. Exit status 0 only if every byte matched.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

__all__ = ["add_demo_subcommand", "run_demo"]


def _positive(text: str) -> int:
    """A count the demo checks bytes over: 0 would check nothing and still print OK."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1 (0 would check nothing), got {value}")
    return value


def add_demo_subcommand(sub) -> None:
    p = sub.add_parser("demo", help="L3 under SGLang's real HiCache on this CPU: write-back, eviction, prefetch, "
                                    "restart; checks bytes, prints hits and GB/s")
    p.add_argument("--dir", help="work directory, created if missing and never removed (default: a fresh temporary "
                                 "directory, removed at the end unless --keep)")
    p.add_argument("--keep", action="store_true",
                   help="keep the temporary work directory (slabs, index, l3.toml) and print its path; a --dir is "
                        "always kept")
    p.add_argument("--requests", type=_positive, default=6, help="requests (distinct prompts)")
    p.add_argument("--pages", type=_positive, default=4, help="pages (64 tokens each) per request")
    p.add_argument("--layers", type=_positive, default=78, help="model layers (GLM-5: 78)")
    p.add_argument("--layout", default="page_first", choices=("page_first", "page_first_direct", "layer_first"),
                   help="--hicache-mem-layout (page_first is SGLang's default)")


class _Bar:
    """One status line per phase; redrawn in place on a terminal, one line per step otherwise."""

    def __init__(self, title: str, total: int, out=sys.stdout):
        self.title, self.total, self.out = title, max(total, 1), out
        self.tty = out.isatty()
        self.t0 = time.perf_counter()

    def update(self, done: int, note: str = "") -> None:
        width = 24
        fill = width * done // self.total
        line = f"  {self.title:<22} [{'#' * fill}{'.' * (width - fill)}] {done}/{self.total} {note}"
        if self.tty:
            self.out.write("\r" + line.ljust(110))
            if done >= self.total:
                self.out.write("\n")
        else:
            self.out.write(line + "\n")
        self.out.flush()


def _gbps(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f} GB/s" if seconds > 0 else "-"


def _same(a, b) -> bool:
    import torch

    return len(a) == len(b) and all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b))


def run_demo(args: argparse.Namespace, register) -> int:
    """Run the demo; ``register`` is the plugin's ``register()`` (plugin/cli.py passes it: a feature folder does not
    import the plugin machinery). Exit status: 0 every byte matched, 1 a check failed, 2 not run here."""
    from . import cpu_standins

    why = cpu_standins.refusal_reason()
    if why:
        print(f"sglang-glm-ext demo: not run here: {why}. On a GPU node, serve a model with "
              "--enable-hierarchical-cache --enable-cp-l3 --cp-l3-config l3.toml instead.", file=sys.stderr)
        return 2
    work = args.dir or tempfile.mkdtemp(prefix="glm_ext_demo_")
    os.makedirs(work, exist_ok=True)
    try:
        return _run(args, work, register)
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(work, ignore_errors=True)


def _config(work: str, page_bytes_estimate: int, pages: int) -> str:
    from ..config import example_config

    budget = max(64 * 2**20, 4 * pages * page_bytes_estimate)
    text = example_config(os.path.join(work, "l3")).replace('cold_start = "clear"', 'cold_start = "load"')
    text = text.replace('deployment_id = "example"', 'deployment_id = "glm-ext-demo"')
    text = text.replace('budget = "1GiB"', f"budget = {budget}")
    os.makedirs(os.path.join(work, "l3"), exist_ok=True)
    path = os.path.join(work, "l3.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def _run(args, work: str, register) -> int:
    import logging

    for name in ("sglang", "sglang_glm_ext"):
        logging.getLogger(name).setLevel(logging.ERROR)

    kept = "kept" if args.keep or args.dir else "removed at the end; --keep keeps it"
    print(f"sglang-glm-ext demo: L3 as SGLang's HiCache storage tier, one rank, CPU (work dir {work}, {kept})")
    t_import = time.perf_counter()
    ledger = register()
    if ledger is None:
        print("the plugin is disabled (SGLANG_GLM_EXT_DISABLE=1)", file=sys.stderr)
        return 2
    demo = _Demo(args, work, t_import)
    demo.write_back()
    demo.evict_l2()
    demo.prefetch()
    return demo.verdict(demo.restart())


class _Demo:
    """One demo run on SGLang's HiCache stack with L3: the requests, the device bytes each must come back as
    (``want``), and the failures found so far; one method per phase, in the order ``_run`` calls them."""

    def __init__(self, args, work: str, t_import: float):
        from . import cpu_standins, stack

        cpu_standins.install()
        io = "direct" if args.layout == "page_first_direct" else "kernel"
        self.args = args
        self.spec = spec = stack.StackSpec(layers=args.layers, layout=args.layout, io_backend=io,
                                           device_pages=args.requests * args.pages + 2)
        kv_page = spec.page_size * spec.layers * spec.kv_cache_dim
        cfg = _config(work, kv_page * 5 // 4, args.requests * args.pages)
        self.values = {"enable_cp_l3": True, "cp_l3_config": cfg}
        sa = stack.publish_server_args(spec, storage_backend=None, extra_config='{"prefetch_threshold": 64}',
                                       plugin_values=self.values)
        self.st = st = stack.DsaStack.build(spec, sa)
        be = st.backend
        kv_pb, idx_pb = be.plan.kv.page_bytes, be.plan.pools["indexer"].page_bytes
        print(f"  SGLang {type(st.controller).__name__} + {type(be).__name__} via hicache_storage_backend="
              f"{sa.hicache_storage_backend!r}; host pools: "
              + ", ".join(f"{n}={type(p).__name__}/{be.plan.pools[n].plan.fmt.layout}" for n, p in be.pools.items()))
        print(f"  model: {spec.layers} layers, page {spec.page_size} tokens: KV page {kv_pb:,} B + indexer page "
              f"{idx_pb:,} B; namespace {be.namespace.describe()['digest'][:16]} (kv dtype {be.namespace.kv_dtype}); "
              f"setup {time.perf_counter() - t_import:.1f}s")
        self.requests = [list(range(1 + r * 100_000, 1 + r * 100_000 + args.pages * spec.page_size))
                         for r in range(args.requests)]
        self.page_pair = kv_pb + idx_pb
        self.failures: list[str] = []
        self.want: dict = {}

    def write_back(self) -> None:
        """1. write-back: device KV -> host (L2) -> L3, durable after the store's flush."""
        st, be, args, page_pair = self.st, self.st.backend, self.args, self.page_pair
        bar = _Bar("write-back to L3", len(self.requests))
        in_sglang = 0.0  # time inside SGLang's HiCache calls (write-through, storage write-back), not the test filler
        for i, tokens in enumerate(self.requests):
            slots = st.insert(tokens)
            st.fill_device(slots, seed=100 + i)
            self.want[i] = st.snapshot_device(slots)
            t = time.perf_counter()
            st.write_back_storage(tokens)
            in_sglang += time.perf_counter() - t
            bar.update(i + 1, f"{be.store.stats()['spill_accepted']} pages accepted, "
                              f"{_gbps((i + 1) * args.pages * page_pair, in_sglang)}")
        t = time.perf_counter()
        be.store.flush()
        durable = in_sglang + time.perf_counter() - t
        s = be.store.stats()
        pages = args.requests * args.pages
        print(f"    {s['spilled']} pages durable ({pages} KV + {pages} indexer), {pages * page_pair / 1e6:.1f} MB: "
              f"{_gbps(pages * page_pair, in_sglang)} through SGLang's write-back, {_gbps(pages * page_pair, durable)} "
              f"to durable (fdatasync + index commit; io {s['io_mode']['target_kv']})")

    def evict_l2(self) -> None:
        """2. L2 eviction: nothing of these prompts stays on device or in host memory."""
        st = self.st
        for tokens in self.requests:
            st.evict_device(len(tokens))
            st.evict_host(len(tokens))
        left = sum(st.match(t).host_hit_length + st.match(t).device_prefix_len for t in self.requests)
        print(f"  L2 eviction: device and host hits left: {left} tokens")
        if left:
            self.failures.append("L2 eviction left tokens behind")

    def prefetch(self) -> None:
        """3. prefetch from L3 into host memory, load back to the (zeroed) device, compare KV + indexer bytes."""
        for pool in (self.st.kv_pool, *self.st.draft_pools):
            for buf in (*pool.kv_buffer, *pool.index_k_with_scale_buffer):
                buf.zero_()
        self._prefetch_all(self.st, "prefetch from L3", "p")

    def restart(self) -> dict:
        """4. restart: a new cache on the same disk, cold_start = "load", and the same prefetch. Its L3 stats."""
        from . import stack

        self.st.close()
        t0 = time.perf_counter()
        sa2 = stack.publish_server_args(self.spec, storage_backend=None, extra_config='{"prefetch_threshold": 64}',
                                        plugin_values=self.values)
        st2 = stack.DsaStack.build(self.spec, sa2)
        try:
            print(f"  restart (cold_start=load): {st2.backend.store.stats()['cold_start_loaded_pages']} pages found "
                  f"durable in {time.perf_counter() - t0:.2f}s")
            self._prefetch_all(st2, "prefetch after restart", "r")
            return st2.backend.l3_stats()
        finally:
            st2.close()

    def verdict(self, stats: dict) -> int:
        b, s = stats["backend"], stats["store"]
        print(f"  after restart: {s['reload_hits']} page reads hit, {s['reload_misses']} missed, backend errors "
              f"{b['errors']}, verify failures {s['verify_failures']}")
        if self.failures:
            print("FAILED:\n  - " + "\n  - ".join(self.failures))
            return 1
        print("OK: every KV and indexer byte came back from L3 exactly, before and after the restart")
        return 0

    def _prefetch_all(self, cache_stack, title: str, tag: str) -> None:
        """Every request prefetched from L3 and loaded back; its bytes against ``want``."""
        requests, want, failures, page_size = self.requests, self.want, self.failures, self.spec.page_size
        page_pair = self.page_pair
        bar = _Bar(title, len(requests))
        dt = 0.0  # time inside SGLang's prefetch (hit query, MIN sync, I/O thread, host insert)
        hits = 0
        for i, tokens in enumerate(requests):
            t = time.perf_counter()
            loaded = cache_stack.prefetch(tokens, f"{tag}-{i}")
            dt += time.perf_counter() - t
            hits += loaded
            got = cache_stack.snapshot_device(cache_stack.load_back(tokens))
            if loaded != len(tokens) or not _same(got, want[i]):
                failures.append(f"{title}: request {i} loaded {loaded}/{len(tokens)} tokens, bytes "
                                f"{'match' if _same(got, want[i]) else 'DIFFER'}")
            bar.update(i + 1, f"{hits // page_size} pages hit, {_gbps(hits // page_size * page_pair, dt)}")
        n = hits // page_size
        print(f"    hits {hits}/{sum(map(len, requests))} tokens, {n} KV + {n} indexer pages, "
              f"{n * page_pair / 1e6:.1f} MB at {_gbps(n * page_pair, dt)} through SGLang's prefetch; "
              f"bytes {'exact' if not failures else 'CHECK FAILED'} after load-back")
