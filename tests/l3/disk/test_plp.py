"""Power-loss protection verdicts from a fake sysfs: the kernel's word, the operator's word, never latency alone."""

import os

import pytest

from sglang_glm_ext.l3.disk.slab import PlpReport, check_plp, probe_plp
from sglang_glm_ext.l3.disk.plp import PlpRequiredError


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text + "\n")


def _disk(sysfs, rel, write_cache):
    d = os.path.join(sysfs, "devices", rel)
    os.makedirs(os.path.join(d, "queue"), exist_ok=True)
    if write_cache is not None:
        _write(os.path.join(d, "queue", "write_cache"), write_cache)
    return d


def _link(sysfs, majmin, target):
    os.makedirs(os.path.join(sysfs, "dev", "block"), exist_ok=True)
    os.symlink(target, os.path.join(sysfs, "dev", "block", majmin))


def _probe(tmp_path, majmin, **kw):
    major, minor = map(int, majmin.split(":"))
    kw.setdefault("latency_probe", False)
    return probe_plp(tmp_path / "slabs", sysfs_root=str(tmp_path / "sys"), st_dev=os.makedev(major, minor), **kw)


@pytest.fixture
def sysfs(tmp_path):
    return str(tmp_path / "sys")


@pytest.mark.parametrize("cache, safe", [("write through", True), ("write back", False), (None, None)])
def test_plain_disk_write_cache(tmp_path, sysfs, cache, safe):
    _link(sysfs, "8:0", _disk(sysfs, "pci0/sda", cache))
    report = _probe(tmp_path, "8:0")
    assert report.safe is safe
    assert "sda" in report.devices


def test_partition_resolves_to_its_disk(tmp_path, sysfs):
    disk = _disk(sysfs, "pci0/nvme/nvme0/nvme0n1", "write through")
    part = os.path.join(disk, "nvme0n1p2")
    _write(os.path.join(part, "partition"), "2")
    os.symlink("../../nvme0", os.path.join(disk, "device"))
    _write(os.path.join(sysfs, "class", "nvme", "nvme0", "model"), "SAMSUNG MZQL2")
    _link(sysfs, "259:2", part)
    report = _probe(tmp_path, "259:2")
    assert report.safe is True and report.devices == {"nvme0n1": "write through"}
    assert any("SAMSUNG MZQL2" in r for r in report.reasons)


def test_nvme_with_volatile_write_cache_is_unsafe(tmp_path, sysfs):
    _link(sysfs, "259:0", _disk(sysfs, "pci0/nvme/nvme1/nvme1n1", "write back"))
    assert _probe(tmp_path, "259:0").safe is False


@pytest.mark.parametrize("second, safe", [("write through", True), ("write back", False), (None, None)])
def test_dm_or_md_needs_every_member_safe(tmp_path, sysfs, second, safe):
    a = _disk(sysfs, "pci0/sda", "write through")
    b = _disk(sysfs, "pci0/sdb", second)
    dm = os.path.join(sysfs, "devices", "virtual", "block", "dm-0")
    os.makedirs(os.path.join(dm, "slaves"))
    os.symlink(a, os.path.join(dm, "slaves", "sda"))
    os.symlink(b, os.path.join(dm, "slaves", "sdb"))
    _link(sysfs, "253:0", dm)
    report = _probe(tmp_path, "253:0")
    assert report.safe is safe and set(report.devices) == {"sda", "sdb"}


def test_tmpfs_is_unknown(tmp_path):
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "mountinfo").write_text(
        "22 1 0:21 / / rw - ext4 /dev/nonexistent rw\n"
        f"30 22 0:30 / {tmp_path} rw,nosuid - tmpfs tmpfs rw\n")
    report = probe_plp(tmp_path / "slabs", sysfs_root=str(tmp_path / "sys"), proc_root=str(tmp_path / "proc"),
                       st_dev=os.makedev(0, 30), latency_probe=False)
    assert report.safe is None and "tmpfs" in report.reasons[0]


def test_operator_override_wins(tmp_path, sysfs):
    _link(sysfs, "8:0", _disk(sysfs, "pci0/sda", "write back"))
    assert _probe(tmp_path, "8:0", plp="assume_safe").safe is True
    assert _probe(tmp_path, "8:0", plp="assume_unsafe").safe is False
    with pytest.raises(ValueError, match="assume_safe"):
        _probe(tmp_path, "8:0", plp="yes")


def test_latency_probe_is_advisory_only(tmp_path, sysfs):
    _link(sysfs, "8:0", _disk(sysfs, "pci0/sda", None))
    report = _probe(tmp_path, "8:0", latency_probe=True, samples=3)
    assert report.fsync_median_us is not None and report.fsync_median_us > 0
    assert report.safe is None  # however fast the flush was
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".l3-plp-probe")]  # probe file cleaned up


def test_require_plp_refuses_unknown_and_unsafe():
    for safe in (None, False):
        report = PlpReport(path="/x", mode="auto", safe=safe, reasons=["sda: write_cache unreadable"])
        with pytest.raises(PlpRequiredError, match="assume_safe"):
            check_plp(report, require_plp=True)
        check_plp(report, require_plp=False)
    check_plp(PlpReport(path="/x", mode="auto", safe=True), require_plp=True)


def test_real_machine_probe_runs(tmp_path):
    """On this machine's own /sys and /proc: the verdict is the auto policy applied to the devices it read (any
    write back: unsafe; every one write through: safe; else, or no block device at all: unknown), and the advisory
    latency probe ran on the path."""
    report = probe_plp(tmp_path, samples=3)
    caches = list(report.devices.values())
    want = False if "write back" in caches else True if caches and set(caches) == {"write through"} else None
    assert report.path == str(tmp_path) and report.safe is want, report.summary()
    assert report.fsync_median_us is not None and report.fsync_median_us > 0 and report.reasons
