"""Issue 20, item 8: a write burst through SGLang's own backup thread, larger than the L3 staging.

Staging full used to answer SGLang False for the overflow pages: SGLang logs "Write page to storage: N pages
failed" for each such batch and drops the rest of that operation (``cache_controller.py`` ``_page_backup``: a False
batch ends the operation; nothing retries it), so those pages were simply not in L3. The backup thread runs off the
scheduler, so the backend waits there, bounded (``queues.wait_ms``), for the writer to make room: every page of the
burst reaches L3, SGLang logs nothing, and a drop happens only when the disk stalls past the bound -- counted
(``dropped_writes{reason="staging"}``), one SGLang line per bound at most. ``wait_ms = 0`` keeps the old drop, as
the comparison here shows.
"""

import hashlib
import logging
import os
import threading

import pytest

from l3kit import write_config

pytestmark = pytest.mark.usefixtures("standins", "sglang_state")  # its stacks publish server args

PS = 64
OPS, PAGES = 6, 16  # 96 pages in a burst, staging holds 8


def _stack(cfg):
    from sglang_glm_ext.l3.demo import stack

    spec = stack.StackSpec(layers=2, device_pages=64)
    sa = stack.publish_server_args(spec, storage_backend=None, extra_config=None,
                                   plugin_values={"enable_cp_l3": True, "cp_l3_config": cfg})
    return stack.DsaStack.build(spec, sa)


def _config(tmp_path, name, wait_ms=None):
    from sglang_glm_ext.l3.disk.format import slot_bytes_for

    cfg = write_config(tmp_path, name=name)
    page = 64 * 2 * 656  # KV page of this stack: 64 tokens x 2 layers x 656 B
    text = open(cfg).read().replace('staging_bytes = "256MiB"', f"staging_bytes = {8 * slot_bytes_for(page)}")
    if wait_ms is not None:
        text = text.replace("wait_ms = 5000", f"wait_ms = {wait_ms}")
    open(cfg, "w").write(text)
    return cfg


def _burst(st, caplog, monkeypatch, drop):
    """OPS write-back operations handed to SGLang's backup thread at once (host pages reused, new keys each), while
    the disk holds every write: the burst overflows staging whatever the machine's speed. ``drop`` (wait_ms = 0):
    every operation is answered while the disk still holds, then it is let go. Otherwise the disk is let go once a
    write-back waits for room, with nothing dropped so far: the backpressure, seen rather than timed."""
    import torch

    from sglang_glm_ext.l3.engine.staging import StagedPages

    be, cc = st.backend, st.controller
    gate, waited = threading.Event(), threading.Event()

    def stalled(fd, data, offset):
        gate.wait(120)  # a hang guard only: the test opens the gate
        return os.pwrite(fd, data, offset)

    real_wait_room = StagedPages.wait_room

    def wait_room(self, deadline):
        waited.set()
        return real_wait_room(self, deadline)

    monkeypatch.setattr(StagedPages, "wait_room", wait_room)
    for kind in list(be.store.diagnostics().kinds()):
        be.store.slab(kind).inject_write_fault(stalled)
    caplog.clear()
    caplog.set_level(logging.WARNING, logger="sglang.srt.managers.cache_controller")
    keys = []
    try:
        for op in range(OPS):
            hashes = [hashlib.sha256(f"burst{op}:{p}".encode()).hexdigest() for p in range(PAGES)]
            keys += hashes
            cc.write_storage(torch.arange(PAGES * PS, dtype=torch.int64), [], hash_value=hashes)
        if drop:
            acked = [cc.ack_backup_queue.get(timeout=120) for _ in range(OPS)]
            assert not waited.is_set()  # wait_ms = 0: no write-back waited
        else:
            assert waited.wait(120), "no write-back waited for room: the burst never filled staging"
            assert be.store.stats()["dropped_staging"] == 0
    finally:
        gate.set()
    if not drop:
        acked = [cc.ack_backup_queue.get(timeout=120) for _ in range(OPS)]
    assert be.store.flush(120)
    from sglang_glm_ext.l3.hicache.keys import storage_key

    kind = be.plan.kv.kind
    in_l3 = sum(be.store.exists(kind, [storage_key(k)], include_staged=False) for k in keys)
    failed_lines = [r for r in caplog.records if "Write page to storage" in r.getMessage()]
    return in_l3, sum(op.completed_tokens for op in acked) // PS, failed_lines, be.store.stats()


def test_a_burst_bigger_than_staging_reaches_l3_whole_and_sglang_logs_nothing(tmp_path, caplog, monkeypatch):
    # wait_ms far above the default: here the bound is a hang guard, so a slow drain on a loaded machine drops nothing
    st = _stack(_config(tmp_path, "bp", wait_ms=120_000))
    try:
        in_l3, acked, lines, stats = _burst(st, caplog, monkeypatch, drop=False)
        assert stats["staging_cap_bytes"] < OPS * PAGES * stats["staging_cap_bytes"] // 8  # the burst overflows it
        assert in_l3 == acked == OPS * PAGES, (in_l3, acked)  # the hit rate a burst leaves in L3: all of it
        assert lines == [] and stats["dropped_staging"] == 0
        assert stats["staging_peak_bytes"] <= stats["staging_cap_bytes"]  # memory stayed at the cap
    finally:
        st.close()


def test_wait_ms_0_keeps_the_drop_and_it_is_counted(tmp_path, caplog, monkeypatch):
    st = _stack(_config(tmp_path, "drop", wait_ms=0))
    try:
        in_l3, acked, lines, stats = _burst(st, caplog, monkeypatch, drop=True)
        assert in_l3 < OPS * PAGES and stats["dropped_staging"] > 0  # pages simply not in L3, counted
        assert acked <= in_l3 + stats["dropped_staging"]
        assert lines  # SGLang's own line for each failed batch: what the default avoids
        from sglang_glm_ext.l3.hicache import metrics

        got = {(n, lab): v for n, lab, v in metrics.store_samples(stats)}
        assert got[("sglang:cp_l3_dropped_writes_total", (("reason", "staging"),))] == stats["dropped_staging"]
    finally:
        st.close()
