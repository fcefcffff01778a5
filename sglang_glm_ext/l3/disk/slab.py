"""One preallocated slab file per (payload kind, disk, rank): fixed-size slots, single-transfer I/O.

Decided once at ``DiskSlab.open`` (then the hot path has no decisions left): the geometry, the exclusive lock,
preallocation, and the I/O mode -- O_DIRECT where the filesystem accepts it, else buffered I/O + fdatasync
(``io_mode`` / ``fallback_reason`` say which and why).

Existing files: a slab whose size is exactly ``slot_bytes * num_slots`` is reopened as is (its blobs are the
durable tier). With ``resize=True`` (the store: a budget change keeps the page size) a slab whose size is another
multiple of ``slot_bytes`` is resized in place -- the slot boundaries do not move, so the slots that remain keep
their blobs (the store drops the entries of slots past a shrunk end); a size that is no multiple (a file cut short)
loses its partial last slot as well. Without ``resize`` any other size is a ``SlabGeometryError``. The store gives
another slot size its own file (slab_dir.py), so no slot boundary is ever reinterpreted.

``prealloc_slots``: only the first slots are preallocated (the rest of the file is sparse until :meth:`reserve`
allocates it): a slab that shares its budget with an older geometry's slab holds only what the budget leaves it.
:meth:`punch` gives a freed slot's blocks back to the file system (``FALLOC_FL_PUNCH_HOLE``).

Preallocation uses fallocate(2) mode 0 (what posix_fallocate does on ext4/xfs), called directly: glibc's
posix_fallocate silently emulates on filesystems without fallocate by writing one byte per 4 KiB block, which
on a multi-TB slab is a startup measured in hours. Unsupported -> ftruncate (sparse), reported in ``prealloc``.

Fault injection (tests): every write goes through ``self._pwrite(fd, data, offset) -> int`` (default
``os.pwrite``). ``slab.inject_write_fault(fail_write(errno.ENOSPC))``, ``torn_write(keep_bytes)`` or
``short_write(max_bytes)`` replace it; ``inject_write_fault(None)`` restores. Errors surface as OSError from
``write_slot``; the store turns them into counted misses.

Reads go through a :class:`~.slab_reader.SlabReader` over the slab's own descriptor (the one read path of every
slab file); ``DiskSlab.open_reader`` opens a reader of a slab another process owns.

Thread safety: reads and writes use positional I/O and may run from several threads; ``close`` must not race them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import os
import stat
import time
from typing import Callable

from .aligned import AlignedBuffer, buffer_address, byte_view
from ..errors import DirectIOUnavailable, SlabError, SlabGeometryError, SlabLockedError
from .format import BLOCK
from .fsutil import fsync_dir, make_private_dirs
from .plp import PlpReport, PlpRequiredError, check_plp, probe_plp  # noqa: F401  (re-exported for the store)
from .slab_reader import SlabReader

__all__ = [
    "DiskSlab", "SlabError", "SlabLockedError", "SlabGeometryError", "DirectIOUnavailable",
    "fail_write", "torn_write", "short_write", "slow_write", "probe_plp", "check_plp", "PlpReport", "PlpRequiredError",
]

PWrite = Callable[[int, memoryview, int], int]


def _libc_fallocate():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


_FALLOCATE = _libc_fallocate()


_PUNCH_HOLE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE


def _fallocate(fd: int, length: int, *, offset: int = 0, mode: int = 0) -> None:
    """Allocate blocks for [offset, offset + length) (mode 0), or punch them out (``_PUNCH_HOLE``); raises OSError
    (EOPNOTSUPP where the filesystem cannot)."""
    if _FALLOCATE is None:
        raise OSError(errno.EOPNOTSUPP, "fallocate(2) not available in libc")
    if _FALLOCATE(fd, mode, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _enable_direct(fd: int) -> None:
    """Seam for tests: Linux lets O_DIRECT be toggled on an open fd; EINVAL means the filesystem refuses it."""
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)


class DiskSlab:
    """``num_slots`` slots of ``slot_bytes`` (a BLOCK multiple) at offset ``slot * slot_bytes``.

    Invariant: while open, this process holds an exclusive flock on the file, so no other server on the node
    can write the same slab.
    """

    _pwrite: PWrite = staticmethod(os.pwrite)

    def __init__(self, *, path: str, fd: int, slot_bytes: int, num_slots: int, io_mode: str,
                 fallback_reason: "str | None", prealloc: str, prealloc_reason: "str | None", created: bool):
        self.path = path
        self._fd = fd
        self.slot_bytes = slot_bytes
        self.num_slots = num_slots
        self.size_bytes = slot_bytes * num_slots
        self.io_mode = io_mode
        self.fallback_reason = fallback_reason
        self.prealloc = prealloc
        self.prealloc_reason = prealloc_reason
        self.created = created
        self.resized_from: "int | None" = None  # the slot count before open resized it (resize=True), else None
        self._reader = SlabReader.over(fd, path, slot_bytes, num_slots, io_mode)
        # Diagnostics only (tests, bench): unlocked increments may undercount when several threads do I/O.
        self.counters = self._reader.counters
        self.counters["writes"] = 0

    # ------------------------------------------------------------------ open / close
    @staticmethod
    def _check_geometry(path: str, slot_bytes, num_slots, direct) -> int:
        for name, value in (("slot_bytes", slot_bytes), ("num_slots", num_slots)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise SlabError(f"L3 slab {path}: {name} must be a positive int, got {value!r}")
        if slot_bytes % BLOCK:
            raise SlabError(f"L3 slab {path}: slot_bytes {slot_bytes} is not a multiple of {BLOCK}")
        if direct not in ("auto", True, False):
            raise SlabError(f"L3 slab {path}: direct must be 'auto', True or False, got {direct!r}")
        return slot_bytes * num_slots

    @classmethod
    def open_reader(cls, path, *, slot_bytes: int, num_slots: int, direct: "str | bool" = "auto") -> SlabReader:
        """A read-only view of a slab another process (another rank) owns: no lock, no preallocation, no chmod;
        the file must have exactly this geometry."""
        path = os.path.abspath(os.fspath(path))
        cls._check_geometry(path, slot_bytes, num_slots, direct)
        try:
            return SlabReader(path, slot_bytes, num_slots=num_slots, direct=direct)
        except OSError as e:
            if direct is True and e.errno == errno.EINVAL:
                raise DirectIOUnavailable(f"L3 slab {path}: filesystem refuses O_DIRECT and direct=True was "
                                          f"required") from e
            raise SlabError(f"cannot open L3 slab {path} for reading: {e.strerror or e}") from e

    @classmethod
    def open(cls, path, *, slot_bytes: int, num_slots: int, create: bool = True,
             direct: "str | bool" = "auto", resize: bool = False,
             prealloc_slots: "int | None" = None) -> "DiskSlab":
        path = os.path.abspath(os.fspath(path))
        size = cls._check_geometry(path, slot_bytes, num_slots, direct)
        prealloc = size if prealloc_slots is None else max(0, min(num_slots, prealloc_slots)) * slot_bytes

        try:
            if create:
                make_private_dirs(os.path.dirname(path))
            existed = os.path.exists(path)
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o600)
        except FileNotFoundError as e:
            raise SlabError(f"L3 slab {path} does not exist (create=False)") from e
        except OSError as e:
            raise SlabError(f"cannot open L3 slab {path}: {e.strerror or e}") from e

        locked = False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SlabError(f"L3 slab {path} is not a regular file")
            if stat.S_IMODE(st.st_mode) != 0o600:
                os.fchmod(fd, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise SlabLockedError(
                    f"L3 slab {path} is locked by another open store (in this process or another): a slab has "
                    f"one writer. Two servers on one node must use different deployment_id values (each then "
                    f"has its own slab directories and its own range of the shared index); two live servers of "
                    f"one deployment and rank are refused") from None
            locked = True
            current = os.fstat(fd).st_size
            resized_from = None
            if current not in (0, size):
                if not resize:
                    raise SlabGeometryError(
                        f"L3 slab {path} is {current} B but the config asks for {num_slots} slots x {slot_bytes} B "
                        f"= {size} B; delete the file (its cached pages are lost) or restore the old geometry")
                # Same slot size: the boundaries stay, the slots past a shrunk end go. A size that is no multiple of
                # it (a file cut short) loses its partial last slot too: that page reads back as zeros, a miss.
                if current % slot_bytes:
                    os.ftruncate(fd, current - current % slot_bytes)
                os.ftruncate(fd, size)
                resized_from = current // slot_bytes if current % slot_bytes == 0 else None
            prealloc, prealloc_reason = cls._preallocate(fd, path, size, created=not existed, region=prealloc)
            if not existed:
                # A new slab's size / extents and its name must be durable before any index entry points into
                # it: fsync the file's metadata, then the directory that holds its name.
                os.fsync(fd)
                fsync_dir(os.path.dirname(path))
            io_mode, fallback_reason = cls._choose_io_mode(fd, path, direct)
        except BaseException:
            os.close(fd)
            if locked and not existed:  # only a file this call created and nobody else could have opened
                _unlink_quietly(path)
            raise
        slab = cls(path=path, fd=fd, slot_bytes=slot_bytes, num_slots=num_slots, io_mode=io_mode,
                   fallback_reason=fallback_reason, prealloc=prealloc, prealloc_reason=prealloc_reason,
                   created=not existed)
        slab.resized_from = resized_from
        return slab

    @staticmethod
    def _preallocate(fd: int, path: str, size: int, *, created: bool, region: "int | None" = None
                     ) -> "tuple[str, str | None]":
        region = size if region is None else region
        try:
            if region:
                _fallocate(fd, region)
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)  # the rest stays sparse until reserve()
            return "fallocate", None
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise SlabError(f"L3 slab {path}: no space to preallocate {region} B; lower the disk budget") from e
            if e.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise SlabError(f"L3 slab {path}: preallocation failed: {e}") from e
            os.ftruncate(fd, size)
            return "ftruncate", f"fallocate unsupported here ({e.strerror}); slab is sparse, ENOSPC may surface on write"

    @staticmethod
    def _choose_io_mode(fd: int, path: str, direct) -> "tuple[str, str | None]":
        if direct is False:
            return "buffered", "direct=False requested"
        probe = AlignedBuffer(BLOCK)
        try:
            _enable_direct(fd)
            os.preadv(fd, [probe.view], 0)  # some filesystems accept the flag and refuse the I/O
            return "o_direct", None
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise SlabError(f"L3 slab {path}: O_DIRECT probe failed: {e}") from e
            if direct is True:
                raise DirectIOUnavailable(f"L3 slab {path}: filesystem refuses O_DIRECT ({e.strerror}) and "
                                          f"direct=True was required") from e
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
            return "buffered", f"O_DIRECT refused ({errno.errorcode.get(e.errno, e.errno)}: {e.strerror})"
        finally:
            probe.close()

    def close(self) -> None:
        """Release the lock and the bounce buffers. Idempotent."""
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        self._reader.close()  # its buffers; the descriptor is ours
        os.close(fd)  # drops the flock with the last reference to the open file description

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def __enter__(self) -> "DiskSlab":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"DiskSlab({self.path!r}, slots={self.num_slots}x{self.slot_bytes}, io={self.io_mode}, "
                f"prealloc={self.prealloc})")

    # ------------------------------------------------------------------ I/O
    def _offset(self, slot: int) -> int:
        if self._fd < 0:
            raise ValueError(f"L3 slab {self.path} is closed")
        if not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot < self.num_slots:
            raise IndexError(f"slot {slot!r} out of range [0, {self.num_slots}) in {self.path}")
        return slot * self.slot_bytes

    def write_slot(self, slot: int, buf) -> None:
        """Write ``buf`` (a BLOCK multiple, at most slot_bytes; page-aligned under O_DIRECT) at the slot's start.

        Durable only after ``sync()``. Raises OSError on I/O failure (including a write that makes no progress).
        """
        offset = self._offset(slot)
        view = byte_view(buf)
        n = len(view)
        if n == 0 or n > self.slot_bytes or n % BLOCK:
            raise ValueError(f"write of {n} B: must be a non-zero multiple of {BLOCK} <= slot_bytes {self.slot_bytes}")
        if self.io_mode == "o_direct" and buffer_address(view) % BLOCK:
            raise ValueError("O_DIRECT write needs a BLOCK-aligned buffer (use AlignedBuffer)")
        done = 0
        while done < n:
            wrote = self._pwrite(self._fd, view[done:], offset + done)
            if wrote <= 0:
                raise OSError(errno.EIO, f"write made no progress at byte {done} of {n} (slot {slot}, {self.path})")
            done += wrote
        self.counters["writes"] += 1

    def reserve(self, slots: int) -> None:
        """Allocate the blocks of the first ``slots`` slots (a grown capacity). OSError (ENOSPC...) propagates;
        a file system without fallocate is left sparse, as at open."""
        if self.prealloc != "fallocate" or slots <= 0:
            return
        _fallocate(self._fd, min(slots, self.num_slots) * self.slot_bytes)

    def punch(self, slots) -> int:
        """Give the blocks of these (free, unreferenced) slots back to the file system; they read as zeros (an
        ``empty`` slot). Runs of adjacent slots are one call. Returns the slots punched (0 where the file system
        cannot punch holes: the space then stays held, which is only a missed saving)."""
        runs: list[list[int]] = []
        for s in sorted(int(x) for x in slots):
            if runs and s == runs[-1][1]:
                runs[-1][1] = s + 1
            else:
                runs.append([s, s + 1])
        n = 0
        for lo, hi in runs:
            try:
                _fallocate(self._fd, (hi - lo) * self.slot_bytes, offset=lo * self.slot_bytes, mode=_PUNCH_HOLE)
            except OSError:
                return n
            n += hi - lo
        return n

    def held_bytes(self) -> int:
        """Bytes of the file system this slab holds now (allocated blocks)."""
        return os.fstat(self._fd).st_blocks * 512

    def sync(self) -> None:
        """fdatasync, also under O_DIRECT: it flushes the drive's volatile cache and commits the unwritten-extent
        conversion of a preallocated range, without which a rewritten slot may read back as zeros after a crash."""
        os.fdatasync(self._fd)

    def read_slot_into(self, slot: int, dst, nbytes: int, *, bounce: "AlignedBuffer | None" = None) -> int:
        """See :meth:`SlabReader.read_slot_into` (the slab's reads are its reader's)."""
        return self._reader.read_slot_into(slot, dst, nbytes, bounce=bounce)

    def read_header(self, slot: int) -> bytes:
        """The slot's header (format v2: its last HEADER_SIZE bytes), read as one BLOCK; see SlabReader."""
        return self._reader.read_header(slot)

    def drop_cache(self) -> None:
        """Ask the kernel to drop this file's cached pages (buffered mode benchmarks; no effect under O_DIRECT)."""
        os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def inject_write_fault(self, pwrite: "PWrite | None") -> None:
        """Test seam: route writes through ``pwrite(fd, data, offset) -> int``; None restores os.pwrite."""
        if pwrite is None:
            self.__dict__.pop("_pwrite", None)
        else:
            self._pwrite = pwrite


