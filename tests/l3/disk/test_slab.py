"""DiskSlab on real files: O_DIRECT and buffered I/O, locking, permissions, preallocation, injected faults."""

import errno
import os
import re
import stat
import subprocess
import sys

import pytest

import l3kit
from sglang_glm_ext.l3.disk import slab as D
from sglang_glm_ext.l3.disk import format as F
from sglang_glm_ext.l3.disk.aligned import AlignedBuffer
from sglang_glm_ext.l3.disk.slab import DiskSlab, SlabError, SlabGeometryError, SlabLockedError

REPO = l3kit.REPO
NS = F.Namespace("glm-5", "fp8_e4m3", "page_first", 64, 0, 78, "tp0of1").digest()
PAYLOAD_LEN = 3 * 4096 + 1000  # deliberately not a BLOCK multiple, like GLM-5 pages
SLOT = F.slot_bytes_for(PAYLOAD_LEN)


def blob(seed: int, key: str = "ab" * 32) -> "tuple[AlignedBuffer, bytes]":
    payload = bytes((seed * 7 + i) % 251 for i in range(PAYLOAD_LEN))
    buf = AlignedBuffer(SLOT)
    buf.view[F.PAYLOAD_OFFSET:F.PAYLOAD_OFFSET + PAYLOAD_LEN] = payload
    F.seal_blob(buf, kind="target_kv", content_hash=key, ns_digest=NS, payload_len=PAYLOAD_LEN)
    return buf, payload


def read_verified(slab, slot, key="ab" * 32):
    out = AlignedBuffer(SLOT)
    slab.read_slot_into(slot, out, SLOT)  # a v2 blob is the whole slot: payload first, header last
    got, reason = F.verify_blob_reason(out, kind="target_kv", content_hash=key, ns_digest=NS)
    return (bytes(got) if got is not None else None), reason


def test_o_direct_roundtrip_on_real_file(slab):
    assert slab.io_mode == "o_direct" and slab.fallback_reason is None
    buf, payload = blob(1)
    slab.write_slot(5, buf)
    slab.sync()
    assert read_verified(slab, 5) == (payload, "ok")
    assert slab.counters["direct_reads"] == 1 and slab.counters["bounce_reads"] == 0
    assert read_verified(slab, 4) == (None, "empty")


def test_forced_buffered_mode_roundtrip(tmp_path):
    with DiskSlab.open(tmp_path / "s.slab", slot_bytes=SLOT, num_slots=2, direct=False) as s:
        assert s.io_mode == "buffered" and "direct=False" in s.fallback_reason
        buf, payload = blob(2)
        s.write_slot(1, buf)
        s.sync()
        assert read_verified(s, 1) == (payload, "ok")
        assert s.counters["buffered_reads"] == 1


def test_auto_falls_back_when_o_direct_refused(tmp_path, monkeypatch):
    def refuse(fd):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(D, "_enable_direct", refuse)
    with DiskSlab.open(tmp_path / "a.slab", slot_bytes=SLOT, num_slots=2) as s:
        assert s.io_mode == "buffered" and "EINVAL" in s.fallback_reason
        buf, payload = blob(3)
        s.write_slot(0, buf)
        assert read_verified(s, 0) == (payload, "ok")
    with pytest.raises(D.DirectIOUnavailable, match="refuses O_DIRECT"):
        DiskSlab.open(tmp_path / "b.slab", slot_bytes=SLOT, num_slots=2, direct=True)


def test_tmpfs_mode_is_reported_consistently():
    # Kernels >= 6.6 accept O_DIRECT on tmpfs, older ones refuse it: either way the choice is reported.
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    path = f"/dev/shm/l3-test-{os.getpid()}.slab"
    try:
        with DiskSlab.open(path, slot_bytes=SLOT, num_slots=2) as s:
            assert (s.io_mode == "o_direct") == (s.fallback_reason is None)
            buf, payload = blob(4)
            s.write_slot(1, buf)
            assert read_verified(s, 1) == (payload, "ok")
    finally:
        os.unlink(path)


