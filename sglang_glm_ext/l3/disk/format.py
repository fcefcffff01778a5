"""On-disk blob format of the L3 tier: one KV page = one self-describing blob in a 4 KiB-aligned slot.

Slot layout, format v2 (``slot_bytes_for(payload_len)`` bytes, a multiple of ``BLOCK``)::

    [0, payload_len)                       payload (the page's bytes in the namespace's layout order)
    [payload_len, slot_bytes - 128)        pad (zeroed by seal_blob; never read back as payload)
    [slot_bytes - 128, slot_bytes)         header, a trailer (HEADER_SIZE, little-endian, see _HEADER)

The payload starts at the slot's first byte, so a reload reads it with O_DIRECT straight into the host page (or
into each layer's chunk): the header no longer sits in front of it. v1 (earlier builds) had the header at
``[0, 128)`` and the payload behind it; this build recognises a v1 header only to name it (``old_version``), it
never serves one (docs_internal/l3_format.md, upgrade policy).

Header fields (offsets in bytes, within the header):

    0   8  magic            b"GLML3BLB"              frozen across all versions
    8   2  format_version   u16, FORMAT_VERSION        frozen position across all versions
    10  1  payload_kind     u8, PayloadKind
    11  1  reserved         must be 0
    12  4  flags            u32; bits 0-15 must-understand (v2 defines none), bits 16-31 ignorable
    16 32  content_hash     SGLang page key (SHA-256) as 32 raw bytes
    48  8  payload_len      u64
    56  8  payload_checksum u64, xxh3_64 of the payload bytes [0, payload_len) of the slot
    64 16  ns_digest        Namespace.digest_for(deployment_id)
    80  8  slot_bytes       u64, the slot this header closes (v2; v1 had reserved zeros here)
    88 32  reserved         must be 0
    120 8  header_checksum  u64, xxh3_64 of bytes [0, 120)

Invariant kept by every reader here: a blob is returned only if magic, version, header checksum, kind, content
hash, namespace, payload and slot length and payload checksum all match what the caller asked for; anything else
is a miss with a reason (a :class:`BlobCheck`), never bytes and never an exception. The payload checksum is
computed over the bytes where they landed (:func:`checksum_views`). See docs_internal/l3_format.md for the
crash-safety argument.

Checksum: xxh3_64, through xxhash >= 4.1.0 (the first release that dispatches XXH3 to SSE2 / AVX2 / AVX-512 at run
time; earlier ones are SSE2-only builds; every build gives the same values, tests/l3/test_checksum.py holds
xxHash's published vectors and this format's own, so the pin changes nothing on disk). One core hashes a cold page
at about its memory bandwidth, faster than crc32 or xxh64 (docs_internal/l3_tuning.md, "The checksum"; measured with
benchmark/l3_checksum_cost.py). python-xxhash releases the GIL only above 64 KiB: a page-first page
(one call) hashes without it, a layer-first page's chunks (16-41 KiB) with it (engine/reload.py says why that was
kept). A reload checks pages on threads of its own while the next reads are in flight (engine/reload.py).
"""

from __future__ import annotations

import enum
import hashlib
import json
import struct
import time
from dataclasses import dataclass
from typing import NamedTuple

import xxhash

from .aligned import byte_view

BLOCK = 4096
MAGIC = b"GLML3BLB"
FORMAT_VERSION = 2
OLD_FORMAT_VERSIONS = (1,)  # recognised only to name them ("old_version"); never served
HEADER_SIZE = 128
PAYLOAD_OFFSET = 0  # where the payload starts in a slot (v2): a direct read lands it in the host page as is
HASH_BYTES = 32
NS_DIGEST_BYTES = 16

# Flags whose low 16 bits a reader must understand; v2 defines none, so any of them set means "not for me".
_MUST_UNDERSTAND_FLAGS = 0x0000FFFF
_KNOWN_FLAGS = 0

_HEADER = struct.Struct("<8sHBBI32sQQ16sQ32s")
_CHECKSUM = struct.Struct("<Q")
_HEADER_ALL = struct.Struct(_HEADER.format + "Q")  # the header and its checksum: one unpack on the read path
_CHECKSUMMED = _HEADER.size  # bytes covered by the header checksum
assert _CHECKSUMMED + _CHECKSUM.size == HEADER_SIZE
_VERSION_AT = struct.Struct("<8sH")  # the frozen prefix: lets this reader name a newer blob "unknown_version"
_ZERO_RESERVED = bytes(32)

