"""2-3 gloo processes play the attention-CP ranks of one node with SGLang's real HiCache stack and controllers
(UnifiedRadixCache + HybridCacheController over the DSA host pool group, the CP process group SGLang's controller
builds its MIN agreements on) and the L3 backend with the plugin's writer patch. Driver:
``sglang_glm_ext/l3/demo/cp_ranks.py``, one OS process per rank, forked from a zygote that imported torch and SGLang
once for the module (tests/rank_zygote.py). Every multi-process run is bounded: a rank that does not finish in time
fails the test (all ranks are killed), it is never skipped."""

import json
import os
import signal
import time

import pytest

import l3kit
from l3kit import write_config
from rank_zygote import Zygote

REPO = str(l3kit.REPO)
PS = 64
RUN_TIMEOUT = 300  # s per multi-process run on a loaded 2-core machine

pytestmark = pytest.mark.slow

# What every rank imports before its scenario runs (none of it reads what a rank sets: its argv names its plan).
PRELOAD = ["torch", "torch.distributed", "sglang.srt.server_args", "sglang.srt.runtime_context",
           "sglang.srt.plugins", "sglang.srt.mem_cache.unified_radix_cache", "sglang.srt.mem_cache.memory_pool",
           "sglang.srt.mem_cache.allocator.paged", "sglang.srt.mem_cache.cache_init_params",
           "sglang.srt.mem_cache.hicache_storage", "sglang.srt.mem_cache.utils", "sglang_glm_ext",
           "sglang_glm_ext.l3.demo.stack", "sglang_glm_ext.l3.demo.cpu_standins", "sglang_glm_ext.l3.hicache.backend"]


@pytest.fixture(scope="module")
def zygote():
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with Zygote(PRELOAD, env=env, cwd=REPO) as z:
        yield z


def _config(tmp_path, ranks, budget="16MiB", **overrides):
    from l3kit import TEST_BUDGET

    p = write_config(tmp_path, **overrides)
    text = open(p).read().replace("count = 1", f"count = {ranks}").replace(f'"{TEST_BUDGET}"', f'"{budget}"')
    open(p, "w").write(text)
    return p


def _spawn(zygote, tmp_path, name, world, config, scenario, **extra):
    d = tmp_path / name
    out = d / "out"
    out.mkdir(parents=True)
    plan = {"world": world, "init_file": str(d / "gloo-init"), "config": config, "scenario": scenario,
            "out": str(out), **extra}
    (d / "plan.json").write_text(json.dumps(plan))
    procs = [zygote.spawn(module="sglang_glm_ext.l3.demo.cp_ranks", argv=[d / "plan.json", r], log=out / f"log{r}")
             for r in range(world)]
    return procs, out