def test_unaligned_destination_goes_through_bounce_byte_exact(slab):
    buf, payload = blob(5)
    slab.write_slot(2, buf)
    n = PAYLOAD_LEN
    backing = bytearray(n + 1 + 64)
    dst = memoryview(backing)[1:1 + n + 64]  # odd address
    dst[n:] = b"\xee" * 64
    slab.read_slot_into(2, dst, n)
    assert slab.counters["bounce_reads"] == 1 and slab.counters["direct_reads"] == 0
    assert bytes(dst[:n]) == payload
    assert bytes(dst[n:]) == b"\xee" * 64  # the rounded-up read never spills past nbytes


def test_aligned_but_too_short_destination_uses_bounce(slab):
    buf, payload = blob(6)
    slab.write_slot(3, buf)
    n = PAYLOAD_LEN
    with AlignedBuffer(n) as dst:  # aligned, but no room for roundup(n, BLOCK)
        slab.read_slot_into(3, dst, n)
        assert bytes(dst.view) == payload
    assert slab.counters["bounce_reads"] == 1


def test_caller_supplied_bounce_buffer(slab):
    buf, payload = blob(7)
    slab.write_slot(0, buf)
    dst = bytearray(PAYLOAD_LEN)
    with AlignedBuffer(SLOT) as bounce:
        slab.read_slot_into(0, dst, len(dst), bounce=bounce)
    assert bytes(dst) == payload
    with pytest.raises(ValueError):
        slab.read_slot_into(0, dst, len(dst), bounce=AlignedBuffer(4096))


def test_read_header_reads_one_block(slab):
    buf, _ = blob(8, key="cd" * 32)
    slab.write_slot(6, buf)
    raw = slab.read_header(6)
    assert len(raw) == F.HEADER_SIZE
    assert F.parse_header(raw).content_hash == bytes.fromhex("cd" * 32)
    assert F.parse_header_reason(slab.read_header(7)) == (None, "empty")


def test_permissions_owner_only_despite_umask(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "a" / "b" / "s.slab"
        DiskSlab.open(path, slot_bytes=4096, num_slots=1).close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "b").st_mode) == 0o700


def test_existing_file_with_loose_mode_is_tightened(tmp_path):
    path = tmp_path / "s.slab"
    path.write_bytes(b"")
    os.chmod(path, 0o644)
    DiskSlab.open(path, slot_bytes=4096, num_slots=2).close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_existing_parent_dir_mode_left_alone(tmp_path):
    os.chmod(tmp_path, 0o755)
    DiskSlab.open(tmp_path / "s.slab", slot_bytes=4096, num_slots=1).close()
    assert stat.S_IMODE(os.stat(tmp_path).st_mode) == 0o755


def test_second_opener_in_process_is_locked_out(slab):
    with pytest.raises(SlabLockedError, match=re.escape(slab.path)):
        DiskSlab.open(slab.path, slot_bytes=SLOT, num_slots=8)
    assert os.path.exists(slab.path)  # a refused opener never deletes the owner's file