# ---------------------------------------------------------------------- helpers
def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# ---------------------------------------------------------------------- write faults for tests
def fail_write(err: int = errno.EIO, *, after: int = 0) -> PWrite:
    """A pwrite that succeeds ``after`` times, then raises OSError(err) (ENOSPC, EIO, ...)."""
    state = {"left": after}

    def pwrite(fd, data, offset):
        if state["left"] > 0:
            state["left"] -= 1
            return os.pwrite(fd, data, offset)
        raise OSError(err, f"injected: {os.strerror(err)}")

    return pwrite


def torn_write(keep_bytes: int, *, report: str = "error") -> PWrite:
    """A pwrite that really writes only the first ``keep_bytes`` (rounded down to BLOCK) of each transfer.

    report="error": then raises EIO (a crash mid-write that the writer saw). report="success": claims the
    full length (a drive that acked and lost the tail at power loss) -- only the checksums can catch that.
    """
    if report not in ("error", "success"):
        raise ValueError("report must be 'error' or 'success'")
    keep = keep_bytes // BLOCK * BLOCK

    def pwrite(fd, data, offset):
        if keep:
            os.pwrite(fd, memoryview(data)[:keep], offset)
        if report == "error":
            raise OSError(errno.EIO, f"injected torn write after {keep} B")
        return len(data)

    return pwrite


def slow_write(delay_s: float) -> PWrite:
    """A pwrite that sleeps ``delay_s`` before each transfer: a slow disk (SGLANG_GLM_EXT_L3_TEST_WRITE_DELAY_MS)."""

    def pwrite(fd, data, offset):
        time.sleep(delay_s)
        return os.pwrite(fd, data, offset)

    return pwrite


def short_write(max_bytes: int = BLOCK) -> PWrite:
    """A pwrite that transfers at most ``max_bytes`` (a BLOCK multiple) per call: exercises the short-write loop."""
    step = max(BLOCK, max_bytes // BLOCK * BLOCK)

    def pwrite(fd, data, offset):
        return os.pwrite(fd, memoryview(data)[:step], offset)

    return pwrite