def _kill_all(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait(30)


def _kill_mid_write(procs, out, victim, n, deadline):
    """SIGKILL the victim as soon as its acked.txt lists ``n`` keys, then tell the survivors (``killed``). Anchored on
    the victim's own progress, not on a sleep: the kill lands inside its write loop however fast the machine is (the
    caller checks that the loop had not finished). Returns how many keys it had acknowledged."""
    acked = out / "acked.txt"
    try:
        while not (acked.exists() and len(acked.read_text().split()) >= n):
            if time.monotonic() > deadline or procs[victim].poll() is not None:
                pytest.fail(f"the victim never acknowledged {n} keys: {(out / f'log{victim}').read_text()[-2000:]}")
            time.sleep(0.01)
        os.kill(procs[victim].pid, signal.SIGKILL)
        procs[victim].wait(30)
        (out / "killed").touch()
    except BaseException:
        _kill_all(procs)
        raise
    return len([ln for ln in acked.read_text().split() if len(ln) == 64])


def _victim_owned_keys(victim, world, batches):
    from sglang_glm_ext.l3.hicache.cp_writers import owner_index

    keys = [f"{victim:02d}{i:06d}{j:02d}".ljust(64, "a")[:64] for i in range(batches) for j in range(4)]
    return sum(owner_index(bytes.fromhex(k), world) == victim for k in keys)


def _results(procs, out, deadline, skip=()):
    """Wait for every rank (a timeout fails the test); return each rank's result dict."""
    try:
        for r, p in enumerate(procs):
            if r in skip:
                continue
            left = deadline - time.monotonic()
            try:
                p.wait(timeout=max(left, 0.1))
            except TimeoutError:
                pytest.fail(f"rank {r} did not finish within {RUN_TIMEOUT}s (a hang): "
                            f"{(out / f'log{r}').read_text()[-2000:]}")
    finally:
        _kill_all(procs)
    res = {}
    for r in range(len(procs)):
        if r in skip:
            continue
        f = out / f"rank{r}.json"
        assert f.exists(), f"rank {r} wrote no result: {(out / f'log{r}').read_text()[-3000:]}"
        res[r] = json.loads(f.read_text())
        assert "error" not in res[r], f"rank {r}: {res[r]['error']}\n{res[r].get('traceback', '')}"
        assert procs[r].returncode == 0
    return res


@pytest.mark.parametrize("world", [2, 3])
def test_every_cp_rank_hits_what_any_rank_wrote_and_the_min_decides_one_prefix(zygote, tmp_path, world):
    procs, out = _spawn(zygote, tmp_path, "hits", world, _config(tmp_path, world), "hits")
    res = _results(procs, out, time.monotonic() + RUN_TIMEOUT)
    pages = 8
    assert [res[r]["cp_rank"] for r in range(world)] == list(range(world))
    assert {res[r]["cp_size"] for r in range(world)} == {world}
    for r in range(world):
        got = res[r]
        assert got["writers"] == list(range(world))
        assert got["durable_seen"] == pages  # every page durable in the node's index, whoever wrote it
        assert got["loaded"] == pages * PS and got["bytes_ok"]  # every rank hits every page, byte-exact
        # rank 1's view lags at 3 pages: SGLang's MIN gives every rank the same 3-page prefix
        assert got["loaded_lag"] == 3 * PS and got["bytes_ok_lag"]
        # rank 1's disk fails: its pages are misses for all; every rank loads the same prefix up to its first page
        assert got["expect_fail_prefix"] >= 2 * PS
        assert got["loaded_fail"] == got["expect_fail_prefix"] and got["bytes_ok_fail"]
    # the writer patch spreads the writes: each page (KV + indexer) written by exactly one rank, every rank writes
    written = [res[r]["after_write"]["spill_accepted"] for r in range(world)]
    assert sum(written) == 2 * pages and all(w > 0 for w in written), written
    assert all(res[r]["after_write"]["spill_accepted"] + res[r]["after_write"]["not_owned"] == 2 * pages
               for r in range(world))
    # reads of pages other ranks wrote: every rank got all of them (KV + indexer), none missed
    assert all(res[r]["final"]["reload_misses"] == 0 for r in range(world))


def test_a_sigkilled_rank_loses_nothing_acknowledged_and_survivors_serve_its_pages(zygote, tmp_path):
    world, victim = 3, 1
    # 64 MiB over 3 ranks: the victim's bounded write loop stays below its GC watermark, so nothing it wrote is
    # reclaimed (GC may drop cold pages by design; this test is about a crash)
    cfg = _config(tmp_path, world, budget="64MiB", cold_start="load")
    procs, out = _spawn(zygote, tmp_path, "crash", world, cfg, "crash_write", victim=victim)
    deadline = time.monotonic() + RUN_TIMEOUT
    n_acked = _kill_mid_write(procs, out, victim, 6, deadline)
    res = _results(procs, out, deadline, skip=(victim,))
    assert procs[victim].returncode == -signal.SIGKILL
    # the keys of its 100 batches it owns (cp_ranks.scenario_crash_write logs only those): fewer were acknowledged,
    # so the kill came while it was still writing, not after its loop ended
    assert 6 <= n_acked < _victim_owned_keys(victim, world, batches=100), n_acked
    for r, got in res.items():
        assert got["durable_seen"] == 8
        assert got["t1_reads_while_victim_dead"] == 8  # its pages come from its slab files while it is dead
        assert got["victim_acked_seen"] == got["victim_acked"] > 0

    # restart the whole group with cold_start = load: nothing the victim acknowledged is lost
    procs, out2 = _spawn(zygote, tmp_path, "restart", world, cfg, "crash_reload", acked_dir=str(out))
    res = _results(procs, out2, time.monotonic() + RUN_TIMEOUT)
    for r, got in res.items():
        assert got["victim_acked"] == n_acked and got["victim_acked_seen"] == n_acked
        assert got["loaded"] == 8 * PS  # SGLang's prefetch after the restart hits every page on every rank
    assert res[victim]["cold_start_loaded_pages"] >= n_acked  # the victim kept its own pages (load)