class PayloadKind(enum.IntEnum):
    """What a blob holds. Values are on disk: never renumber, only append."""

    TARGET_KV = 1
    DRAFT_KV = 2
    INDEX_K = 3
    DRAFT_INDEX_K = 4

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, value: "str | int | PayloadKind") -> "PayloadKind":
        if isinstance(value, PayloadKind):
            return value
        if isinstance(value, str):
            for kind in cls:
                if kind.label == value.strip().lower():
                    return kind
        elif isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        valid = ", ".join(k.label for k in cls)
        raise ValueError(f"unknown L3 payload kind {value!r}; valid: {valid}")

    @classmethod
    def from_byte(cls, value: int) -> "PayloadKind | None":
        """The kind a stored byte (blob header, index key) names, or None for a value no version defines."""
        return _KIND_BY_VALUE.get(value)


_KIND_BY_VALUE = {int(k): k for k in PayloadKind}


class BlobCheck(str, enum.Enum):
    """What reading a blob found: ``OK``, or why it is a miss. A str, so it logs and compares as its value."""

    OK = "ok"
    # the header alone
    SHORT = "short"  # buffer shorter than a header
    EMPTY = "empty"  # all-zero: never written or discarded
    BAD_MAGIC = "bad_magic"
    UNKNOWN_VERSION = "unknown_version"  # a version this build does not know (a newer server's blob)
    OLD_VERSION = "old_version"  # a blob of an earlier format (v1): recognised, never served
    HEADER_CHECKSUM = "header_checksum"
    UNKNOWN_KIND = "unknown_kind"
    UNKNOWN_FLAGS = "unknown_flags"
    RESERVED_NONZERO = "reserved_nonzero"
    # the header against the page asked for, then the payload
    KIND_MISMATCH = "kind_mismatch"
    HASH_MISMATCH = "hash_mismatch"
    NAMESPACE_MISMATCH = "namespace_mismatch"
    LENGTH_MISMATCH = "length_mismatch"  # payload length, or the slot size the header closes
    TRUNCATED = "truncated"  # buffer shorter than the slot the header closes
    PAYLOAD_CHECKSUM = "payload_checksum"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Namespace:
    """Everything that must match for a blob's bytes to be meaningful to a reader.

    Rank is deliberately absent: any rank serving the same shard must read what another rank wrote. ``layout``
    is part of it because a layer-first gather and a page-first copy produce different byte orders.
    """

    model: str
    kv_dtype: str
    layout: str
    page_size: int
    layer_start: int
    layer_end: int
    shard: str

    def __post_init__(self) -> None:
        for name in ("model", "kv_dtype", "layout", "shard"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"Namespace.{name} must be a non-empty string, got {value!r}")
        for name in ("page_size", "layer_start", "layer_end"):
            if not isinstance(getattr(self, name), int) or isinstance(getattr(self, name), bool):
                raise ValueError(f"Namespace.{name} must be an int")
        if self.page_size <= 0:
            raise ValueError(f"Namespace.page_size must be > 0, got {self.page_size}")
        if not 0 <= self.layer_start < self.layer_end:
            raise ValueError(f"Namespace layer range [{self.layer_start}, {self.layer_end}) is empty or negative")

    def _fields(self) -> dict:
        return {
            "model": self.model,
            "kv_dtype": self.kv_dtype,
            "layout": self.layout,
            "page_size": self.page_size,
            "layer_start": self.layer_start,
            "layer_end": self.layer_end,
            "shard": self.shard,
        }

    def canonical(self) -> bytes:
        """Stable encoding: sorted-key JSON under a domain tag, so field order in code can never change a digest."""
        return b"sglang_glm_ext.l3.namespace.v1\0" + json.dumps(self._fields(), sort_keys=True,
                                                                  separators=(",", ":")).encode()

    def digest(self) -> bytes:
        """The namespace alone. Not what a store seals blobs with: see :meth:`digest_for`."""
        return hashlib.blake2b(self.canonical(), digest_size=NS_DIGEST_BYTES).digest()

    def digest_for(self, deployment_id: str) -> bytes:
        """The digest an L3 store seals every blob with and checks every blob against (header ``ns_digest``).

        It binds the deployment as well as the namespace: if two deployments ever end up sharing slab files (a
        symlinked or bind-mounted directory), a blob one of them wrote never verifies for the other, so neither
        is served the other's bytes. Rank is still absent: every rank of a deployment reads the others' blobs.
        """
        if not isinstance(deployment_id, str) or not deployment_id:
            raise ValueError(f"deployment_id must be a non-empty string, got {deployment_id!r}")
        doc = {"deployment_id": deployment_id, "namespace": self._fields()}
        raw = b"sglang_glm_ext.l3.deployment-namespace.v1\0" + json.dumps(doc, sort_keys=True,
                                                                            separators=(",", ":")).encode()
        return hashlib.blake2b(raw, digest_size=NS_DIGEST_BYTES).digest()


