"""Three rank processes share one LMDB index; each writes its own slabs (two ranks share a disk) and reads the
pages the other ranks wrote, while they keep running (no slab lock is taken by readers)."""

import os
import subprocess
import sys
import threading
import textwrap

import pytest

import l3kit
from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.tools.fsck import fsck

REPO = str(l3kit.REPO)
N_RANKS = 3
PAGES = 24

CHILD = textwrap.dedent("""
    import hashlib, sys
    import numpy as np
    from sglang_glm_ext.l3.config import L3Config
    from sglang_glm_ext.l3.disk.format import Namespace, PayloadKind
    from sglang_glm_ext.l3.engine.store import L3Store
    PB = 3 * 4096 + 11
    K = PayloadKind.TARGET_KV
    NS = Namespace("glm5", "bf16", "page_first", 64, 0, 78, "shared")  # same shard: pages are interchangeable
    def key(r, i): return hashlib.sha256(f"r{r}p{i}".encode()).hexdigest()
    def page(r, i): return np.frombuffer(hashlib.shake_256(f"r{r}p{i}".encode()).digest(PB), np.uint8).copy()
    cfg = L3Config.from_file(sys.argv[1]); rank = int(sys.argv[2]); n_ranks = int(sys.argv[3]); n = int(sys.argv[4])
    s = L3Store.open(cfg, rank=rank, namespace=NS, page_bytes={K: PB})
    assert all(s.spill(K, [key(rank, i) for i in range(n)], [page(rank, i) for i in range(n)]))
    # One page every rank writes: content-hash dedup across processes keeps exactly one owner.
    s.spill(K, [key(99, 0)], [page(99, 0)])
    assert s.flush(60)
    print("READY", flush=True)
    assert sys.stdin.readline().strip() == "GO"
    bad = 0
    for r in range(n_ranks):
        keys = [key(r, i) for i in range(n)]
        if s.exists(K, keys) != n:
            bad += 1
        dst = [np.zeros(PB, np.uint8) for _ in keys]
        ok = s.reload_into(K, keys, dst)
        bad += sum(1 for i in range(n) if not ok[i] or not np.array_equal(dst[i], page(r, i)))
    d = np.zeros(PB, np.uint8)
    bad += 0 if s.reload_into(K, [key(99, 0)], [d]) == [True] and np.array_equal(d, page(99, 0)) else 1
    st = s.stats()
    print("RESULT", bad, st["spilled"], st["dedup"], flush=True)
    assert sys.stdin.readline().strip() == "EXIT"
    s.close()
""")


@pytest.mark.slow
def test_ranks_share_index_and_read_each_others_pages(tmp_path):
    cfg_path = tmp_path / "l3.toml"
    cfg_path.write_text(
        f'deployment_id = "mp"\n'
        f'[[disks]]\npath = "{tmp_path}/d0"\nbudget = "8MiB"\n[[disks]]\npath = "{tmp_path}/d1"\nbudget = "8MiB"\n'
        f'[ranks]\ncount = {N_RANKS}\nmapping = "balanced"\n[index]\npath = "{tmp_path}/index"\nmap_size = "32MiB"\n')
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, str(script), str(cfg_path), str(r), str(N_RANKS), str(PAGES)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for r in range(N_RANKS)]
    guard = threading.Timer(300, lambda: [p.kill() for p in procs])  # hang guard for the blocking reads below
    guard.start()
    try:
        for p in procs:
            line = p.stdout.readline()
            assert line.strip() == "READY", p.stderr.read()
        for p in procs:  # every rank is still open (holding its slab locks) while the others read
            p.stdin.write("GO\n")
            p.stdin.flush()
        results = []
        for p in procs:
            line = p.stdout.readline().split()
            assert line and line[0] == "RESULT", p.stderr.read()
            results.append(tuple(int(x) for x in line[1:]))
        for p in procs:
            p.stdin.write("EXIT\n")
            p.stdin.flush()
        for p in procs:
            assert p.wait(30) == 0, p.stderr.read()
    finally:
        guard.cancel()
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [r[0] for r in results] == [0] * N_RANKS  # nothing missing, nothing wrong, on any rank
    # The shared page was written to disk once or more, but exactly one index entry owns it.
    assert sum(r[1] for r in results) >= N_RANKS * PAGES + 1
    cfg = L3Config.from_file(cfg_path)
    rep = fsck(cfg)
    assert rep.live == N_RANKS * PAGES + 1 and rep.corrupt == 0 and rep.orphan_index == 0
    assert cfg.rank_to_disk == (0, 1, 0)
