"""Is a disk power-loss safe? Combine what the kernel reports with what the operator declares.

Policy (``probe_plp``):
  * ``plp="assume_safe"`` / ``"assume_unsafe"``: the operator's word decides (they know the drive model).
  * ``plp="auto"``: every block device under the path (partitions resolved to their disk, dm/md resolved to
    their members) must report ``queue/write_cache == "write through"`` (no volatile cache, or one the drive
    protects; for NVMe the kernel derives it from the controller's VWC bit) -> safe. Any "write back" -> unsafe.
    Anything unreadable, or no block device at all (tmpfs, network FS) -> unknown (``safe is None``).
  * The fdatasync latency probe is advisory only: a fast flush may mean PLP or a drive that ignores flushes
    (virtio disks do both), so it never marks a disk safe.
``check_plp(report, require_plp=True)`` refuses anything not known safe.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field

from .space import nearest_dir

PLP_MODES = ("auto", "assume_safe", "assume_unsafe")


class PlpRequiredError(RuntimeError):
    pass


@dataclass
class PlpReport:
    path: str
    mode: str
    safe: "bool | None"
    reasons: "list[str]" = field(default_factory=list)
    devices: "dict[str, str]" = field(default_factory=dict)  # disk name -> write_cache ("" when unreadable)
    fsync_median_us: "float | None" = None

    def summary(self) -> str:
        verdict = {True: "safe", False: "unsafe", None: "unknown"}[self.safe]
        return f"{self.path}: power-loss {verdict} ({'; '.join(self.reasons)})"


def _read(path: str) -> "str | None":
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _mount_source(path: str, proc_root: str) -> "tuple[str, str] | None":
    """(fstype, source) of the mount holding ``path``, from mountinfo (longest mount-point prefix wins)."""
    text = _read(os.path.join(proc_root, "self/mountinfo"))
    if not text:
        return None
    best, best_len = None, -1
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 2:
            continue
        mnt = fields[4].replace("\\040", " ")
        if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) > best_len:
            best, best_len = (rfields[0], rfields[1]), len(mnt)
    return best


def _leaf_disks(devdir: str, sysfs_root: str, depth: int = 0) -> "list[str]":
    """Physical disk directories under a sysfs block device dir (partition -> disk, dm/md -> members)."""
    if depth > 8:
        return []
    devdir = os.path.realpath(devdir)
    if os.path.exists(os.path.join(devdir, "partition")):
        devdir = os.path.dirname(devdir)
    slaves_dir = os.path.join(devdir, "slaves")
    slaves = sorted(os.listdir(slaves_dir)) if os.path.isdir(slaves_dir) else []
    if not slaves:
        return [devdir]
    out: list[str] = []
    for s in slaves:
        out.extend(_leaf_disks(os.path.join(slaves_dir, s), sysfs_root, depth + 1))
    return out


def _sysfs_verdict(path: str, sysfs_root: str, proc_root: str, st_dev: "int | None",
                   report: PlpReport) -> "bool | None":
    dev = os.stat(nearest_dir(path)).st_dev if st_dev is None else st_dev
    major, minor = os.major(dev), os.minor(dev)
    if major == 0:  # anonymous device: tmpfs, overlay, btrfs, NFS... ask mountinfo for the real source
        mount = _mount_source(os.path.abspath(path), proc_root)
        if mount is None:
            report.reasons.append("not on a block device and no mount information")
            return None
        fstype, source = mount
        if fstype in ("tmpfs", "ramfs"):
            report.reasons.append(f"{fstype}: contents do not survive power loss or reboot")
            return None
        try:
            rdev = os.stat(source).st_rdev
        except OSError:
            report.reasons.append(f"{fstype} on {source}: no local block device to inspect")
            return None
        major, minor = os.major(rdev), os.minor(rdev)
    devdir = os.path.join(sysfs_root, "dev/block", f"{major}:{minor}")
    if not os.path.exists(devdir):
        report.reasons.append(f"block device {major}:{minor} not found in {sysfs_root}")
        return None
    verdicts = []
    for disk in _leaf_disks(devdir, sysfs_root):
        name = os.path.basename(disk)
        wc = _read(os.path.join(disk, "queue/write_cache"))
        report.devices[name] = wc or ""
        if name.startswith("nvme"):
            ctrl = os.path.basename(os.path.realpath(os.path.join(disk, "device")))
            model = _read(os.path.join(sysfs_root, "class/nvme", ctrl, "model"))
            if model:
                report.reasons.append(f"{name}: NVMe controller {ctrl} model {model!r}; write_cache mirrors its VWC bit")
        if wc == "write through":
            report.reasons.append(f"{name}: write_cache=write through (no volatile write cache)")
            verdicts.append(True)
        elif wc == "write back":
            report.reasons.append(f"{name}: write_cache=write back (volatile cache; acked writes can be lost)")
            verdicts.append(False)
        else:
            report.reasons.append(f"{name}: write_cache unreadable")
            verdicts.append(None)
    if False in verdicts:
        return False
    if verdicts and all(v is True for v in verdicts):
        return True
    return None


def fsync_latency_us(directory: str, samples: int = 8) -> float:
    """Median microseconds of (4 KiB write + fdatasync) on a temp file in ``directory`` (O_DIRECT if allowed)."""
    from .aligned import AlignedBuffer

    fd, tmp = tempfile.mkstemp(prefix=".l3-plp-probe-", dir=directory)
    buf = AlignedBuffer(4096)
    try:
        try:
            import fcntl
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
        except OSError:
            pass
        times = []
        for i in range(samples):
            buf.view[:8] = i.to_bytes(8, "little")
            t0 = time.perf_counter()
            os.pwrite(fd, buf.view, 0)
            os.fdatasync(fd)
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)
    finally:
        os.close(fd)
        os.unlink(tmp)
        buf.close()


def probe_plp(path, *, plp: str = "auto", sysfs_root: str = "/sys", proc_root: str = "/proc",
              latency_probe: bool = True, samples: int = 8, st_dev: "int | None" = None) -> PlpReport:
    """Report whether writes acknowledged by fdatasync under ``path`` survive power loss.

    ``sysfs_root``/``proc_root``/``st_dev`` are injectable so tests can describe any device topology.
    """
    if plp not in PLP_MODES:
        raise ValueError(f"plp must be one of {', '.join(PLP_MODES)}, got {plp!r}")
    path = os.path.abspath(os.fspath(path))
    report = PlpReport(path=path, mode=plp, safe=None)
    try:
        sysfs = _sysfs_verdict(path, sysfs_root, proc_root, st_dev, report)
    except OSError as e:
        report.reasons.append(f"sysfs inspection failed: {e}")
        sysfs = None
    if plp == "assume_safe":
        report.safe = True
        report.reasons.insert(0, "operator declared assume_safe")
    elif plp == "assume_unsafe":
        report.safe = False
        report.reasons.insert(0, "operator declared assume_unsafe")
    else:
        report.safe = sysfs
    if latency_probe:
        target = nearest_dir(path)
        try:
            report.fsync_median_us = fsync_latency_us(target, samples)
            note = f"advisory: 4 KiB write+fdatasync median {report.fsync_median_us:.0f} us"
            if sysfs is False and report.fsync_median_us < 100:
                note += " (fast for a volatile cache: PLP, or a device that ignores flushes; latency cannot tell)"
            report.reasons.append(note)
        except OSError as e:
            report.reasons.append(f"advisory latency probe failed: {e}")
    return report


def check_plp(report: PlpReport, require_plp: bool) -> None:
    """Refuse (PlpRequiredError) when ``require_plp`` and the disk is not known power-loss safe."""
    if require_plp and report.safe is not True:
        raise PlpRequiredError(
            f"require_plp is set but {report.summary()}. If this drive has power-loss protection, declare "
            f"plp = \"assume_safe\" for it; otherwise set require_plp = false to accept losing recently "
            f"acknowledged pages on power loss (they become misses, never wrong bytes).")