def key_to_bytes(key: "str | bytes | bytearray | memoryview") -> bytes:
    """SGLang page key (64 hex chars, SHA-256) or its 32 raw bytes -> 32 raw bytes; anything else is ValueError."""
    if isinstance(key, str):
        if len(key) != 2 * HASH_BYTES:
            raise ValueError(f"page key must be {2 * HASH_BYTES} hex chars, got {len(key)} chars")
        try:
            return bytes.fromhex(key)
        except ValueError:
            raise ValueError(f"page key is not hex: {key!r}") from None
    if isinstance(key, (bytes, bytearray, memoryview)):
        raw = bytes(key)
        if len(raw) != HASH_BYTES:
            raise ValueError(f"raw page key must be {HASH_BYTES} bytes, got {len(raw)}")
        return raw
    raise ValueError(f"page key must be a hex str or {HASH_BYTES} bytes, got {type(key).__name__}")


def round_up(n: int, align: int = BLOCK) -> int:
    return -(-n // align) * align


def slot_bytes_for(payload_len: int) -> int:
    """Smallest BLOCK multiple that holds payload + trailer header (the O_DIRECT write unit). Same as v1's
    header + payload, so a v1 slab keeps its geometry (and opens) under v2."""
    if payload_len < 0:
        raise ValueError(f"payload_len must be >= 0, got {payload_len}")
    return round_up(HEADER_SIZE + payload_len, BLOCK)


def header_offset(slot_bytes: int) -> int:
    """Where a v2 slot's header starts: its last HEADER_SIZE bytes."""
    return slot_bytes - HEADER_SIZE


def payload_checksum(buf) -> int:
    return xxhash.xxh3_64_intdigest(byte_view(buf))


# python-xxhash hashes a piece of this many bytes or fewer holding the GIL (XXHASH_GIL_MINSIZE in its _xxhash.c,
# 64 KiB; 4.1.0 exports it as _xxhash._GIL_MINSIZE).
XXHASH_GIL_MAX = int(getattr(getattr(xxhash, "_xxhash", None), "_GIL_MINSIZE", 64 * 1024))


def checksum_views(views, *, gil_pause_bytes: int = 0) -> int:
    """xxh3_64 of the concatenation of ``views`` (a page's pieces in payload order, where they landed): the same
    value as :func:`payload_checksum` over one contiguous copy, without making one.

    ``gil_pause_bytes`` > 0: after every that many bytes hashed holding the GIL (pieces of 64 KiB or less: a
    layer-first page's chunks), and once more at the end if any were, give the GIL up (``time.sleep(0)``), so
    another thread of the process (SGLang's scheduler) waits for at most that much hashing, not for a whole page, a
    run of pages hashed back to back, or the 5 ms switch interval. The value is the same either way."""
    if len(views) == 1:
        return xxhash.xxh3_64_intdigest(views[0])
    h = xxhash.xxh3_64()
    if gil_pause_bytes <= 0:
        for v in views:
            h.update(v)
        return h.intdigest()
    held = 0
    for v in views:
        h.update(v)
        n = getattr(v, "nbytes", None)  # memoryview / ndarray; bytes-like otherwise
        if n is None:
            n = len(v)
        if n <= XXHASH_GIL_MAX:
            held += n
            if held >= gil_pause_bytes:
                held = 0
                time.sleep(0)  # releases the GIL: a thread waiting for it runs now
    if held:
        time.sleep(0)
    return h.intdigest()


# XXH_featureTest()'s answer in xxhash's runtime dispatcher (xxh_x86dispatch.c): the vector unit XXH3 runs on.
_VECTOR_LEVELS = {0: "scalar", 1: "sse2", 2: "avx2", 3: "avx512"}


def checksum_build() -> dict:
    """Which xxhash computes every checksum here, and on which vector unit: ``version`` (python-xxhash),
    ``xxhash_c`` (the C library it vendors), ``vector`` (what XXH3 runs on), ``how`` (how that was found),
    ``cpu_best`` (the widest of sse2 / avx2 / avx512 that /proc/cpuinfo lists) and ``warning`` (None, or the fix
    when the CPU has vector units the build does not use).

    xxhash >= 4.1.0 links xxHash's x86 dispatcher (it picks SSE2, AVX2 or AVX-512 at run time), and its extension
    exports ``XXH_featureTest``, read here through ctypes. Earlier releases build XXH3 for the baseline only: SSE2
    on x86-64. The choice never changes a checksum's value (XXH3 is defined independently of the vector unit:
    tests/l3/test_checksum.py holds xxHash's published vectors and this format's own), so switching builds needs
    no format version."""
    import ctypes
    import platform

    out = {"version": getattr(xxhash, "VERSION", "?"), "xxhash_c": getattr(xxhash, "XXHASH_VERSION", "?"),
           "vector": None, "how": "", "cpu_best": _cpu_vector(), "warning": None}
    ext = getattr(getattr(xxhash, "_xxhash", None), "__file__", None)
    level = None
    if ext:
        try:
            probe = ctypes.CDLL(ext).XXH_featureTest
            probe.restype = ctypes.c_int
            level = probe()
        except (OSError, AttributeError):
            level = None
    machine = platform.machine().lower()
    if level in _VECTOR_LEVELS:
        out["vector"], out["how"] = _VECTOR_LEVELS[level], "XXH_featureTest() of the runtime dispatcher"
    elif machine in ("x86_64", "amd64"):
        out["vector"], out["how"] = "sse2", "no runtime dispatcher in this build (before 4.1.0): the x86-64 baseline"
    else:
        out["how"] = f"no runtime dispatcher on {machine}: what the wheel was compiled for"
    order = ["scalar", "sse2", "avx2", "avx512"]
    if out["vector"] in order and out["cpu_best"] in order and order.index(out["vector"]) < order.index("avx2") \
            <= order.index(out["cpu_best"]):
        out["warning"] = (f"xxhash {out['version']} runs XXH3 on {out['vector']} while this CPU has "
                          f"{out['cpu_best']}: install xxhash>=4.1.0 (same checksum values, 1.0-1.6x faster on a "
                          "cold page, up to 3x on a cached one)")
    return out


def _cpu_vector() -> "str | None":
    """The widest x86 vector unit /proc/cpuinfo lists (None where it says nothing of them, e.g. not x86)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return None
    return next((name for flag, name in (("avx512f", "avx512"), ("avx2", "avx2"), ("sse2", "sse2"))
                 if flag in flags), None)


def _header_checksum(raw) -> int:
    return xxhash.xxh3_64_intdigest(raw[:_CHECKSUMMED])


def encode_header_into(
    buf,
    offset: int,
    *,
    kind: "PayloadKind | str | int",
    content_hash: "str | bytes",
    payload_len: int,
    payload_checksum: int,
    ns_digest: bytes,
    slot_bytes: int,
    flags: int = 0,
) -> None:
    """Write a sealed v2 header at ``buf[offset:offset + HEADER_SIZE]``."""
    kind = PayloadKind.parse(kind)
    if len(ns_digest) != NS_DIGEST_BYTES:
        raise ValueError(f"ns_digest must be {NS_DIGEST_BYTES} bytes, got {len(ns_digest)}")
    if not all(0 <= v < 2**64 for v in (payload_len, payload_checksum, slot_bytes)):
        raise ValueError("payload_len, payload_checksum and slot_bytes must fit in u64")
    if flags & _MUST_UNDERSTAND_FLAGS & ~_KNOWN_FLAGS or not 0 <= flags < 2**32:
        raise ValueError(f"flags {flags:#x} set must-understand bits that v{FORMAT_VERSION} does not define")
    mv = byte_view(buf)
    _HEADER.pack_into(
        mv, offset, MAGIC, FORMAT_VERSION, int(kind), 0, flags, key_to_bytes(content_hash),
        payload_len, payload_checksum, bytes(ns_digest), slot_bytes, _ZERO_RESERVED,
    )
    _CHECKSUM.pack_into(mv, offset + _CHECKSUMMED, _header_checksum(mv[offset:offset + HEADER_SIZE]))


def seal_blob(buf, *, kind, content_hash, ns_digest: bytes, payload_len: int) -> int:
    """Make ``buf`` (a whole slot image: its length is the slot size) a v2 blob: checksum the payload already
    placed at ``buf[0:payload_len]``, zero the pad (no bytes of an older page survive in it) and write the header
    into the slot's last HEADER_SIZE bytes. The spill path gathers a page straight into the slot image, then
    seals: no extra copy. Returns the checksum."""
    mv = byte_view(buf)
    slot = len(mv)
    if payload_len < 0 or PAYLOAD_OFFSET + payload_len > header_offset(slot):
        raise ValueError(f"slot image of {slot} B cannot hold a {payload_len} B payload and its header")
    checksum = payload_checksum(mv[PAYLOAD_OFFSET:PAYLOAD_OFFSET + payload_len])
    hdr = header_offset(slot)
    mv[PAYLOAD_OFFSET + payload_len:hdr] = bytes(hdr - PAYLOAD_OFFSET - payload_len)
    encode_header_into(mv, hdr, kind=kind, content_hash=content_hash, payload_len=payload_len,
                       payload_checksum=checksum, ns_digest=ns_digest, slot_bytes=slot)
    return checksum


class BlobHeader(NamedTuple):
    """A parsed header (a tuple: it is made once per reload, on the hot path)."""

    version: int
    kind: PayloadKind
    flags: int
    content_hash: bytes
    payload_len: int
    payload_checksum: int
    ns_digest: bytes
    slot_bytes: int


def is_old_header(raw) -> bool:
    """``raw`` (a slot's first bytes) is a sealed v1 header: magic, version 1 and its header checksum. Used only to
    name a v1 blob (``old_version``); nothing of it is parsed further."""
    try:
        mv = byte_view(raw)
    except (TypeError, ValueError):
        return False
    if len(mv) < HEADER_SIZE:
        return False
    magic, version = _VERSION_AT.unpack_from(mv, 0)
    if magic != MAGIC or version not in OLD_FORMAT_VERSIONS:
        return False
    return _CHECKSUM.unpack_from(mv, _CHECKSUMMED)[0] == _header_checksum(mv)


def parse_header_reason(buf) -> "tuple[BlobHeader | None, BlobCheck]":
    """The header in ``buf``'s first HEADER_SIZE bytes (a slot's trailer): (header, OK) or (None, why), one of the
    header-alone :class:`BlobCheck` values. A v1 header given here is ``old_version``. Never raises on bad bytes."""
    if buf is None:
        return None, BlobCheck.EMPTY
    if type(buf) is bytes:  # a reload's trailer: no view to make (this runs once per page reloaded)
        raw = buf
    else:
        try:
            raw = byte_view(buf)
        except (TypeError, ValueError):
            return None, BlobCheck.SHORT
    if len(raw) < HEADER_SIZE:
        return None, BlobCheck.SHORT
    magic, version, kind_byte, reserved8, flags, chash, plen, pcsum, nsd, slot, reserved, stored = \
        _HEADER_ALL.unpack_from(raw, 0)
    if magic != MAGIC:
        return None, BlobCheck.EMPTY if not any(raw[:HEADER_SIZE]) else BlobCheck.BAD_MAGIC
    if version != FORMAT_VERSION:
        return None, BlobCheck.OLD_VERSION if version in OLD_FORMAT_VERSIONS else BlobCheck.UNKNOWN_VERSION
    if stored != _header_checksum(raw):
        return None, BlobCheck.HEADER_CHECKSUM
    kind = _KIND_BY_VALUE.get(kind_byte)
    if kind is None:
        return None, BlobCheck.UNKNOWN_KIND
    if flags & _MUST_UNDERSTAND_FLAGS & ~_KNOWN_FLAGS:
        return None, BlobCheck.UNKNOWN_FLAGS
    if reserved8 or reserved != _ZERO_RESERVED:
        return None, BlobCheck.RESERVED_NONZERO
    return BlobHeader(version, kind, flags, chash, plen, pcsum, nsd, slot), BlobCheck.OK


def parse_header(buf) -> "BlobHeader | None":
    return parse_header_reason(buf)[0]


def slot_header_reason(head, trailer) -> "tuple[BlobHeader | None, BlobCheck]":
    """Classify a slot from its first (``head``) and last (``trailer``) HEADER_SIZE bytes: the v2 header in the
    trailer; where there is none, a v1 header at the slot's start makes it ``old_version``."""
    header, why = parse_header_reason(trailer)
    if header is None and why in (BlobCheck.EMPTY, BlobCheck.BAD_MAGIC) and head is not None and is_old_header(head):
        return None, BlobCheck.OLD_VERSION
    return header, why


def check_header(header: BlobHeader, *, kind, content_hash, ns_digest: bytes, payload_len: "int | None",
                 slot_bytes: "int | None") -> BlobCheck:
    """Does a parsed header name exactly the page asked for, in a slot of this size? (The payload is checked
    separately, where it landed.) A caller bug (an unparseable kind or key) raises."""
    if header.kind != (kind if type(kind) is PayloadKind else PayloadKind.parse(kind)):
        return BlobCheck.KIND_MISMATCH
    if header.content_hash != (content_hash if type(content_hash) is bytes and len(content_hash) == HASH_BYTES
                               else key_to_bytes(content_hash)):
        return BlobCheck.HASH_MISMATCH
    if header.ns_digest != (ns_digest if type(ns_digest) is bytes else bytes(ns_digest)):
        return BlobCheck.NAMESPACE_MISMATCH
    if payload_len is not None and header.payload_len != payload_len:
        return BlobCheck.LENGTH_MISMATCH
    if slot_bytes is not None and header.slot_bytes != slot_bytes:
        return BlobCheck.LENGTH_MISMATCH
    if PAYLOAD_OFFSET + header.payload_len > header_offset(header.slot_bytes):
        return BlobCheck.LENGTH_MISMATCH
    return BlobCheck.OK


def verify_blob_reason(
    buf, *, kind, content_hash, ns_digest: bytes, payload_len: "int | None" = None,
) -> "tuple[memoryview | None, BlobCheck]":
    """(payload view, OK) only if ``buf`` -- a whole slot image, its length the slot size -- holds exactly the page
    asked for; else (None, why). The contiguous form of the check (fsck, tools, tests); reloads check the same
    fields over the bytes where they landed (reload.py).

    A caller bug (an unparseable kind or key) still raises: that is not a property of the disk.
    """
    want_kind = PayloadKind.parse(kind)
    want_hash = key_to_bytes(content_hash)
    try:
        mv = byte_view(buf)
    except (TypeError, ValueError):
        return None, BlobCheck.SHORT
    if len(mv) < HEADER_SIZE:
        return None, BlobCheck.SHORT
    header, reason = slot_header_reason(mv[:HEADER_SIZE], mv[header_offset(len(mv)):])
    if header is None:
        return None, reason
    reason = check_header(header, kind=want_kind, content_hash=want_hash, ns_digest=ns_digest,
                          payload_len=payload_len, slot_bytes=None)
    if reason is not BlobCheck.OK:
        return None, reason
    if header.slot_bytes != len(mv):
        return None, BlobCheck.TRUNCATED if header.slot_bytes > len(mv) else BlobCheck.LENGTH_MISMATCH
    payload = mv[PAYLOAD_OFFSET:PAYLOAD_OFFSET + header.payload_len]
    if payload_checksum(payload) != header.payload_checksum:
        return None, BlobCheck.PAYLOAD_CHECKSUM
    return payload, BlobCheck.OK


def verify_blob(buf, *, kind, content_hash, ns_digest: bytes, payload_len: "int | None" = None) -> "memoryview | None":
    return verify_blob_reason(buf, kind=kind, content_hash=content_hash, ns_digest=ns_digest,
                              payload_len=payload_len)[0]
