"""Blob format: a read returns exactly the page that was written, or a miss with a reason -- never other bytes."""

import random
import struct

import pytest
import xxhash

from sglang_glm_ext.l3.disk import format as F
from sglang_glm_ext.l3.disk.aligned import AlignedBuffer

NS = F.Namespace("glm-5", "fp8_e4m3", "page_first", 64, 0, 78, "tp0of1")
KEY = "0123456789abcdef" * 4


def make_blob(payload: bytes, *, kind=F.PayloadKind.TARGET_KV, key=KEY, ns=NS) -> bytearray:
    buf = bytearray(F.slot_bytes_for(len(payload)))
    buf[F.PAYLOAD_OFFSET:F.PAYLOAD_OFFSET + len(payload)] = payload
    F.seal_blob(buf, kind=kind, content_hash=key, ns_digest=ns.digest(), payload_len=len(payload))
    return buf


def hdr(buf) -> int:
    """Where a v2 slot image's header starts."""
    return len(buf) - F.HEADER_SIZE


def make_v1_blob(payload: bytes, *, key=KEY, ns=NS) -> bytearray:
    """A slot as format v1 (earlier builds) wrote it, byte for byte: the header in front of the payload."""
    buf = bytearray(F.slot_bytes_for(len(payload)))
    buf[128:128 + len(payload)] = payload
    struct.pack_into("<8sHBBI32sQQ16s40s", buf, 0, b"GLML3BLB", 1, 1, 0, 0, bytes.fromhex(key), len(payload),
                     xxhash.xxh3_64_intdigest(payload), ns.digest(), bytes(40))
    struct.pack_into("<Q", buf, 120, xxhash.xxh3_64_intdigest(bytes(buf[:120])))
    return buf


def verify(buf, **kw):
    args = dict(kind=F.PayloadKind.TARGET_KV, content_hash=KEY, ns_digest=NS.digest())
    args.update(kw)
    return F.verify_blob_reason(buf, **args)


def test_header_is_fixed_size_and_block_math():
    assert F.HEADER_SIZE == 128 and F.BLOCK == 4096
    glm5_page = 64 * 78 * 656
    assert glm5_page == 3_274_752
    assert F.slot_bytes_for(glm5_page) == 800 * 4096  # the trailer fits in the page's last partial block
    assert F.PAYLOAD_OFFSET == 0 and F.header_offset(800 * 4096) == 800 * 4096 - 128
    assert F.slot_bytes_for(0) == 4096
    assert F.slot_bytes_for(4096 - 128) == 4096
    assert F.slot_bytes_for(4096 - 127) == 8192
    with pytest.raises(ValueError):
        F.slot_bytes_for(-1)


def test_roundtrip_returns_exact_payload():
    payload = bytes(random.Random(1).randbytes(10_000))
    got, reason = verify(make_blob(payload))
    assert reason == "ok" and bytes(got) == payload
    blob = make_blob(payload)
    assert bytes(blob[:len(payload)]) == payload  # the payload is the slot's first bytes (a direct read's target)
    header = F.parse_header(blob[hdr(blob):])
    assert header.version == F.FORMAT_VERSION == 2 and header.kind is F.PayloadKind.TARGET_KV
    assert header.slot_bytes == len(blob)
    assert header.payload_len == len(payload) and header.content_hash == bytes.fromhex(KEY)
    assert header.payload_checksum == xxhash.xxh3_64_intdigest(payload)


def test_works_with_aligned_buffer():
    payload = b"x" * 5000
    with AlignedBuffer(F.slot_bytes_for(len(payload))) as buf:
        buf.view[F.PAYLOAD_OFFSET:F.PAYLOAD_OFFSET + len(payload)] = payload
        F.seal_blob(buf, kind="draft_kv", content_hash=KEY, ns_digest=NS.digest(), payload_len=len(payload))
        got = F.verify_blob(buf, kind=F.PayloadKind.DRAFT_KV, content_hash=KEY, ns_digest=NS.digest())
        assert bytes(got) == payload
        got.release()


