"""The one read-only view of a slab file: positional reads, no lock, O_DIRECT where the file system takes it.

Every read of slab bytes goes through :class:`SlabReader`: the store's reloads (any rank's slab), a slab owner's
own reads (``DiskSlab`` reads through one over its descriptor), fsck, tools. Readers never take the owner's
exclusive flock, so every rank reads every other rank's blobs while they run; a reader trusts only bytes that
``verify_blob`` accepts, and a reclaim deletes the index entry before the slot is reused, so a racing rewrite
reads as a miss.

Geometry, decided at open:

* ``num_slots`` given (strict): the file must be exactly ``num_slots * slot_bytes`` (``SlabGeometryError``) and
  a slot outside ``[0, num_slots)`` is an ``IndexError``.
* ``num_slots=None``: a slab whose slot count this process does not know (another rank's budget). No size check;
  a slot past the file's end is a :class:`ShortRead`, which the store counts against the entry that named it.
* ``tolerant=True`` (fsck): ``num_slots`` is what the sidecar says the owner meant; the file may hold fewer.
  ``num_slots`` becomes what the file holds, and a read past its end comes back as zeros (an empty slot).

Direct reads into the caller's memory (:meth:`SlabReader.read_spans`): the alignment O_DIRECT needs is probed on
the file itself at open (``align``, dio_align.py) and a :class:`~.read_plan.ReadPlan` says which bytes go straight
into the page's spans and which through the caller's bounce buffer. A transfer the kernel refuses anyway (EINVAL:
the file system reported less than it needs) makes the reader fall back, for good, to 4 KiB plans, then to
buffered reads; the read is redone, so the caller sees only the bytes. :meth:`SlabReader.read_run` reads several
adjacent slots in one transfer the same way (each page's spans, then its own pad and header).
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading

import numpy as np

from .aligned import AlignedBuffer, buffer_address, byte_view
from .dio_align import BUFFERED, CONSERVATIVE, DioAlignment, probe_dio_alignment
from ..errors import SlabGeometryError
from .format import BLOCK, HEADER_SIZE, round_up
from .read_plan import ReadPlan, plan_read

__all__ = ["SlabReader", "ShortRead"]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
try:
    _IOV_MAX = max(16, min(os.sysconf("SC_IOV_MAX"), 1024))
except (OSError, ValueError):
    _IOV_MAX = 1024
_MEMMOVE_MIN = 64 * 1024  # larger copies go through ctypes.memmove, which releases the GIL


class _Refused(Exception):
    """A direct transfer was refused (EINVAL) and the reader has fallen back: redo the read with a new plan."""


class ShortRead(OSError):
    """The file ended before the slot did (a slot past a smaller or truncated slab's end)."""

    def __init__(self, msg: str):
        super().__init__(errno.EIO, msg)


class SlabReader:
    """Read-only, lock-free view of one slab file (see the module docstring for the three geometries).

    Thread-safe: positional reads only; each thread gets its own bounce / header buffer. Invariant: no descriptor
    a reader thread may be using is closed before :meth:`close`. A file system that accepts O_DIRECT at open but
    refuses a transfer (EINVAL) makes the reader fall back, once and for good, to a second, buffered descriptor;
    the O_DIRECT one stays open (a read in flight on it finishes on the right file) until close. Closing and
    reopening instead would free the number for any concurrent ``open`` in the process, and a read in flight
    would then read that other file.
    """

    def __init__(self, path, slot_bytes: int, *, num_slots: "int | None" = None, tolerant: bool = False,
                 direct: "str | bool" = "auto"):
        self.path = os.path.abspath(os.fspath(path))
        self.slot_bytes = slot_bytes
        self.tolerant = tolerant
        self.fallback_reason: "str | None" = None
        self._init_state()
        flags = os.O_RDONLY | _CLOEXEC
        if direct is False:
            self._fd, self.io_mode, self.fallback_reason = os.open(self.path, flags), "buffered", "direct=False requested"
        else:
            try:
                self._fd, self.io_mode = os.open(self.path, flags | os.O_DIRECT), "o_direct"
            except OSError as e:
                if e.errno != errno.EINVAL or direct is True:
                    raise
                self._fd, self.io_mode = os.open(self.path, flags), "buffered"
                self.fallback_reason = "O_DIRECT refused at open (EINVAL)"
        self._owns_fd = True
        self.align = self._probe_align()
        self.num_slots = num_slots
        if num_slots is not None:
            size = os.fstat(self._fd).st_size
            if tolerant:
                self.num_slots = min(num_slots, size // slot_bytes)
            elif size != num_slots * slot_bytes:
                self.close()
                raise SlabGeometryError(f"L3 slab {self.path} is {size} B, expected {num_slots} x {slot_bytes} B")

    @classmethod
    def over(cls, fd: int, path: str, slot_bytes: int, num_slots: int, io_mode: str) -> "SlabReader":
        """The reads of a slab's owner, on the owner's descriptor (borrowed: never closed here, and its I/O mode
        was probed by the owner at open, so a refused transfer is an error, not a fallback)."""
        self = cls.__new__(cls)
        self.path, self.slot_bytes, self.tolerant, self.fallback_reason = path, slot_bytes, False, None
        self._init_state()
        self._fd, self.io_mode, self._owns_fd, self.num_slots = fd, io_mode, False, num_slots
        self.align = self._probe_align()
        return self

    def _probe_align(self) -> DioAlignment:
        """What a direct transfer on this file needs (dio_align.py); no alignment for buffered reads. An answer
        that does not fit the 4 KiB slot grid (offsets above 4 KiB) is replaced by 4 KiB plans, which the owner's
        O_DIRECT probe has shown to work (else the reader would be buffered)."""
        if not self.direct:
            return BUFFERED
        a = probe_dio_alignment(self._fd)
        if a.offset > BLOCK or BLOCK % a.offset or a.mem > BLOCK:
            return DioAlignment(BLOCK, BLOCK, f"4 KiB ({a} does not fit the slot grid)")
        return a

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._spare: list[int] = []  # descriptors no longer handed to new reads, still open until close()
        self._local = threading.local()
        self._buffers: list[AlignedBuffer] = []
        # Diagnostics only (tests, bench): unlocked increments may undercount when several threads read.
        self.counters = {"direct_reads": 0, "bounce_reads": 0, "buffered_reads": 0, "span_reads": 0,
                         "direct_bytes": 0, "bounced_bytes": 0, "strided_copies": 0, "run_reads": 0,
                         "run_pages": 0}

    @property
    def fd(self) -> int:
        return self._fd

    @property
    def direct(self) -> bool:
        return self.io_mode == "o_direct"

    # ------------------------------------------------------------------ reads
    def read_slot_into(self, slot: int, dst, nbytes: int, *, bounce: "AlignedBuffer | None" = None) -> int:
        """Copy the slot's first ``nbytes`` into ``dst[:nbytes]`` with one read of ``round_up(nbytes, BLOCK)``.

        Under O_DIRECT the read lands in ``dst`` itself when dst is BLOCK-aligned and has room for the rounded
        length; otherwise in ``bounce`` (or this thread's slot-sized bounce buffer) and is then copied.
        Returns nbytes. Raises OSError on I/O failure, :class:`ShortRead` where the file ends first.
        """
        offset = self._offset(slot)
        out = byte_view(dst)
        if out.readonly:
            raise ValueError("read destination is read-only")
        if not 0 < nbytes <= self.slot_bytes or nbytes > len(out):
            raise ValueError(f"read of {nbytes} B into {len(out)} B (slot_bytes {self.slot_bytes})")
        if not self.direct:
            self._read(out[:nbytes], offset)
            self.counters["buffered_reads"] += 1
            return nbytes
        io_len = round_up(nbytes, BLOCK)
        if len(out) >= io_len and buffer_address(out) % BLOCK == 0:
            self._read(out[:io_len], offset)
            self.counters["direct_reads"] += 1
            return nbytes
        if bounce is None:
            bounce = self._thread_buffer("bounce", self.slot_bytes)
        elif len(bounce) < io_len or bounce.address % BLOCK:
            raise ValueError(f"bounce buffer must be BLOCK-aligned and >= {io_len} B")
        self._read(bounce.view[:io_len], offset)
        out[:nbytes] = bounce.view[:nbytes]
        self.counters["bounce_reads"] += 1
        return nbytes

    def read_header(self, slot: int) -> bytes:
        """The slot's header (format v2: its last HEADER_SIZE bytes), read as the slot's last BLOCK."""
        return self.read_headers(slot)[1]

    def read_headers(self, slot: int) -> "tuple[bytes, bytes]":
        """The slot's first and last HEADER_SIZE bytes (a v1 header, a v2 header), one BLOCK read each."""
        offset = self._offset(slot)
        block = self._thread_buffer("header_block", BLOCK)
        self._read(block.view, offset)
        head = bytes(block.view[:HEADER_SIZE])
        if self.slot_bytes > BLOCK:
            self._read(block.view, offset + self.slot_bytes - BLOCK)
        return head, bytes(block.view[BLOCK - HEADER_SIZE:])

    def read_spans(self, slot: int, spans, plan: ReadPlan, bounce: AlignedBuffer, *,
                   verify_first: bool = False) -> "tuple[bytes, list, tuple | None]":
        """Read the slot in one pass as ``plan`` says: its direct segments straight into ``spans`` (a
        ``layout.PageSpans``), the rest into ``bounce`` (mem-aligned, >= ``plan.bounce_bytes``) and copied out.
        Returns the slot's last HEADER_SIZE bytes (its v2 header), the spans as views in payload order (what the
        checksum runs over) and None. Writes nothing but the spans' own bytes.

        ``verify_first``: a single transfer into evenly spaced spans (``plan.packed`` and ``spans.grid``: layer-first
        in one buffer) is left in the bounce buffer. Then the views returned are the payload's one view THERE (the
        checksum runs over it in one call) and the third value is the copy still to do, ``(destination, source)``
        arrays for ``np.copyto``: the caller copies once the checksum matched, so a page that fails it never
        touches its destination, and before this thread's next read reuses the bounce buffer.

        ``plan`` must be for this slot size and ``self.align``; if the kernel refuses the transfer the reader falls
        back (module docstring) and the read is redone under a plan for the new alignment. Raises OSError on I/O
        failure, :class:`ShortRead` where the file ends first."""
        offset = self._offset(slot)
        for _ in range(3):  # the plan given, then at most two fallbacks (4 KiB plans, buffered reads)
            try:
                iov, pending = self._run(plan, spans, bounce, offset, verify_first)
                break
            except _Refused:
                mods = tuple((b + s) % self.align.mem for b, s in zip(spans.bases, spans.starts))
                plan = plan_read(tuple(spans.lengths), mods, self.slot_bytes, self.align, True)
                bounce = self._thread_buffer("replan", plan.bounce_bytes)
        else:  # pragma: no cover - each fallback changes the alignment, and buffered reads never raise _Refused
            raise OSError(errno.EINVAL, f"direct read of {self.path} refused under every fallback")
        c = self.counters
        c["span_reads"] += 1
        c["direct_bytes"] += plan.direct_bytes
        c["bounced_bytes"] += plan.payload_bytes - plan.direct_bytes
        trailer = bytes(bounce.view[plan.trailer_at:plan.trailer_at + HEADER_SIZE])
        if pending is not None:
            return trailer, [bounce.view[plan.packed:plan.packed + plan.payload_bytes]], pending
        seg = plan.span_segments
        if seg is None:
            pieces = spans.pieces()
        elif plan.tail is not None:  # the spans are the plan's first segments (page- and layer-first, aligned)
            pieces = iov[:len(seg)]
        else:
            pieces = [iov[j] for j in seg]
        return trailer, pieces, None

    def read_run(self, slot: int, spans_list: list, plan: ReadPlan, bounce: AlignedBuffer,
                 stride: int) -> "list[tuple[bytes, list]] | None":
        """Read ``len(spans_list)`` adjacent slots, ``slot`` on, in ONE transfer: page ``q``'s spans (``spans_list[q]``,
        each whole and direct: ``plan.tail`` is not None, one plan for every page) straight into the destination,
        then its pad and header into ``bounce[q * stride:]`` (``stride``: a multiple of ``align.mem``, >=
        ``plan.bounce_bytes``). Returns, per page, what :meth:`read_spans` returns for it (its header bytes, its
        spans' views); writes nothing but the spans' own bytes and the bounce buffer.

        None when the kernel refused the transfer: the reader has fallen back (module docstring) and the caller reads
        each page with :meth:`read_spans`, which re-plans. Raises OSError on I/O failure and :class:`ShortRead` where
        the file ends first, as :meth:`read_spans` does: the caller then reads each page alone, so a bad block costs
        only the page it is in."""
        k = len(spans_list)
        if plan.tail is None or plan.align != self.align:
            raise ValueError("read_run needs a plan whose spans are whole and direct, for this reader's alignment")
        if stride % self.align.mem or stride < plan.bounce_bytes or len(bounce) < (k - 1) * stride + plan.bounce_bytes \
                or bounce.address % self.align.mem:
            raise ValueError(f"bounce buffer must be {self.align.mem} B-aligned, room for {k} tails {stride} B apart")
        offset = self._offset(slot)
        self._offset(slot + k - 1)  # the last slot is in range too
        bv = bounce.view
        tail = plan.tail
        iov: list = []
        at_page: list[int] = []
        for q, spans in enumerate(spans_list):
            at_page.append(len(iov))
            iov += spans.pieces()
            base = q * stride
            iov += [bv[base + at:base + at + n] for _, _, at, n in tail]
        try:
            self._readv(iov, offset, plan.align, k * self.slot_bytes)
        except _Refused:
            return None
        c = self.counters
        c["span_reads"] += k
        c["run_reads"] += 1
        c["run_pages"] += k
        c["direct_bytes"] += k * plan.direct_bytes
        c["bounced_bytes"] += k * (plan.payload_bytes - plan.direct_bytes)
        n_spans, t = len(plan.span_segments), plan.trailer_at
        return [(bytes(bv[q * stride + t:q * stride + t + HEADER_SIZE]), iov[a:a + n_spans])
                for q, a in enumerate(at_page)]

    def _run(self, plan: ReadPlan, spans, bounce: AlignedBuffer, offset: int,
             verify_first: bool = False) -> "tuple[list, tuple | None]":
        if len(bounce) < plan.bounce_bytes or bounce.address % self.align.mem:
            raise ValueError(f"bounce buffer must be {self.align.mem} B-aligned and >= {plan.bounce_bytes} B")
        bv = bounce.view
        if plan.tail is not None:  # the common case: each span whole and direct, then the pad and the header
            iov = spans.pieces()
            iov += [bv[at:at + n] for _, _, at, n in plan.tail]
            self._readv(iov, offset, plan.align)
            return iov, None
        views, starts = spans.views, spans.starts
        iov = [views[i][starts[i] + off:starts[i] + off + n] if i >= 0 else bv[at:at + n]
               for i, off, at, n in plan.segments]
        self._readv(iov, offset, plan.align)
        if plan.packed is not None and spans.grid is not None:
            # A single transfer into evenly spaced spans (layer-first in one buffer): one strided copy, the GIL
            # released, instead of a copy per span. Writes exactly the spans' bytes, as the loop below would.
            grid, gap = spans.grid
            k, n = len(spans.lengths), spans.lengths[0]
            copy = (np.ndarray((k, n), np.uint8, grid, spans.same.start, (gap, 1)),
                    np.frombuffer(bv, np.uint8, k * n, plan.packed).reshape(k, n))
            if verify_first:
                return iov, copy  # the caller copies (and counts) once the checksum matched
            np.copyto(*copy)
            self.counters["strided_copies"] += 1
            return iov, None
        base = bounce.address
        for i, off, at, n in plan.copies:
            s = starts[i] + off
            if n >= _MEMMOVE_MIN:
                ctypes.memmove(spans.bases[i] + s, base + at, n)
            else:
                views[i][s:s + n] = bv[at:at + n]
        return iov, None

    def _readv(self, iov: list, offset: int, align: DioAlignment, total: "int | None" = None) -> None:
        """Fill every view of ``iov`` (``total`` bytes: one slot unless given) from ``offset`` on, in order: one
        ``preadv``, the common case; short transfers are continued and more than IOV_MAX views split, each call
        starting at a segment boundary (an aligned file offset). ``iov`` itself is never changed (the caller hashes
        its views)."""
        total = self.slot_bytes if total is None else total
        if len(iov) <= _IOV_MAX:
            got = self._preadv(iov, offset, align)
            if got == total:
                return
        else:
            got = 0
        todo, pos = list(iov), offset
        while todo:
            while todo and got >= len(todo[0]):  # whole views done
                got -= len(todo[0])
                todo.pop(0)
            if got:  # a view done in part: continue inside it
                todo[0] = todo[0][got:]
            if not todo:
                return
            pos = offset + total - sum(len(v) for v in todo)
            got = self._preadv(todo[:_IOV_MAX], pos, align)
            if got <= 0:
                if not self.tolerant:
                    raise ShortRead(f"short read at offset {pos} in {self.path}")
                for v in todo:
                    v[:] = bytes(len(v))
                return

    def _preadv(self, iov: list, pos: int, align: DioAlignment) -> int:
        try:
            return os.preadv(self._fd, iov, pos)
        except OSError as e:
            if e.errno != errno.EINVAL or not self.direct:
                raise
            self._refused(align)
            raise  # pragma: no cover - _refused always raises

    def _refused(self, align: DioAlignment) -> None:
        """EINVAL on a direct transfer planned under ``align``: 4 KiB plans first, then buffered reads (a descriptor
        of our own only: the owner's was probed at open, so there a refusal is an error). Raises _Refused to make
        the caller re-plan. A thread whose plan predates another thread's fallback only re-plans."""
        with self._lock:
            if (align.mem, align.offset) != (self.align.mem, self.align.offset):
                raise _Refused()
            if align.mem < BLOCK or align.offset < BLOCK:
                self.align = CONSERVATIVE
                raise _Refused()
        if self._owns_fd:
            self._fall_back()
            raise _Refused()
        raise OSError(errno.EINVAL, f"O_DIRECT transfer refused on {self.path} (the owner's descriptor)")

    def write_slot(self, slot: int, buf) -> None:
        """A reader stands where a slab may (tools, fsck): a write through it is a caller bug, refused loudly."""
        raise ValueError(f"L3 slab {self.path} was opened read-only")

    def _offset(self, slot: int) -> int:
        if self._fd < 0:
            raise ValueError(f"L3 slab {self.path} is closed")
        if self.num_slots is not None and not self.tolerant and (
                not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot < self.num_slots):
            raise IndexError(f"slot {slot!r} out of range [0, {self.num_slots}) in {self.path}")
        return slot * self.slot_bytes

    def _read(self, view: memoryview, offset: int) -> None:
        done, n = 0, len(view)
        while done < n:
            fd, direct = self._fd, self.direct
            try:
                got = os.preadv(fd, [view[done:]], offset + done)
            except OSError as e:
                # Some file systems accept O_DIRECT at open but refuse the transfer: fall back once, for good.
                if not (direct and self._owns_fd and e.errno == errno.EINVAL):
                    raise
                self._fall_back()
                continue
            if got <= 0:
                if not self.tolerant:
                    raise ShortRead(f"short read: {done} of {n} B at offset {offset} in {self.path}")
                view[done:] = bytes(n - done)
                return
            done += got

    def _fall_back(self) -> None:
        with self._lock:
            if self.direct:
                buffered = os.open(self.path, os.O_RDONLY | _CLOEXEC)
                self._spare.append(self._fd)
                self._fd = buffered
                self.io_mode, self.fallback_reason = "buffered", "O_DIRECT transfer refused (EINVAL)"
                self.align = BUFFERED

    def _thread_buffer(self, name: str, size: int) -> AlignedBuffer:
        buf = getattr(self._local, name, None)
        if buf is None or buf.closed or buf.size < size:
            old, buf = buf, AlignedBuffer(size)
            setattr(self._local, name, buf)
            with self._lock:
                self._buffers.append(buf)
                if old is not None and old in self._buffers:
                    self._buffers.remove(old)
            if old is not None:
                try:
                    old.close()
                except BufferError:
                    pass
        return buf

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """Close what this reader opened (a borrowed descriptor stays with its owner) and its buffers. Idempotent."""
        with self._lock:
            fds = [fd for fd in ([self._fd] if self._owns_fd else []) + self._spare if fd >= 0]
            self._fd, self._spare = -1, []
            bufs, self._buffers = self._buffers, []
        for fd in fds:
            os.close(fd)
        for buf in bufs:
            try:
                buf.close()
            except BufferError:
                pass

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def __enter__(self) -> "SlabReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SlabReader({self.path!r}, slot_bytes={self.slot_bytes}, io={self.io_mode})"
