"""Issue 7, item 3: one live owner per (deployment, rank) on an index.

Two servers of one deployment and rank on one node, each with its own disk directory and the node's shared index:
the second server's cold start used to delete the first one's live entries. The second open is now refused while
the first lives (in another process or in this one), and allowed again once it is gone (the kernel drops the lock
of a SIGKILLed process)."""

import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import l3kit
from l3kit import K, NS
from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.disk.slab import SlabLockedError
from sglang_glm_ext.l3.disk.format import slot_bytes_for
from sglang_glm_ext.l3.engine.index import L3Index
from sglang_glm_ext.l3.engine.store import L3OwnerLockedError, L3Store, L3StoreError

REPO = str(l3kit.REPO)
PB = 4096 + 7
SLOT = slot_bytes_for(PB)


def key(i):
    return l3kit.key(i, "o")  # what CHILD writes


def cfg_dict(tmp_path, disk, dep="t"):
    return l3kit.config_dict(tmp_path, budget=32 * SLOT, deployment=dep, disk=disk)


def _entries(tmp_path, store_like_dep):
    from sglang_glm_ext.l3.engine.index import deployment_tag

    ix = L3Index.open(str(tmp_path / "index"), 2**24)
    try:
        return len(list(ix.iter_prefix(deployment_tag(store_like_dep))))
    finally:
        ix.close()


CHILD = textwrap.dedent(f"""
    import hashlib, json, sys
    import numpy as np
    from sglang_glm_ext.l3.config import L3Config
    from sglang_glm_ext.l3.disk.format import Namespace, PayloadKind
    from sglang_glm_ext.l3.engine.store import L3Store
    PB = {PB}
    K = PayloadKind.TARGET_KV
    NS = Namespace("glm5", "bf16", "page_first", 64, 0, 78, "tp0")
    cfg = L3Config.from_dict(json.loads(sys.argv[1]))
    s = L3Store.open(cfg, rank=0, namespace=NS, page_bytes={{K: PB}})
    keys = [hashlib.sha256(f"o{{i}}".encode()).hexdigest() for i in range(5)]
    assert all(s.spill(K, keys, [np.full(PB, i, np.uint8) for i in range(5)]))
    assert s.flush(30)
    print("READY", s.exists(K, keys), flush=True)
    sys.stdin.read()  # holds its store until killed (or until the test is gone: its stdin closes)
""")


def _first_line(proc, timeout=120):
    """The child's first line. A hang guard: a child silent for ``timeout`` s is killed, which ends the read."""
    guard = threading.Timer(timeout, proc.kill)
    guard.start()
    try:
        return proc.stdout.readline()
    finally:
        guard.cancel()


def test_a_second_server_of_the_same_deployment_and_rank_on_a_shared_index_is_refused(tmp_path):
    import json

    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, str(script), json.dumps(cfg_dict(tmp_path, "disk_a"))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = _first_line(proc)
        assert line.split() == ["READY", "5"], proc.stderr.read()
        second = L3Config.from_dict(cfg_dict(tmp_path, "disk_b"))  # its own disk directory, the node's index
        with pytest.raises(L3OwnerLockedError) as ei:
            L3Store.open(second, rank=0, namespace=NS, page_bytes={K: PB})
        msg = str(ei.value)
        assert "deployment 't' rank 0" in msg and f"pid {proc.pid}" in msg and "deployment_id" in msg
        assert not ei.value.in_this_process
        assert isinstance(ei.value, L3StoreError)  # open-time failures keep their one base class
        assert _entries(tmp_path, "t") == 5  # the live server's entries are untouched
        assert not (tmp_path / "disk_b" / "t").exists()  # refused before anything was created for it
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        # The kernel dropped the dead server's lock: the next owner opens (and its cold start may now clear).
        s = L3Store.open(second, rank=0, namespace=NS, page_bytes={K: PB})
        s.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_a_second_open_in_one_process_is_refused_and_the_live_store_can_be_found(tmp_path):
    first_cfg = L3Config.from_dict(cfg_dict(tmp_path, "disk_a"))
    first = L3Store.open(first_cfg, rank=0, namespace=NS, page_bytes={K: PB})
    try:
        assert all(first.spill(K, [key(i) for i in range(3)], [np.full(PB, i, np.uint8) for i in range(3)]))
        assert first.flush(30)
        other = L3Config.from_dict(cfg_dict(tmp_path, "disk_b"))
        with pytest.raises(L3OwnerLockedError) as ei:
            L3Store.open(other, rank=0, namespace=NS, page_bytes={K: PB})
        assert ei.value.in_this_process and "this process" in str(ei.value)
        assert first.exists(K, [key(i) for i in range(3)]) == 3
        # The live store can be found (for inspection; L3Store.open itself shares it when the config matches):
        assert L3Store.find_open(first_cfg, 0) is first.shared and L3Store.find_open(other, 0) is first.shared
        # Another deployment, or another rank, on the same index is a different owner.
        third = L3Store.open(L3Config.from_dict(cfg_dict(tmp_path, "disk_c", dep="u")), rank=0, namespace=NS,
                             page_bytes={K: PB})
        third.close()
    finally:
        first.close()
    assert L3Store.find_open(first_cfg, 0) is None
    L3Store.open(other, rank=0, namespace=NS, page_bytes={K: PB}).close()  # released at close


def test_the_slab_lock_message_no_longer_recommends_the_broken_set_up(tmp_path):
    from sglang_glm_ext.l3.disk.slab import DiskSlab

    path = tmp_path / "x.slab"
    a = DiskSlab.open(path, slot_bytes=4096, num_slots=4)
    try:
        with pytest.raises(SlabLockedError) as ei:
            DiskSlab.open(path, slot_bytes=4096, num_slots=4)
        msg = str(ei.value)
        assert "own L3 directory" not in msg and "deployment_id" in msg
    finally:
        a.close()
