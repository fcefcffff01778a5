"""The same multi-turn trace through SGLang's real server (on this CPU, or on a CUDA GPU with the bring-up tier:
``--gpu``), three ways, each restarted once:

  (a) HiCache without a storage tier, (b) HiCache + SGLang's own `file` backend, (c) HiCache + the plugin's L3.

Per side, after the restart: storage-hit tokens, prefill tokens computed (prompt tokens minus every cached tier),
TTFT median and p90 and the first request's TTFT, printed as ratios to (a), all measured in one run, side by side;
then, on the same server, the storage replay: each request after SGLang's /flush_cache (device and host tiers) with the
storage page cache dropped, so that every request's prefix comes from storage or is computed again (in the replay
before it, only the first request needs the shared prefix from below the device tier); last, the output ids compared
across sides, phase by phase (`ids_across_sides`: the `file` and L3 sides must agree after the restart, where both
find the same cached tokens). The model is a tiny GLM-5
(`sglang-glm-ext tiny-model`, dummy weights) sized so that a cold prefill of the shared prefix costs at least 10x the
TTFT of a one-token prompt (measured first and printed; below 10x the run says so): with hidden 64 a disk read
costs about as much as recomputing, and no tier could show.

    python benchmark/cpu_server_bench.py --dir /var/tmp/cpu_bench [--hidden 512 --layers 6]
    python benchmark/cpu_server_bench.py --gpu --dir /tmp/gpu_bench --hidden 2048 --layers 16 --system-chars 16000

Before each restart the page cache is dropped for every file of the storage directories (POSIX_FADV_DONTNEED):
SGLang's `file` backend reads through it, and a warm cache would flatter it (L3 reads its slabs with O_DIRECT).
Numbers from a 2-core machine shared with other work are noisy: read the ratios, not the milliseconds.
A deadline's SIGTERM (or a side that fails) stops every server and still prints the tables of what finished, then
`bench: CUT ...` (exit 143, or 1): a row with fewer requests than the trace says how many it holds.

On a GPU (``--gpu``) a phase's servers start together (the three first passes, then the three restarts: a server
start there is a minute of imports, and six in a row would not fit a 10-minute call; the calibration runs on side
(a)'s first-pass server, before its trace),
each KV pool sized by `--max-total-tokens`; they are measured one at a time, the others idle. On a CPU one server
runs at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sglang_glm_ext.cpu_serve import run, served, tiny_model  # noqa: E402


def _l3_config(directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "l3.toml")
    with open(path, "w") as f:
        f.write(f'deployment_id = "cpu-bench"\ncold_start = "load"\n\n[[disks]]\npath = "{directory}/disk0"\n'
                f'budget = "2GiB"\n\n[index]\npath = "{directory}/index"\nmap_size = "256MiB"\n\n'
                '[queues]\nstaging_bytes = "128MiB"\n')
    return path


def _settle_backup(url: str) -> None:
    """Wait until SGLang's storage backup counter (any backend) stops rising."""
    try:
        served.wait_counter_settled(url, "sglang:backup_pgs_count", quiet=4.0, timeout=300)
    except served.ServerError:
        pass


