"""The L3 index's entry codec: what a key and a value are, byte for byte.

Key (57 bytes)   = deployment tag (8) | namespace digest (16) | payload kind (1) | content hash (32)
Value (16 bytes) = owner rank (u16) | disk index (u16) | slot (u32) | last access (u64, microseconds since epoch)

This module is the only one that knows the key's byte layout: others build keys with :class:`KeySpace` /
:func:`make_key` and read them with :func:`split_key` (an :class:`IndexKey` of named fields). ``index.py`` (the
LMDB transactions) re-exports every name here, where callers import them from.

The deployment tag leads the key so everything one deployment owns is a contiguous key range (cold-start
``clear`` and ``fsck`` scan only that range). The rank is in the value, not the key: a page is content-addressed
within its namespace, and any rank reads a blob another rank wrote.
"""

from __future__ import annotations

import hashlib
import struct
import time
from typing import NamedTuple

from ..disk.format import HASH_BYTES, NS_DIGEST_BYTES, PayloadKind

__all__ = ["IndexEntry", "IndexKey", "KeySpace", "deployment_tag", "make_key", "split_key", "namespace_and_kind",
           "now_us", "KEY_LEN", "VALUE_LEN"]

_VALUE = struct.Struct("<HHIQ")
_TAG_BYTES = 8
_NS_AT, _KIND_AT, _HASH_AT = _TAG_BYTES, _TAG_BYTES + NS_DIGEST_BYTES, _TAG_BYTES + NS_DIGEST_BYTES + 1
KEY_LEN = _HASH_AT + HASH_BYTES
VALUE_LEN = _VALUE.size


def now_us() -> int:
    """Wall-clock microseconds: last-access times must stay comparable across restarts and processes."""
    return time.time_ns() // 1000


def deployment_tag(deployment_id: str) -> bytes:
    return hashlib.blake2b(deployment_id.encode("utf-8"), digest_size=_TAG_BYTES, person=b"glm-l3-dep").digest()


class IndexKey(NamedTuple):
    """A 57-byte index key as named fields (a tuple, so it also unpacks and compares as one)."""

    deployment: bytes  # deployment_tag(deployment_id)
    namespace: bytes  # Namespace.digest_for(deployment_id)
    kind: int  # the payload kind's byte as stored: a damaged or foreign key may hold one no version defines
    content_hash: bytes

    @property
    def payload_kind(self) -> "PayloadKind | None":
        return PayloadKind.from_byte(self.kind)

    def pack(self) -> bytes:
        return make_key(self.deployment, self.namespace, self.kind, self.content_hash)


def make_key(dep_tag: bytes, ns_digest: bytes, kind: int, content_hash: bytes) -> bytes:
    return dep_tag + ns_digest + bytes((int(kind),)) + content_hash


def split_key(key: bytes) -> IndexKey:
    return IndexKey(key[:_NS_AT], key[_NS_AT:_KIND_AT], key[_KIND_AT], key[_HASH_AT:KEY_LEN])


def namespace_and_kind(key: bytes) -> "tuple[bytes, int]":
    """A key's namespace digest and payload-kind byte: two slices, for loops over every entry (cold start)."""
    return key[_NS_AT:_KIND_AT], key[_KIND_AT]


class KeySpace:
    """The keys of one (deployment, namespace), laid out once at open: on the data path a key is one
    concatenation (``prefix(kind) + content_hash``), with no layout decision left."""

    __slots__ = ("deployment", "namespace", "_prefix")

    def __init__(self, deployment: bytes, namespace: bytes):
        self.deployment = deployment
        self.namespace = namespace
        self._prefix = {k: make_key(deployment, namespace, k, b"") for k in PayloadKind}

    def key(self, kind: PayloadKind, content_hash: bytes) -> bytes:
        return self._prefix[kind] + content_hash

    def prefix(self, kind: PayloadKind) -> bytes:
        """Every key of ``kind`` in this space is this prefix + a 32-byte content hash."""
        return self._prefix[kind]


class IndexEntry(NamedTuple):
    rank: int
    disk: int
    slot: int
    last_access: int

    def pack(self) -> bytes:
        return _VALUE.pack(self.rank, self.disk, self.slot, self.last_access)

    @staticmethod
    def unpack(b) -> "IndexEntry":
        return IndexEntry(*_VALUE.unpack(b))

    @staticmethod
    def decode(b) -> "IndexEntry | None":
        """The entry, or None for a value that is not the 16-byte layout (a damaged index page). A malformed value
        is never an entry: lookups treat it as absent, so it costs its own page only, never its batch."""
        if b is None or len(b) != VALUE_LEN:
            return None
        return _new_entry(IndexEntry, _VALUE.unpack(b))  # tuple.__new__: a scan decodes every entry of a range

    def same_location(self, other: "IndexEntry") -> bool:
        return self.rank == other.rank and self.disk == other.disk and self.slot == other.slot


_new_entry = tuple.__new__
