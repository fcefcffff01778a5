"""SGLANG_GLM_EXT_L3_TEST_WRITE_DELAY_MS: a slow disk on demand, for the server tests that must kill a server in the
middle of its write-back. Every slab write of a store opened with it sleeps that long; a page acknowledged by spill
(write-behind) is not durable until then, and is durable after."""

import hashlib
import threading

import numpy as np

from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.disk.format import Namespace, PayloadKind, slot_bytes_for
from sglang_glm_ext.l3.engine import store as store_mod
from sglang_glm_ext.l3.engine.store import L3Store

PB = 4096 - 128
K = PayloadKind.TARGET_KV
NS = Namespace("m", "fp8", "page_first", 64, 0, 2, "r")


def _cfg(tmp_path) -> L3Config:
    return L3Config.from_dict({"deployment_id": "slow", "disks": [{"path": str(tmp_path / "d"),
                                                                   "budget": 64 * slot_bytes_for(PB)}],
                               "index": {"path": str(tmp_path / "i")}})


def test_a_slow_disk_delays_durability_not_the_acknowledgement(tmp_path, monkeypatch):
    # The slow disk's write also blocks on a gate the test holds, so "acknowledged before the write" and "durable
    # only after it" are proved by the order of events, not by how long the 400 ms sleep looked on this machine.
    delays, gate, entered, written = [], threading.Event(), threading.Event(), threading.Event()
    real_slow_write = store_mod.slow_write

    def gated_slow_write(delay_s):
        delays.append(delay_s)
        slow = real_slow_write(delay_s)

        def pwrite(fd, data, offset):
            entered.set()
            gate.wait(60)  # hang guard: a spill that waited for its write returns after this, and fails below
            n = slow(fd, data, offset)
            written.set()
            return n

        return pwrite

    monkeypatch.setattr(store_mod, "slow_write", gated_slow_write)
    monkeypatch.setenv("SGLANG_GLM_EXT_L3_TEST_WRITE_DELAY_MS", "400")
    key = hashlib.sha256(b"p").hexdigest()
    page = np.full(PB, 7, np.uint8)
    s = L3Store.open(_cfg(tmp_path), rank=0, namespace=NS, page_bytes={K: PB})
    try:
        assert delays == [0.4]  # the env var put the slow disk under this store's slab
        assert s.spill(K, [key], [page]) == [True]  # write-behind: acknowledged at once
        assert not written.is_set(), "spill waited for the slow disk's write"
        assert entered.wait(30), "the write-back never reached the slow disk"
        assert s.exists(K, [key], include_staged=False) == 0  # not durable while the disk sleeps
        assert not s.flush(0.2) and not written.is_set()  # cannot be durable: the write is held at the gate
        gate.set()
        assert s.flush(30) and s.exists(K, [key], include_staged=False) == 1
        assert written.is_set()  # durable only after the slow write completed
        out = np.zeros(PB, np.uint8)
        assert s.reload_into(K, [key], [out]) == [True] and (out == 7).all()
    finally:
        gate.set()
        s.close()