def drop_page_cache(*directories: str) -> int:
    """POSIX_FADV_DONTNEED on every file under ``directories`` (after an fsync, so dirty pages can go too); how many
    files."""
    n = 0
    for d in directories:
        for root, _, files in os.walk(d):
            for name in files:
                try:
                    fd = os.open(os.path.join(root, name), os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    n += 1
                except OSError:
                    pass
                finally:
                    os.close(fd)
    return n


def _measure(srv: served.Server, args, reqs) -> list:
    """The trace through one ready server, then the wait for its storage writes to settle."""
    replies = [served.chat(srv.url, m, timeout=600) for m in reqs]
    _settle_backup(srv.url)
    if "--enable-cp-l3" in args:
        served.wait_counter_settled(srv.url, run.SPILL, timeout=300)
    return replies


def storage_replay(srv: served.Server, reqs, dirs, into: list) -> list:
    """Every request again, each after a flush of the device and host tiers and with the storage directories' page
    cache dropped: each prefix now comes from the storage tier or is computed again. After the restart replay only
    the first request needs a tier below the device (the others find the shared prefix on it in every side), so this
    is where the storage tier's TTFT shows in the median and not in one request. Replies are appended to ``into`` as
    they come (a deadline keeps them)."""
    for m in reqs:
        run._flush(srv.url)
        drop_page_cache(*dirs)
        into.append(served.chat(srv.url, m, timeout=600))
    return into


def _group(servers: dict, work, log) -> dict:
    """Start every server of ``servers`` ({name: Server}) at once (threads, a few seconds apart), then run
    ``work(name, server)`` on each in turn, the others idle, then stop them all. On a GPU the starts (a minute each,
    import-bound) overlap instead of adding up; the measurements never overlap."""
    took, errors = {}, {}

    def start(name, srv):
        try:
            took[name] = srv.start_ready(600)
        except Exception as e:  # noqa: BLE001 - reported below, every server stopped
            errors[name] = e

    threads = []
    try:
        for name, srv in servers.items():
            threads.append(threading.Thread(target=start, args=(name, srv), daemon=True))
            threads[-1].start()
            if len(servers) > 1:
                time.sleep(5)  # first compiles of a kernel by several servers at once would race for its cache entry
        for t in threads:
            t.join()
        if errors:
            name, e = next(iter(errors.items()))
            raise served.ServerError(f"{name}: {e}")
        log("  ready: " + ", ".join(f"{n} {took[n]:.0f} s" for n in servers))
        return {name: work(name, srv) for name, srv in servers.items()}
    finally:
        for srv in servers.values():
            srv.stop()


def sides(model: str, work: str, plan: dict, reqs, log, profile=run.CPU, together: bool = False, cal=None,
          runs: dict | None = None) -> dict:
    """Each side of ``plan`` ({name: (args, env, storage dirs)}) through a first pass, a restart and the storage replay.
    ``cal(server)``, if given, runs on the first side's first-pass server before its trace (it flushes the cache
    before each of its prompts, and the trace starts from a flushed cache; one server fewer to start). ``together``:
    the first passes' servers start at once, then the restarts' (a GPU holds several tiny servers); else one server
    at a time (a 2-core CPU would time the other servers' polling). Each result goes into ``runs`` ({side: {"first",
    "restart", "storage_replay"}, "calibrate": ...}) as soon as it is measured, so a caller cut by a deadline still
    holds what finished."""
    runs = {} if runs is None else runs
    for name in plan:
        runs.setdefault(name, {})

    def server(name, phase):
        args, env, _ = plan[name]
        return served.Server(model, os.path.join(work, f"{name}_{phase}.log"), args=args, env=env,
                             base_args=profile.base_args, base_env=dict(profile.base_env))

    def first(name, srv):
        if cal is not None and name == next(iter(plan)):
            runs["calibrate"] = cal(srv)
            run._flush(srv.url)
        runs[name]["first"] = _measure(srv, plan[name][0], reqs)

    def restart(name, srv):
        runs[name]["restart"] = _measure(srv, plan[name][0], reqs)
        storage_replay(srv, reqs, plan[name][2], into=runs[name].setdefault("storage_replay", []))

    def drop(names):
        for name in names:
            if plan[name][2]:
                log(f"[{name}] page cache dropped for {drop_page_cache(*plan[name][2])} storage files")

    if together:
        log(f"[first pass] starting {', '.join(plan)} together")
        _group({name: server(name, "first") for name in plan}, first, log)
        drop(plan)
        log(f"[restart] starting {', '.join(plan)} together")
        _group({name: server(name, "restart") for name in plan}, restart, log)
    else:
        for name in plan:
            log(f"[{name}/first]")
            _group({name: server(name, "first")}, first, log)
            drop([name])
            log(f"[{name}/restart]")
            _group({name: server(name, "restart")}, restart, log)
    return runs


def summary(side: dict) -> dict:
    """One side's numbers from what was measured (a side cut by a deadline has fewer requests, or none)."""
    r = side.get("restart", [])
    return {**_tier_stats(r),
            "device_hit_tokens": sum(x.cached["device"] for x in r),
            # the restart's first request is the one that needs the shared prefix from a tier or a prefill; the
            # others find it on the device in every side (2026-12-05 on an H100: 5 of 6)
            "first_ttft_s": r[0].ttft_s if r else float("nan"),
            "ids_equal_first_pass": bool(r) and [x.output_ids for x in r] == [x.output_ids
                                                                   for x in side.get("first", [])],
            "replay": _tier_stats(side.get("storage_replay", []))}


def _tier_stats(replies) -> dict:
    nan = float("nan")
    return {"requests": len(replies),
            "storage_hit_tokens": sum(x.cached["storage"] for x in replies),
            "prefill_computed": sum(x.prompt_tokens - x.cached_total for x in replies),
            "ttft_median_s": served.median(x.ttft_s for x in replies) if replies else nan,
            "ttft_p90_s": served.percentile((x.ttft_s for x in replies), 0.9) if replies else nan}


def ids_across_sides(runs: dict, base: str = "a_hicache", pair: tuple = ("b_file", "c_l3")) -> list:
    """Output ids compared between sides, phase by phase: ``(label, equal, same_hits)``, for the pairs where both sides
    finished the phase. Within one side the ids of a prefix hit and of a cold prefill may differ (bf16 greedy decoding
    of a random model flips near-tie tokens between the two), but across sides the same phase runs the same computation:
    the first passes are cold in all three (so equal ids show the servers are deterministic), and after the restart
    the two storage sides find the same cached tokens per request, one from SGLang's `file` backend, one from L3, so
    their ids differ only if one tier returned other KV bytes. ``same_hits``: the per-request cached tokens by tier
    are equal too (if not, a different computation may flip a token)."""
    out = []

    def cmp(label, x, y, phase):
        rx, ry = runs.get(x, {}).get(phase, []), runs.get(y, {}).get(phase, [])
        n = min(len(rx), len(ry))
        if n:
            out.append((label, [r.output_ids for r in rx[:n]] == [r.output_ids for r in ry[:n]],
                        [r.cached for r in rx[:n]] == [r.cached for r in ry[:n]]))

    for name in pair:
        cmp(f"first pass {name} = {base}", name, base, "first")
    for phase in ("restart", "storage_replay"):
        cmp(f"{phase.replace('_', ' ')} {pair[1]} = {pair[0]}", pair[1], pair[0], phase)
    return out


def calibrate(srv: served.Server, reqs) -> dict:
    """On a ready server (side (a)'s: HiCache without a storage tier, each prompt after a flush of its tiers): TTFT of a
    cold prefill of the shared prefix vs a one-token prompt."""
    system = [reqs[0][0], {"role": "user", "content": "x"}]
    one = [{"role": "user", "content": "x"}]
    served.chat(srv.url, one, max_tokens=1)  # warm-up
    cold, tiny = [], []
    for _ in range(3):
        run._flush(srv.url)
        cold.append(served.chat(srv.url, system, max_tokens=1).ttft_s)
        run._flush(srv.url)
        tiny.append(served.chat(srv.url, one, max_tokens=1).ttft_s)
    return {"prefix_cold_ttft_s": served.median(cold), "one_token_ttft_s": served.median(tiny),
            "ratio": served.median(cold) / served.median(tiny)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="work directory (removed first)")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--system-chars", type=int, default=2000)
    ap.add_argument("--arch", choices=tiny_model.ARCHES, default="glm5")
    ap.add_argument("--gpu", action="store_true", help="on a CUDA GPU with the bring-up tier (bf16, pinned host pools, "
                    "SGLang's copy kernels; gpu_bringup/served.py)")
    ap.add_argument("--layout", choices=("layer_first", "page_first"), default="layer_first")
    args = ap.parse_args(argv)
    # a deadline's SIGTERM (served.sh's `timeout`) unwinds: every server started is stopped, none holds the GPU on
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log = lambda s: print(s, flush=True)  # noqa: E731
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(os.getcwd(), ".torch_extensions"))
    model = os.path.join(args.dir, "model")
    reqs = run.workload(args.conversations, args.turns, system_chars=args.system_chars)
    # one token per byte: the context holds the longest conversation's prompt plus its replies (a 16,000-character
    # system prompt met SGLang's 8,192-token default on the H200: HTTP 400 before the first measurement)
    longest = max(len(json.dumps(m).encode()) for m in reqs)
    context = max(8192, -(-(longest + 2048) // 1024) * 1024)
    tiny_model.write(args.arch, model, hidden=args.hidden, layers=args.layers, mla="glm5" if args.gpu else "tiny",
                     context=context)
    if args.gpu:
        from sglang_glm_ext.gpu_bringup import served as gpu_served

        # bf16 (what serving runs); a device pool twice the first pass's distinct tokens (every conversation's last
        # prompt, the shared system prompt once), so the restart is what empties it; four servers start together
        # (`sides`). --max-total-tokens sizes the pool; --mem-fraction-static is then only SGLang's check that the
        # weights leave room, and it counts what the other servers load meanwhile as this one's weights (0.15 failed
        # with four starting on an H100: "Raise --mem-fraction-static above 0.204"), so it gets headroom
        last = [json.dumps(m) for m in reqs[-args.conversations:]]
        distinct = sum(map(len, last)) - (len(last) - 1) * len(json.dumps(reqs[0][0]))
        prof = run.Profile(**gpu_served.profile(args.layout, dtype="bfloat16", max_total_tokens=max(8192, 2 * distinct),
                                                mem_fraction=0.6))
        hicache = prof.hicache_args
    else:
        prof, hicache = run.CPU, served.HICACHE_ARGS
    t0 = time.monotonic()
    file_dir, l3_dir = os.path.join(args.dir, "file_store"), os.path.join(args.dir, "l3")
    plan = {
        "a_hicache": ((*hicache, "--enable-metrics"), {}, ()),
        "b_file": ((*hicache, "--hicache-storage-backend", "file", "--enable-metrics"),
                   {"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": file_dir}, (file_dir,)),
        "c_l3": ((*hicache, "--enable-cp-l3", "--cp-l3-config", _l3_config(l3_dir), "--enable-metrics"), {}, (l3_dir,)),
    }
    runs: dict = {}
    cut = None
    try:
        sides(model, args.dir, plan, reqs, log, prof, together=args.gpu, cal=lambda s: calibrate(s, reqs), runs=runs)
    except BaseException as e:  # noqa: BLE001 - a deadline's SIGTERM or a failed side: report what finished first
        cut = e
        if not isinstance(e, (SystemExit, KeyboardInterrupt)):
            traceback.print_exc()
    report(runs, args, prof, len(reqs), log)
    if cut is not None:
        log(f"bench: CUT after {time.monotonic() - t0:.0f} s by {type(cut).__name__}: {cut}; the tables hold what "
            "finished (a row with fewer requests than the trace says how many)")
        return 143 if isinstance(cut, (SystemExit, KeyboardInterrupt)) else 1
    log(f"bench: {time.monotonic() - t0:.0f} s")
    return 0


def report(runs: dict, args, prof, n_reqs: int, log) -> None:
    """The tables of what was measured, as ratios to side (a); results.json beside them."""
    cal = runs.pop("calibrate", None)
    if cal is not None:
        log(f"calibration: cold prefill of the shared prefix {cal['prefix_cold_ttft_s'] * 1000:.0f} ms vs one-token "
            f"prompt {cal['one_token_ttft_s'] * 1000:.0f} ms = {cal['ratio']:.1f}x"
            + ("" if cal["ratio"] >= 10 else "  (BELOW 10x: raise --hidden/--layers for a meaningful comparison)"))
    across = ids_across_sides(runs)
    results = {name: summary(side) for name, side in runs.items()}
    base = results.get("a_hicache") or summary({})

    def ratio(a, b):
        return a / b if b else float("nan")

    def part(stats):
        return "" if stats["requests"] == n_reqs else f" ({stats['requests']} of {n_reqs} requests)"

    log("")
    log(f"profile: {prof.name}; model: {args.arch} tiny, hidden {args.hidden}, {args.layers} layers; {n_reqs} "
        f"requests ({args.conversations} conversations x {args.turns} turns, shared system prompt); after one "
        "restart each")
    log("| side | storage-hit tokens | prefill computed (vs a) | TTFT median (vs a) | TTFT p90 (vs a) | "
        "1st request TTFT (vs a) | ids = 1st pass |")
    log("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        if not r["requests"]:
            continue
        log(f"| {name}{part(r)} | {r['storage_hit_tokens']} | {r['prefill_computed']} "
            f"({ratio(r['prefill_computed'], base['prefill_computed']):.2f}x) | {r['ttft_median_s'] * 1000:.0f} ms "
            f"({ratio(r['ttft_median_s'], base['ttft_median_s']):.2f}x) | {r['ttft_p90_s'] * 1000:.0f} ms "
            f"({ratio(r['ttft_p90_s'], base['ttft_p90_s']):.2f}x) | {r['first_ttft_s'] * 1000:.0f} ms "
            f"({ratio(r['first_ttft_s'], base['first_ttft_s']):.2f}x) | {r['ids_equal_first_pass']} |")
    log("")
    log("storage replay (the same server after the replay above; SGLang's /flush_cache and the storage page cache "
        "dropped before each request, so every prefix comes from storage or is computed again):")
    log("| side | storage-hit tokens | prefill computed (vs a) | TTFT median (vs a) | TTFT p90 (vs a) |")
    log("|---|---|---|---|---|")
    for name, r in results.items():
        c, cb = r["replay"], base["replay"]
        if not c["requests"]:
            continue
        log(f"| {name}{part(c)} | {c['storage_hit_tokens']} | {c['prefill_computed']} "
            f"({ratio(c['prefill_computed'], cb['prefill_computed']):.2f}x) | {c['ttft_median_s'] * 1000:.0f} ms "
            f"({ratio(c['ttft_median_s'], cb['ttft_median_s']):.2f}x) | {c['ttft_p90_s'] * 1000:.0f} ms "
            f"({ratio(c['ttft_p90_s'], cb['ttft_p90_s']):.2f}x) |")
    log("")
    log("output ids across sides (greedy; a phase runs the same computation in each side: ids_across_sides):")
    for label, equal, same_hits in across:
        log(f"  {label}: {equal} (same cached tokens per request by tier: {same_hits})")
    with open(os.path.join(args.dir, "results.json"), "w") as f:
        json.dump({"calibration": cal, "sides": results, "ids_across_sides": across, "args": vars(args)}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
