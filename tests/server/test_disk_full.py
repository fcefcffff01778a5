"""The L3 disk filling up while serving: every request is still answered, the misses are counted, the server stays
up, and the store stays consistent. The disk is a small tmpfs (root); another process fills it after the server
attached. (The slot leak on a full disk is fixed by the L3 engine-defects issue, 20.)"""

import os
import subprocess

import pytest

from sglang_glm_ext.cpu_serve import run, served

from .conftest import fsck, l3_args, l3_config, send_all, start, workload

pytestmark = [pytest.mark.server, pytest.mark.timeout(1200)]


@pytest.fixture
def small_disk(tmp_path):
    path = tmp_path / "small"
    path.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(path)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"needs root to mount a small tmpfs as the L3 disk: {proc.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _fill(path):
    with open(os.path.join(path, "filler"), "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass


def test_requests_are_answered_and_misses_counted_while_the_disk_fills(glm5_model, tmp_path, small_disk):
    cfg = l3_config(str(small_disk), budget="4MiB")
    srv = start(glm5_model, str(tmp_path / "server.log"), l3_args(cfg))
    try:
        first = send_all(srv, workload(2, 1, seed=11))
        served.wait_counter_settled(srv.url, run.SPILL)
        _fill(str(small_disk))
        # Far more distinct prefixes than 4 MiB of slots hold (about 100 GLM-5 pages), on a full filesystem.
        later = send_all(srv, workload(6, 2, seed=12, system_chars=1400))
        served.wait_counter_settled(srv.url, run.SPILL)
        m = served.scrape(srv.url)
        assert srv.alive()
        assert len(first) + len(later) == 2 + 12 and all(len(r.output_ids) == 8 for r in first + later)
        counted = (m.get("sglang:cp_l3_dropped_writes_total", 0) + m.get("sglang:cp_l3_write_errors_total", 0)
                   + m.get("sglang:cp_l3_gc_reclaimed_total", 0) + m.get("sglang:cp_l3_index_errors_total", 0))
        assert counted > 0, {k: v for k, v in m.items() if k.startswith("sglang:cp_l3_")}
        assert m.get("sglang:cp_l3_corrupt_pages_total", 0) == 0
        assert m.get("sglang:cp_l3_used_slots", 0) <= m.get("sglang:cp_l3_total_slots", 0)
    finally:
        srv.stop()
    os.remove(os.path.join(small_disk, "filler"))
    report = fsck(cfg)
    assert report["rc"] == 0 and report["corrupt"] == 0, report
