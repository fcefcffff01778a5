"""Reading pages back for one store: a slab reader per (rank, disk, kind), per-thread read buffers, the read pool.

Readers are opened when the store opens, for every configured rank's slab that exists then; a slab that appears
later (a rank that starts after this one, an entry that names another disk) is opened by the first reload that
needs it, and until it exists its pages are misses. The hot path is a dict lookup. Any rank reads any rank's
blobs: readers take no lock (slab_reader.py says why that is safe).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping

from .aligned import AlignedBuffer
from .config import L3Config
from .format import BlobCheck, PayloadKind, verify_blob_reason
from .index import IndexEntry
from .kinds import KindState
from .messages import ReloadMiss
from .slab_dir import slab_path
from .slab_reader import ShortRead, SlabReader

__all__ = ["SlabReads"]


class SlabReads:
    def __init__(self, config: L3Config, rank: int, kinds: Mapping[PayloadKind, KindState], namespace: bytes):
        self.config = config
        self.namespace = namespace
        self._slot_bytes = {k: st.slot_bytes for k, st in kinds.items()}
        self._readers: dict[tuple[int, int, PayloadKind], SlabReader] = {}
        self._lock = threading.Lock()
        self._tls = threading.local()
        self.pool = ThreadPoolExecutor(config.reload_threads, thread_name_prefix=f"l3-rd-r{rank}")
        for r in range(config.num_ranks):
            for kind in kinds:
                self._open(r, config.disk_for_rank(r), kind)

    def add_kind(self, kind: PayloadKind, slot_bytes: int) -> None:
        """Readers of one more kind (``L3Store.add_kind``): opened by the first reload that needs each slab."""
        with self._lock:
            self._slot_bytes[kind] = slot_bytes

    def read(self, st: KindState, content_hash: bytes, e: IndexEntry) -> "tuple[memoryview | None, BlobCheck | ReloadMiss]":
        """The verified payload of the page ``e`` names (a view of this thread's read buffer, valid until its next
        read), or None and why. OSError (EIO) propagates: the caller counts it, the entry is not blamed."""
        rd = self._readers.get((e.rank, e.disk, st.kind)) or self._open(e.rank, e.disk, st.kind)
        if rd is None:
            return None, ReloadMiss.NO_SLAB
        buf = self._buffer(st.slot_bytes)
        try:
            got = rd.read_slot_into(e.slot, buf, st.slot_bytes)
        except ShortRead:
            return None, ReloadMiss.SHORT_READ
        if got != st.slot_bytes:
            return None, ReloadMiss.SHORT_READ
        return verify_blob_reason(buf.view, kind=st.kind, content_hash=content_hash, ns_digest=self.namespace,
                                  payload_len=st.page_bytes)

    def _open(self, rank: int, disk: int, kind: PayloadKind) -> "SlabReader | None":
        key = (rank, disk, kind)
        with self._lock:
            if key not in self._readers:
                if not 0 <= disk < len(self.config.disks):
                    return None  # an entry naming a disk outside this config: a miss
                try:
                    self._readers[key] = SlabReader(slab_path(self.config, rank, kind, disk), self._slot_bytes[kind])
                except OSError:
                    return None  # not there (yet): a miss now; retried by a later reload
            return self._readers[key]

    def _buffer(self, nbytes: int) -> AlignedBuffer:
        bufs = getattr(self._tls, "bufs", None)
        if bufs is None:
            bufs = self._tls.bufs = {}
        b = bufs.get(nbytes)
        if b is None:
            b = bufs[nbytes] = AlignedBuffer(nbytes)
        return b

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True)

    def close_readers(self) -> None:
        with self._lock:
            readers, self._readers = list(self._readers.values()), {}
        for r in readers:
            r.close()