@pytest.mark.parametrize(
    "override, reason",
    [
        (dict(kind=F.PayloadKind.INDEX_K), "kind_mismatch"),
        (dict(content_hash="f" * 64), "hash_mismatch"),
        (dict(ns_digest=F.Namespace("glm-5", "fp8_e4m3", "page_first", 64, 0, 78, "tp1of2").digest()),
         "namespace_mismatch"),
        (dict(ns_digest=F.Namespace("glm-5", "bf16", "page_first", 64, 0, 78, "tp0of1").digest()),
         "namespace_mismatch"),
        (dict(payload_len=999), "length_mismatch"),
    ],
)
def test_any_identity_mismatch_is_a_miss(override, reason):
    assert verify(make_blob(b"p" * 1000), **override) == (None, reason)


def test_zeroed_slot_is_empty_miss():
    assert verify(bytearray(4096)) == (None, "empty")
    assert F.parse_header_reason(None) == (None, "empty")
    assert F.parse_header_reason(b"\0" * 10) == (None, "short")


def test_unknown_version_is_a_miss_with_reason():
    buf = make_blob(b"v" * 100)
    struct.pack_into("<H", buf, hdr(buf) + 8, F.FORMAT_VERSION + 1)
    assert F.parse_header_reason(buf[hdr(buf):]) == (None, "unknown_version")
    assert verify(buf) == (None, "unknown_version")


def test_a_v1_blob_is_an_old_version_miss_never_served():
    """The upgrade policy (l3_format.md): a v1 slot -- header in front, payload behind -- is recognised and named,
    and never returns its payload, however intact."""
    payload = bytes(random.Random(9).randbytes(3000))
    v1 = make_v1_blob(payload)
    assert verify(v1) == (None, "old_version")
    assert F.is_old_header(v1) and not F.is_old_header(make_blob(payload))
    assert F.parse_header_reason(v1) == (None, "old_version")  # a v1 header handed over directly
    assert F.slot_header_reason(v1[:128], v1[hdr(v1):]) == (None, "old_version")
    # a v1 header whose checksum fails is just bytes: the trailer's own verdict stands
    bad = bytearray(v1)
    bad[20] ^= 1
    assert verify(bad) == (None, "empty")


def test_unknown_must_understand_flag_is_a_miss():
    buf = make_blob(b"f" * 100)
    h = hdr(buf)
    struct.pack_into("<I", buf, h + 12, 1)
    # re-seal the header checksum so only the flag differs from a valid v2 header
    struct.pack_into("<Q", buf, h + 120, xxhash.xxh3_64_intdigest(bytes(buf[h:h + 120])))
    assert F.parse_header_reason(buf[h:]) == (None, "unknown_flags")


def test_unknown_kind_is_a_miss():
    buf = make_blob(b"k" * 100)
    h = hdr(buf)
    buf[h + 10] = 99
    struct.pack_into("<Q", buf, h + 120, xxhash.xxh3_64_intdigest(bytes(buf[h:h + 120])))
    assert F.parse_header_reason(buf[h:]) == (None, "unknown_kind")


def test_a_header_that_closes_another_slot_size_is_a_miss():
    small = make_blob(b"s" * 100)  # a 4 KiB slot's image...
    big = bytearray(8192)
    big[8192 - 4096:] = small  # ...found at the end of an 8 KiB slot: its header names 4096, not this slot
    assert verify(big) == (None, "length_mismatch")


def test_garbage_is_bad_magic_and_never_raises():
    rng = random.Random(7)
    for _ in range(200):
        header, reason = F.parse_header_reason(bytes(rng.randbytes(rng.randrange(0, 300))))
        assert header is None and reason in ("short", "bad_magic", "empty")


