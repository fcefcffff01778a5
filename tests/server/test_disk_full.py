"""The L3 disk filling up while serving: every request is still answered, the full disk is felt by L3 and counted
(its index commits fail), the server stays up, writes resume once space comes back, and the store stays consistent.

The disk is a small loop-mounted ext4 image (root and a loop device needed): tmpfs is no stand-in, it never fails an
LMDB commit the way a block file system does (tests/l3/engine/test_full_disk.py says more). Another process fills it
after the server attached. (The slot leak on a full disk is fixed by the L3 engine-defects issue, 20.)"""

import errno
import os
import re
import shutil
import subprocess

import pytest

from sglang_glm_ext.cpu_serve import run, served

from .conftest import fsck, l3_args, l3_config, send_all, start, workload

pytestmark = [pytest.mark.server, pytest.mark.timeout(1500)]


@pytest.fixture
def small_disk(tmp_path):
    """A 64 MiB ext4 file system on a loop device (no blocks reserved for root: full is full for this process)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a loop-device ext4 image as the L3 disk")
    for tool in ("mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool} to make the small ext4 L3 disk")
    img, mnt = tmp_path / "fs.img", tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", "64M", str(img)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(img)], check=True, capture_output=True)
    r = subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mounting a loop device was refused here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(path) -> None:
    fd = os.open(os.path.join(path, "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 20, 4096):
            buf = b"\0" * chunk
            while True:
                try:
                    if os.write(fd, buf) < chunk:
                        break
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
                    break
        os.fsync(fd)
    finally:
        os.close(fd)
    st = os.statvfs(path)
    assert st.f_bavail * st.f_frsize < 64 * 1024, "the file system is not full"


def _labelled(url: str, name: str) -> dict[str, float]:
    """One metric's samples by their distinguishing label (reason / path), summed over the rank labels."""
    out: dict[str, float] = {}
    text = served.scrape_text(url)
    for m in re.finditer(rf'^{re.escape(name)}\{{([^}}]*)\}} (\S+)$', text, re.M):
        label = re.search(r'(?:reason|path)="([^"]*)"', m.group(1))
        key = label.group(1) if label else ""
        out[key] = out.get(key, 0.0) + float(m.group(2))
    return out


def test_requests_are_answered_the_full_disk_is_counted_and_writes_resume(glm5_model, tmp_path, small_disk):
    cfg = l3_config(str(small_disk), budget="4MiB")
    srv = start(glm5_model, str(tmp_path / "server.log"), l3_args(cfg))
    try:
        first = send_all(srv, workload(2, 1, seed=11))
        served.wait_counter_settled(srv.url, run.SPILL)
        _fill(str(small_disk))
        # Far more distinct prefixes than 4 MiB of slots hold (about 100 GLM-5 pages), on a full filesystem.
        later = send_all(srv, workload(6, 2, seed=12, system_chars=1400))
        served.wait_counter_settled(srv.url, run.SPILL)
        full = served.scrape(srv.url)
        index_errors = _labelled(srv.url, "sglang:cp_l3_index_errors_total")
        assert srv.alive()
        assert len(first) + len(later) == 2 + 12 and all(len(r.output_ids) == 8 for r in first + later)
        # The full disk itself was felt and counted (not merely GC making room in a small budget).
        felt = index_errors.get("io", 0.0) + full.get("sglang:cp_l3_write_errors_total", 0.0)
        assert felt > 0, {k: v for k, v in full.items() if k.startswith("sglang:cp_l3_")}
        assert full.get("sglang:cp_l3_corrupt_pages_total", 0) == 0
        assert full.get("sglang:cp_l3_used_slots", 0) <= full.get("sglang:cp_l3_total_slots", 0)
        # Space comes back: new prefixes are written again and the write path says so.
        os.remove(os.path.join(small_disk, "filler"))
        spilled = full.get(run.SPILL, 0.0)
        again = send_all(srv, workload(3, 1, seed=13, system_chars=1400))
        assert len(again) == 3 and srv.alive()
        assert served.wait_counter_settled(srv.url, run.SPILL) > spilled
        failing = _labelled(srv.url, "sglang:cp_l3_write_path_failing")
        assert failing and all(v == 0 for v in failing.values()), failing
    finally:
        srv.stop()
    report = fsck(cfg)
    assert report["rc"] == 0 and report["corrupt"] == 0, report
