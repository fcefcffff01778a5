"""SIGKILL a writer process mid-spill, restart with cold_start=load: every page the child saw as present reads back
exactly, nothing reads back wrong, no slot is shared, and fsck finds no corruption."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import l3kit
from l3kit import K, NS
from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.disk.format import slot_bytes_for
from sglang_glm_ext.l3.tools.fsck import fsck
from sglang_glm_ext.l3.engine.store import L3Store

REPO = str(l3kit.REPO)
PB = 2 * 4096 + 300
SLOT = slot_bytes_for(PB)
SLOTS = 600


def key(i, salt="x"):
    return l3kit.key(i, salt)


def page(i, salt="x"):
    return l3kit.page(i, salt, nbytes=PB)


# The child's pages are the parent's: the same l3kit, the same PB and salt.
COMMON = textwrap.dedent(f"""
    import sys
    sys.path.insert(0, {l3kit.HERE!r})
    import l3kit
    from l3kit import K, NS
    PB = {PB}
    def key(i, salt="x"):
        return l3kit.key(i, salt)
    def page(i, salt="x"):
        return l3kit.page(i, salt, nbytes=PB)
""")

CHILD = COMMON + textwrap.dedent("""
    import sys
    from sglang_glm_ext.l3.config import L3Config
    from sglang_glm_ext.l3.engine.store import L3Store
    cfg = L3Config.from_file(sys.argv[1])
    start = int(sys.argv[2])
    s = L3Store.open(cfg, rank=0, namespace=NS, page_bytes={K: PB}, cold_start=sys.argv[3])
    print("OPEN", flush=True)
    i = start
    reported = start
    while i < start + 400:
        ks = list(range(i, i + 8))
        s.spill(K, [key(j) for j in ks], [page(j) for j in ks])
        print("S", i, flush=True)  # a batch acknowledged (write-behind): its writes are in flight now
        i += 8
        if (i // 8) % 3 == 0:
            # Only what exists() reports counts as present; spills after this keep flowing (mid-spill kill).
            s.flush(30)
            for j in range(reported, i):
                if s.exists(K, [key(j)]) == 1:
                    print("P", j, flush=True)
            reported = i
    print("DONE", flush=True)
    import time
    time.sleep(60)
""")


def _config(tmp_path):
    p = tmp_path / "l3.toml"
    p.write_text(f'deployment_id = "crash"\n[[disks]]\npath = "{tmp_path}/disk"\nbudget = {SLOTS * SLOT}\n'
                 f'[index]\npath = "{tmp_path}/index"\nmap_size = "64MiB"\n'
                 f'[queues]\nwrite_batch_pages = 8\n[gc]\nstart = 0.99\nstop = 0.98\n')
    return str(p)


def _run_and_kill(cfg_path, start, mode, kill_after_present, then_batches):
    """SIGKILL the child once it has reported ``kill_after_present`` pages present and then acknowledged
    ``then_batches`` more spill batches: the kill lands at a different point of the write pipeline each run (right
    after a flush's report, or with one or two batches of writes in flight), anchored on what the child says it
    did, not on a sleep. Returns the pages it reported present."""
    script = Path(cfg_path).parent / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, str(script), cfg_path, str(start), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)
    hung = threading.Event()
    guard = threading.Timer(120, lambda: (hung.set(), proc.kill()))  # a hang guard: the child reports in seconds
    guard.start()
    present, batches = [], None
    try:
        for line in proc.stdout:
            if line.startswith("P "):
                present.append(int(line.split()[1]))
                if len(present) >= kill_after_present and batches is None:
                    batches = 0
            elif line.startswith("S ") and batches is not None:
                batches += 1
            elif line.startswith("DONE"):
                break
            if batches is not None and batches >= then_batches:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        guard.cancel()
        if proc.poll() is None:
            proc.kill()
    assert not hung.is_set(), f"the child stopped reporting for 120 s: {proc.stderr.read()[-3000:]}"
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
    assert len(present) >= kill_after_present and batches == then_batches, (len(present), batches,
                                                                           proc.stderr.read()[-3000:])
    return present


def _check_all(s, present, salt="x"):
    dst = [np.zeros(PB, np.uint8) for _ in present]
    ok = s.reload_into(K, [key(j, salt) for j in present], dst)
    bad = [j for j, o, d in zip(present, ok, dst) if not o or not np.array_equal(d, page(j, salt))]
    return bad


@pytest.mark.slow
def test_sigkill_mid_spill_then_load(tmp_path):
    cfg_path = _config(tmp_path)
    cfg = L3Config.from_file(cfg_path)
    all_present = []
    for run, (start, then) in enumerate([(0, 0), (1000, 1), (2000, 2)]):
        mode = "clear" if run == 0 else "load"
        all_present += _run_and_kill(cfg_path, start, mode, kill_after_present=40, then_batches=then)
        s = L3Store.open(cfg, rank=0, namespace=NS, page_bytes={K: PB}, cold_start="load")
        try:
            # 1. Every page reported present before any kill reads back exactly.
            assert _check_all(s, all_present) == []
            # 2. No slot is referenced twice, and every referenced slot is allocated in the rebuilt pool.
            entries = [e for _, e in s.index.iter_rank(s.dep, 0, s.ns)]
            slots = [e.slot for e in entries]
            assert len(slots) == len(set(slots))
            pool = s.diagnostics().home(K).pool
            assert all(pool.is_allocated(x) for x in slots)
            assert s.loaded_pages == len(entries)
        finally:
            s.close()
    # 3. New spills after the last load never clobber a carried-over page.
    s = L3Store.open(cfg, rank=0, namespace=NS, page_bytes={K: PB}, cold_start="load")
    try:
        free = SLOTS - s.stats()["slots"]["target_kv"]["used"]
        n_new = min(free - 10, 200)
        idx = list(range(n_new))
        assert all(s.spill(K, [key(i, "after") for i in idx], [page(i, "after") for i in idx]))
        assert s.flush(60)
        assert s.stats()["gc_reclaimed"] == 0
        assert _check_all(s, all_present) == []
        assert _check_all(s, idx, salt="after") == []
    finally:
        s.close()
    # 4. fsck agrees: nothing corrupt, nothing orphaned in the index.
    rep = fsck(cfg)
    assert rep.corrupt == 0 and rep.orphan_index == 0 and rep.exit_code == 0


@pytest.mark.slow
def test_sigkill_loop_each_restart_takes_the_owner_lock_and_leaves_no_dead_reader_slot(tmp_path):
    """Issue 7, item 3 and the reader-table finding, under repeated SIGKILL while another rank keeps the index
    open: each restart gets the (deployment, rank) owner lock the dead process held (the kernel released it),
    no reader slot of a dead process is left after an open, and every page a child saw as present reads back
    exactly. (A child killed inside a read transaction leaves a slot; one killed between them leaves none.)"""
    from sglang_glm_ext.l3.engine.index import L3Index

    cfg_path = _config(tmp_path)
    cfg = L3Config.from_file(cfg_path)
    other_rank = L3Index.open(cfg.index_path, cfg.index_map_size)  # keeps LMDB from resetting its reader table
    dead = []
    present = []
    try:
        for run, then in enumerate([0, 1, 2, 0, 1]):
            present += _run_and_kill(cfg_path, 5000 + 1000 * run, "clear" if run == 0 else "load",
                                     kill_after_present=16, then_batches=then)
            pids = {int(r.split()[0]) for r in other_rank.env.readers().splitlines()[1:] if r.strip()}
            dead.append(pids - {os.getpid()})
        s = L3Store.open(cfg, rank=0, namespace=NS, page_bytes={K: PB}, cold_start="load")
        try:
            assert _check_all(s, present) == []
            left = {int(r.split()[0]) for r in other_rank.env.readers().splitlines()[1:] if r.strip()}
            assert left <= {os.getpid()}, left  # no slot of a dead process survives an open
        finally:
            s.close()
    finally:
        other_rank.close()
    # Each child, at its open, cleared the slots its killed predecessors left: they never pile up.
    assert max(len(d) for d in dead) <= 1, dead