def test_torn_write_half_slot_is_a_miss():
    payload = bytes(random.Random(2).randbytes(3 * 4096))
    old = make_blob(bytes(random.Random(3).randbytes(len(payload))), key="a" * 64)
    new = make_blob(payload)
    torn = bytearray(old)
    torn[: len(new) // 2] = new[: len(new) // 2]  # first half of the new payload, old tail and old header
    assert verify(torn) == (None, "hash_mismatch")  # the surviving header names the previous occupant
    assert verify(torn, content_hash="a" * 64) == (None, "payload_checksum")
    torn = bytearray(old)
    torn[len(new) // 2:] = new[len(new) // 2:]  # the new header landed, the payload's start did not
    assert verify(torn) == (None, "payload_checksum")
    assert verify(new[:-1]) == (None, "bad_magic")  # not a whole slot: no header where one must be


def test_random_bit_flips_never_return_wrong_bytes():
    """Flip 1-3 random bits anywhere in header+payload: every trial is a miss, or returns exactly the original."""
    rng = random.Random(20251130)
    payload = bytes(rng.randbytes(2048))
    clean = make_blob(payload)
    covered = list(range(len(payload))) + list(range(hdr(clean), len(clean)))  # payload + header, not the pad
    misses = exact = 0
    for _ in range(5000):
        buf = bytearray(clean)
        for _ in range(rng.randint(1, 3)):
            bit = rng.randrange(len(covered) * 8)
            buf[covered[bit // 8]] ^= 1 << (bit % 8)
        got, reason = verify(buf)
        if got is None:
            misses += 1
            assert reason != "ok"
        else:
            assert bytes(got) == payload
            exact += 1
    # flips that cancel out (same bit twice) are the only way to get a hit
    assert misses > 4900


def test_header_flip_in_every_field_is_detected():
    buf = make_blob(b"h" * 500)
    for byte in range(F.HEADER_SIZE):
        flipped = bytearray(buf)
        flipped[hdr(buf) + byte] ^= 0x10
        assert verify(flipped)[0] is None, f"flip in header byte {byte} went unnoticed"


def test_key_to_bytes_accepts_hex_and_raw_only():
    raw = bytes(range(32))
    assert F.key_to_bytes(raw.hex()) == raw
    assert F.key_to_bytes(raw.hex().upper()) == raw
    assert F.key_to_bytes(raw) == raw
    assert F.key_to_bytes(bytearray(raw)) == raw
    for bad in ("ab" * 31, "zz" * 32, raw[:31], 123, None):
        with pytest.raises(ValueError):
            F.key_to_bytes(bad)


def test_payload_kind_parse():
    assert F.PayloadKind.parse("index_k") is F.PayloadKind.INDEX_K
    assert F.PayloadKind.parse("DRAFT_INDEX_K") is F.PayloadKind.DRAFT_INDEX_K
    assert F.PayloadKind.parse(2) is F.PayloadKind.DRAFT_KV
    assert [k.label for k in F.PayloadKind] == ["target_kv", "draft_kv", "index_k", "draft_index_k"]
    with pytest.raises(ValueError, match="target_kv, draft_kv, index_k, draft_index_k"):
        F.PayloadKind.parse("kv")


PINNED_DEPLOYMENT_DIGEST = "344d41407d6f042c0f0bc48e4c14fbaf"


def test_namespace_digest_stable_and_sensitive():
    d = NS.digest()
    assert len(d) == 16 and d == F.Namespace(**vars(NS)).digest()
    for field, value in [("model", "glm-5.1"), ("kv_dtype", "bf16"), ("layout", "layer_first"), ("page_size", 32),
                         ("layer_start", 1), ("layer_end", 77), ("shard", "replicated")]:
        other = F.Namespace(**{**vars(NS), field: value})
        assert other.digest() != d, field
    with pytest.raises(ValueError):
        F.Namespace("m", "fp8", "page_first", 64, 5, 5, "tp0of1")
    with pytest.raises(ValueError):
        F.Namespace("", "fp8", "page_first", 64, 0, 1, "tp0of1")


def test_deployment_digest_binds_the_deployment_and_the_namespace():
    """Issue 7, item 2: the digest a store seals and checks every blob with names the deployment too."""
    d = NS.digest_for("prod")
    assert len(d) == 16 and d == F.Namespace(**vars(NS)).digest_for("prod")
    assert d != NS.digest() and d != NS.digest_for("prod2") and d != NS.digest_for("pro")
    assert d != F.Namespace(**{**vars(NS), "shard": "tp1of2"}).digest_for("prod")


def test_on_disk_encoding_is_pinned():
    """Digest and header bytes are on disk: they may only change together with a FORMAT_VERSION bump."""
    assert NS.digest().hex() == "296216c0068710c9a6e14da5cfca533d"
    assert NS.digest_for("prod").hex() == PINNED_DEPLOYMENT_DIGEST
    buf = bytearray(F.HEADER_SIZE)
    F.encode_header_into(buf, 0, kind=1, content_hash="00" * 32, payload_len=5, payload_checksum=7,
                         ns_digest=bytes(16), slot_bytes=4096)
    assert buf[:8] == b"GLML3BLB" and buf[8:12] == b"\x02\x00\x01\x00"
    assert struct.unpack_from("<QQ", buf, 48) == (5, 7)
    assert struct.unpack_from("<Q", buf, 80) == (4096,)
    assert buf[120:].hex() == "5d96bfacf2c220b8"
