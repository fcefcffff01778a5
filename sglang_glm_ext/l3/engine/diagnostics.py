"""What tools, benches and tests may read of a store's insides, by name: entry lookup, the read path's I/O counters,
alignment and read mode, each kind's slabs, and the staging, in-flight and writer objects that fault-injection
tests spy on. Not the data path: ``L3Store`` is. One door, so a refactor of the engine changes this file and not
every reader of a private attribute."""

from __future__ import annotations

from ..disk.format import PayloadKind, key_to_bytes
from .kinds import KindState


class Diagnostics:
    """A view onto one open store (``L3Store.diagnostics()``); it holds no reference count and reads live state."""

    __slots__ = ("_s",)

    def __init__(self, shared):
        self._s = shared

    # ------------------------------------------------------------------ the index
    def index_key(self, kind, key) -> bytes:
        """The index key of page ``key`` (64 hex chars or 32 raw bytes) of ``kind`` in this deployment and
        namespace: what ``index.get`` / ``index.delete`` take."""
        return self._s.ikey(PayloadKind.parse(kind), key_to_bytes(key))

    def entry(self, kind, key):
        """The committed ``IndexEntry`` of a page (rank, disk, slot, last access, ...), or None."""
        return self._s.index.get(self.index_key(kind, key))

    # ------------------------------------------------------------------ slabs
    def kinds(self) -> tuple[PayloadKind, ...]:
        """The payload kinds open now, in the order they were opened."""
        return tuple(self._s.kinds)

    def home(self, kind) -> KindState:
        """The kind's slab on the rank's home disk with its slot pool and LRU (``KindState``)."""
        return self._s.kinds[PayloadKind.parse(kind)].home

    def slabs(self, kind) -> tuple[KindState, ...]:
        """The kind's slab on each of the rank's disks, home first where it is first in the mapping."""
        return tuple(self._s.kinds[PayloadKind.parse(kind)].parts)

    # ------------------------------------------------------------------ the read path
    def io_counters(self) -> dict:
        """The slab readers' counters summed: span reads, run reads, bytes read in place vs copied."""
        return self._s.reloader.io_counters()

    def alignment(self) -> dict:
        """What each open reader's file system reported for direct I/O ("rank0/disk0/target_kv": ...)."""
        return self._s.reloader.alignment()

    def readers(self) -> list:
        """The read-only slab views open now (one per rank, disk, kind read so far)."""
        return self._s.reloader.readers()

    @property
    def vectored(self) -> bool:
        """How layer-first pages are read: one vectored transfer into the chunks (True) or one transfer + copy."""
        return self._s.reloader.vectored

    @vectored.setter
    def vectored(self, on: bool) -> None:
        # The config decides at open (queues.layer_first_reads); the bench and tests time or check both modes on
        # one store, from the next reload on.
        self._s.reloader.vectored = bool(on)

    @property
    def hash_helpers(self) -> int:
        """Threads that checksum pages beside the caller's (read_batch.hash_helpers)."""
        return self._s.reloader.helpers

    # ------------------------------------------------------------------ what fault-injection tests spy on
    @property
    def staging(self):
        """The staging byte pool (``StagingPool``)."""
        return self._s.staging

    @property
    def staged(self):
        """The pages in flight between spill and durable (``StagedPages``)."""
        return self._s.staged

    @property
    def writer(self):
        """The writer thread's object (``Writer``): the slot pools' and LRUs' only owner after open."""
        return self._s.writer