def test_second_opener_in_other_process_is_locked_out_until_close(slab):
    code = (
        "import sys\n"
        "from sglang_glm_ext.l3.disk.slab import DiskSlab, SlabLockedError\n"
        "try:\n"
        f"    DiskSlab.open({str(slab.path)!r}, slot_bytes={SLOT}, num_slots=8).close(); print('OPENED')\n"
        "except SlabLockedError as e:\n"
        "    print('LOCKED', e)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("LOCKED") and slab.path in out.stdout, out.stderr
    slab.close()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("OPENED"), out.stderr


def test_preallocated_with_real_blocks(slab):
    st = os.stat(slab.path)
    assert slab.prealloc == "fallocate"
    assert st.st_size == SLOT * 8 and st.st_blocks * 512 >= SLOT * 8


def test_ftruncate_fallback_is_reported_and_sparse(tmp_path, monkeypatch):
    def unsupported(fd, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(D, "_fallocate", unsupported)
    with DiskSlab.open(tmp_path / "s.slab", slot_bytes=SLOT, num_slots=64) as s:
        assert s.prealloc == "ftruncate" and "sparse" in s.prealloc_reason
        st = os.stat(s.path)
        assert st.st_size == SLOT * 64 and st.st_blocks * 512 < SLOT * 64


def test_no_space_at_open_is_clear_and_leaves_no_file(tmp_path, monkeypatch):
    def full(fd, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(D, "_fallocate", full)
    with pytest.raises(SlabError, match="no space"):
        DiskSlab.open(tmp_path / "s.slab", slot_bytes=4096, num_slots=4)
    assert not (tmp_path / "s.slab").exists()


def test_reopen_same_geometry_keeps_blobs(tmp_path):
    path = tmp_path / "s.slab"
    buf, payload = blob(9)
    with DiskSlab.open(path, slot_bytes=SLOT, num_slots=4) as s:
        assert s.created
        s.write_slot(2, buf)
        s.sync()
    with DiskSlab.open(path, slot_bytes=SLOT, num_slots=4, create=False) as s:
        assert not s.created
        assert read_verified(s, 2) == (payload, "ok")


def test_different_geometry_is_an_error_and_file_untouched(tmp_path):
    path = tmp_path / "s.slab"
    DiskSlab.open(path, slot_bytes=SLOT, num_slots=4).close()
    with pytest.raises(SlabGeometryError, match="delete the file"):
        DiskSlab.open(path, slot_bytes=SLOT, num_slots=5)
    with pytest.raises(SlabGeometryError):
        DiskSlab.open(path, slot_bytes=SLOT + 4096, num_slots=4)
    assert os.path.getsize(path) == SLOT * 4


@pytest.mark.parametrize("kw, match", [
    (dict(slot_bytes=4097, num_slots=1), "multiple of 4096"),
    (dict(slot_bytes=4096, num_slots=0), "num_slots"),
    (dict(slot_bytes=0, num_slots=1), "slot_bytes"),
    (dict(slot_bytes=4096, num_slots=1, direct="yes"), "direct"),
])
def test_bad_geometry_is_clear_at_open(tmp_path, kw, match):
    with pytest.raises(SlabError, match=match):
        DiskSlab.open(tmp_path / "s.slab", **kw)


def test_unwritable_or_missing_path_is_clear_at_open(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")
    with pytest.raises(SlabError, match="cannot open|Not a directory|File exists"):
        DiskSlab.open(blocker / "s.slab", slot_bytes=4096, num_slots=1)
    with pytest.raises(SlabError, match="does not exist"):
        DiskSlab.open(tmp_path / "missing.slab", slot_bytes=4096, num_slots=1, create=False)


def test_write_validation_is_loud(slab):
    with AlignedBuffer(SLOT + 4096) as big, AlignedBuffer(SLOT) as ok:
        with pytest.raises(ValueError):
            slab.write_slot(0, big)  # larger than a slot would clobber the next one
        with pytest.raises(ValueError):
            slab.write_slot(0, ok.view[:1000])  # not a BLOCK multiple
        # O_DIRECT needs aligned memory. A view one byte into an aligned buffer is never aligned (a fresh
        # bytearray is only by chance: malloc hands out 4 KiB-aligned memory now and then, and CI met one).
        with pytest.raises(ValueError, match="aligned"):
            slab.write_slot(0, big.view[1 : 1 + 4096])
        with pytest.raises(IndexError):
            slab.write_slot(8, ok)


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO])
def test_injected_write_errors_raise_oserror(slab, err):
    buf, _ = blob(10)
    slab.inject_write_fault(D.fail_write(err))
    with pytest.raises(OSError) as info:
        slab.write_slot(1, buf)
    assert info.value.errno == err
    slab.inject_write_fault(None)
    slab.write_slot(1, buf)  # restored


def test_fail_write_after_n(slab):
    buf, _ = blob(11)
    slab.inject_write_fault(D.fail_write(errno.EIO, after=1))
    slab.write_slot(0, buf)
    with pytest.raises(OSError):
        slab.write_slot(1, buf)


@pytest.mark.parametrize("report", ["error", "success"])
def test_a_torn_write_over_another_page_is_a_miss(slab, report):
    """The new payload's first half landed, the previous occupant's second half and trailer header survived: that
    header names the old page, so the slot never verifies for the new key (nor, its payload mixed, for the old)."""
    old, _ = blob(12, key="11" * 32)
    slab.write_slot(4, old)
    new, payload = blob(13)
    slab.inject_write_fault(D.torn_write(SLOT // 2, report=report))
    if report == "error":
        with pytest.raises(OSError):
            slab.write_slot(4, new)
    else:
        slab.write_slot(4, new)  # the lying drive: acked, tail lost
    slab.inject_write_fault(None)
    assert read_verified(slab, 4) == (None, "hash_mismatch")
    assert read_verified(slab, 4, key="11" * 32) == (None, "payload_checksum")


def test_a_torn_write_over_the_same_page_is_a_miss(slab):
    """The previous occupant was the same page with other bytes (a page freed and stored again): its surviving
    header names the right key, but its checksum covers bytes that are now half new."""
    old, _ = blob(20)
    slab.write_slot(4, old)
    new, _ = blob(21)
    slab.inject_write_fault(D.torn_write(SLOT // 2, report="success"))
    slab.write_slot(4, new)
    slab.inject_write_fault(None)
    assert read_verified(slab, 4) == (None, "payload_checksum")


def test_a_write_whose_head_was_lost_is_a_miss(slab):
    """Blocks may reach the media in any order: the new trailer header landed, the payload's start did not."""
    old, _ = blob(22, key="11" * 32)
    slab.write_slot(4, old)
    new, _ = blob(23)

    def tail_only(fd, data, offset):
        half = len(data) // 2 // 4096 * 4096
        os.pwrite(fd, memoryview(data)[half:], offset + half)
        return len(data)

    slab.inject_write_fault(tail_only)
    slab.write_slot(4, new)
    slab.inject_write_fault(None)
    assert read_verified(slab, 4) == (None, "payload_checksum")


def test_short_writes_are_completed(slab):
    buf, payload = blob(14)
    slab.inject_write_fault(D.short_write(4096))
    slab.write_slot(7, buf)
    slab.inject_write_fault(None)
    assert read_verified(slab, 7) == (payload, "ok")


def test_write_without_progress_is_an_error(slab):
    buf, _ = blob(15)
    slab.inject_write_fault(lambda fd, data, offset: 0)
    with pytest.raises(OSError, match="no progress"):
        slab.write_slot(0, buf)


def test_closed_slab_refuses_io(tmp_path):
    s = DiskSlab.open(tmp_path / "s.slab", slot_bytes=4096, num_slots=1)
    s.close()
    s.close()
    with pytest.raises(ValueError, match="closed"):
        s.read_header(0)


def test_reader_sees_owner_blobs_without_taking_the_lock(slab):
    buf, payload = blob(16)
    slab.write_slot(1, buf)
    slab.sync()
    with DiskSlab.open_reader(slab.path, slot_bytes=SLOT, num_slots=8) as reader:
        assert reader.io_mode == "o_direct"
        assert read_verified(reader, 1) == (payload, "ok")
        with pytest.raises(ValueError, match="read-only"):
            reader.write_slot(1, buf)
    with pytest.raises(SlabGeometryError):
        DiskSlab.open_reader(slab.path, slot_bytes=SLOT, num_slots=9)
    with pytest.raises(SlabError, match="for reading"):
        DiskSlab.open_reader(slab.path + ".missing", slot_bytes=SLOT, num_slots=8)


def test_concurrent_bounce_reads_do_not_share_a_buffer(slab):
    """Each thread gets its own bounce buffer: interleaved unaligned reads of different slots stay byte-exact."""
    import threading

    expected = {}
    for slot in range(4):
        buf, payload = blob(100 + slot, key=f"{slot:02x}" * 32)
        slab.write_slot(slot, buf)
        expected[slot] = payload
    errors = []

    def reader(slot):
        n = SLOT
        backing = bytearray(n + 1)
        for _ in range(200):
            dst = memoryview(backing)[1:]
            slab.read_slot_into(slot, dst, n)
            got = F.verify_blob(dst, kind="target_kv", content_hash=f"{slot:02x}" * 32, ns_digest=NS)
            if got is None or bytes(got) != expected[slot]:
                errors.append(slot)
                return

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
