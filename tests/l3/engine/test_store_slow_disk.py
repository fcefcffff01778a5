"""SGLANG_GLM_EXT_L3_TEST_WRITE_DELAY_MS: a slow disk on demand, for the server tests that must kill a server in the
middle of its write-back. Every slab write of a store opened with it sleeps that long; a page acknowledged by spill
(write-behind) is not durable until then, and is durable after."""

import hashlib
import time

import numpy as np

from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.disk.format import Namespace, PayloadKind, slot_bytes_for
from sglang_glm_ext.l3.engine.store import L3Store

PB = 4096 - 128
K = PayloadKind.TARGET_KV
NS = Namespace("m", "fp8", "page_first", 64, 0, 2, "r")


def _cfg(tmp_path) -> L3Config:
    return L3Config.from_dict({"deployment_id": "slow", "disks": [{"path": str(tmp_path / "d"),
                                                                   "budget": 64 * slot_bytes_for(PB)}],
                               "index": {"path": str(tmp_path / "i")}})


def test_a_slow_disk_delays_durability_not_the_acknowledgement(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_GLM_EXT_L3_TEST_WRITE_DELAY_MS", "400")
    key = hashlib.sha256(b"p").hexdigest()
    page = np.full(PB, 7, np.uint8)
    s = L3Store.open(_cfg(tmp_path), rank=0, namespace=NS, page_bytes={K: PB})
    try:
        t0 = time.monotonic()
        assert s.spill(K, [key], [page]) == [True]  # write-behind: acknowledged at once
        assert time.monotonic() - t0 < 0.3
        assert s.exists(K, [key], include_staged=False) == 0  # not durable while the disk sleeps
        assert s.flush(30) and s.exists(K, [key], include_staged=False) == 1
        assert time.monotonic() - t0 >= 0.4
        out = np.zeros(PB, np.uint8)
        assert s.reload_into(K, [key], [out]) == [True] and (out == 7).all()
    finally:
        s.close()
