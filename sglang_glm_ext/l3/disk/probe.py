"""Prove that an L3 directory can be used before the model loads: what the engine will do there, done once, small.

The store creates ``<disk>/<deployment>/rank<r>`` (and the index directory) owner-only, then writes slabs there,
with O_DIRECT where configured. A path that cannot take that (under a regular file, on a read-only or pseudo file
system, not writable by the serving user, a full disk) used to pass every check and fail at attach, after the model
had loaded. :func:`probe_dir` does the same kind of work in miniature: it creates a private directory where the
first missing one would go (or uses the directory when it exists), writes and fdatasyncs one aligned 4 KiB block
there (O_DIRECT unless ``direct`` is off), and removes both. Nothing it makes stays; existing files are never
opened. Decisions come from the attempt, not from ``os.access``, which says yes to everything for root.

Each refusal is one line: the config key, the path, what is wrong, and the fix.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import tempfile
from dataclasses import dataclass

__all__ = ["PathProbe", "probe_dir", "probe_config", "fs_of", "PSEUDO_FS"]

BLOCK = 4096
PREFIX = ".glm_ext_probe_"  # neither a slab (``*.slab``) nor a sidecar: fsck and the engine never read it

# Kernel file systems that hold no files of their own: a path there is a mistake, refused without writing to it
# (the free-space check used to refuse /proc for having "0 B free", which sends the operator the wrong way).
PSEUDO_FS = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "configfs",
                       "pstore", "bpf", "devpts", "mqueue", "fusectl", "efivarfs", "binfmt_misc", "nsfs"})


@dataclass(frozen=True)
class PathProbe:
    """What probing one configured directory found. ``problem`` is '' when the engine can use it."""

    key: str  # the config key at fault: "disks[0].path", "index.path"
    path: str  # the configured path
    target: str  # the directory the engine writes in (a slab directory, the index directory)
    exists: bool  # the configured path is a directory already
    o_direct: bool | None  # an O_DIRECT write went through; None: not tried (direct off, or nothing could be written)
    o_direct_detail: str
    free_bytes: int | None  # of the file system the target is (or will be) on
    problem: str


def fs_of(path: str, mountinfo: str = "/proc/self/mountinfo") -> tuple[str, str]:
    """(file system type, mount point) that ``path`` (an existing path) lives on; ('', '') where unknown."""
    real = os.path.realpath(path)
    best = ("", "")
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return best
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])  # the kernel's \040
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[1]):
            best = (right.split()[0], point)
    return best


def _existing(path: str) -> str:
    """``path`` or its nearest ancestor that exists (as any kind of file: a regular file there blocks the path)."""
    p = path
    while not os.path.lexists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def _who() -> str:
    uid = os.geteuid()
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _refusal(key: str, path: str, where: str, exc: OSError) -> str:
    """One line for an OSError met while creating or writing in ``where``: what, why, and the fix."""
    why = exc.strerror or str(exc)
    if exc.errno == errno.EROFS:
        fs, point = fs_of(where)
        return (f"{key} {path} is not writable: the file system at {point or where} is mounted read-only; point "
                f"{key} at a writable file system, or remount {point or where} read-write")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (f"{key} {path} is not writable by {_who()}: cannot create a file in {where} ({why}); give that "
                f"user write access to {where}, or point {key} at a directory it owns")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"{key} {path}: cannot write a 4 KiB file in {where}: its file system is full ({why}); free space "
                f"there, or point {key} at another disk")
    return (f"{key} {path}: cannot write a file in {where} ({why}); point {key} at a writable directory on a "
            f"local disk")


def _write_block(key: str, path: str, directory: str, direct: str) -> tuple[bool | None, str, str]:
    """Write and fdatasync one aligned block in ``directory``, then remove it: (o_direct, detail, problem)."""
    fd, name = tempfile.mkstemp(prefix=PREFIX, dir=directory)
    try:
        ok, detail = None, "direct_io = off: buffered writes"
        if direct != "off":
            ok, detail = _try_o_direct(name)
            if ok is False and direct == "on":
                return ok, detail, (f"{key} {path} refuses O_DIRECT writes ({detail}) and direct_io = \"on\" "
                                    f"requires them; set direct_io = \"auto\" (buffered writes where O_DIRECT is "
                                    f"refused), or put {key} on a file system that takes O_DIRECT")
        if not ok:  # the buffered path the slab falls back to must work
            os.pwrite(fd, bytes(BLOCK), 0)
            os.fdatasync(fd)
        return ok, detail, ""
    finally:
        os.close(fd)
        os.unlink(name)


def _try_o_direct(name: str) -> tuple[bool, str]:
    """(True, '') when an aligned O_DIRECT write and fdatasync of ``name`` work; (False, why) when the file system
    refuses O_DIRECT (the slab then falls back to buffered writes). Any other error propagates."""
    try:
        dfd = os.open(name, os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return False, "O_DIRECT refused (EINVAL; tmpfs or similar): buffered + fdatasync fallback"
    buf = mmap.mmap(-1, BLOCK)  # page-aligned by construction
    try:
        try:
            os.pwrite(dfd, buf, 0)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            return False, f"O_DIRECT write refused ({exc.strerror}): buffered + fdatasync fallback"
        os.fdatasync(dfd)
        return True, ""
    finally:
        buf.close()
        os.close(dfd)


def probe_dir(key: str, path: str, target: str | None = None, *, direct: str = "auto") -> PathProbe:
    """Prove that the engine can create ``target`` (default ``path``; a directory at or below the configured
    ``path``) and write there. ``direct``: the config's direct_io ("auto" | "on" | "off")."""
    path, target = os.path.abspath(path), os.path.abspath(target or path)
    exists = os.path.isdir(path)

    def found(problem: str, o_direct=None, detail: str = "", free=None) -> PathProbe:
        return PathProbe(key, path, target, exists, o_direct, detail, free, problem)

    if os.path.lexists(path) and not exists:
        return found(f"{key} {path} exists and is not a directory; point {key} at a directory")
    base = _existing(target)
    if not os.path.isdir(base):
        return found(f"{key} {path}: cannot create {target}: {base} is not a directory; point {key} at a "
                     f"directory, or move {base} away")
    fs, point = fs_of(base)
    if fs in PSEUDO_FS:
        return found(f"{key} {path} is on the kernel's {fs} file system (mounted at {point}), not a disk; point "
                     f"{key} at a directory on a local disk")
    free = _free(base)
    made = None
    try:
        if base != target:  # what the engine would create: try its first level, privately, and take it back
            made = where = tempfile.mkdtemp(prefix=PREFIX, dir=base)
        else:
            where = target
        o_direct, detail, problem = _write_block(key, path, where, direct)
    except OSError as exc:
        return found(_refusal(key, path, base, exc), free=free)
    finally:
        if made:
            os.rmdir(made)
    return found(problem, o_direct, detail, free)


def _free(directory: str) -> int | None:
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def probe_config(cfg) -> list[PathProbe]:
    """Every directory an L3 config's engine writes in: each rank's slab directory on each disk (the disk's slabs
    go there), then the index directory; a directory probed once. The disks' probes come first, in disk order."""
    plan = [(f"disks[{i}].path", d.path, cfg.slab_dir(r, i) if r is not None else d.path, cfg.direct_io)
            for i, d in enumerate(cfg.disks) for r in (cfg.ranks_on_disk(i) or [None])]
    plan.append(("index.path", cfg.index_path, cfg.index_path, "off"))  # LMDB writes through the page cache
    seen: dict[tuple[str, str], PathProbe] = {}
    for key, path, target, direct in plan:
        where = _existing(os.path.abspath(target))  # ranks whose directories do not exist yet share one probe
        if (key, where) not in seen:
            seen[(key, where)] = probe_dir(key, path, target, direct=direct)
    return list(seen.values())
