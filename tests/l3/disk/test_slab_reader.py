"""SlabReader, the one read-only view of a slab file: its three geometries (strict, unknown slot count, tolerant
for fsck) and the owner's reads going through it."""

import numpy as np
import pytest

from sglang_glm_ext.l3.disk.aligned import AlignedBuffer
from sglang_glm_ext.l3.disk.slab import DiskSlab
from sglang_glm_ext.l3.errors import SlabGeometryError
from sglang_glm_ext.l3.disk.slab_reader import ShortRead, SlabReader

SLOT = 2 * 4096


def _slab_file(tmp_path, slots: int):
    path = tmp_path / "x.slab"
    data = np.random.default_rng(slots).integers(1, 256, slots * SLOT, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    return path, data


def test_strict_geometry_is_checked_at_open_and_slots_are_bounded(tmp_path):
    path, data = _slab_file(tmp_path, 3)
    with pytest.raises(SlabGeometryError):
        SlabReader(path, SLOT, num_slots=4)
    with SlabReader(path, SLOT, num_slots=3) as rd, AlignedBuffer(SLOT) as buf:
        assert rd.read_slot_into(2, buf, SLOT) == SLOT
        assert bytes(buf.view) == data[2 * SLOT:].tobytes()
        with pytest.raises(IndexError):
            rd.read_slot_into(3, buf, SLOT)


def test_an_unknown_slot_count_reads_any_slot_and_a_slot_past_the_end_is_a_short_read(tmp_path):
    path, data = _slab_file(tmp_path, 2)
    with SlabReader(path, SLOT) as rd, AlignedBuffer(SLOT) as buf:
        assert rd.num_slots is None
        assert rd.read_slot_into(1, buf, SLOT) == SLOT and bytes(buf.view) == data[SLOT:].tobytes()
        with pytest.raises(ShortRead):  # another rank's smaller slab: the entry that named it is bad
            rd.read_slot_into(2, buf, SLOT)


def test_tolerant_mode_counts_whole_slots_and_reads_past_the_end_as_an_empty_slot(tmp_path):
    path, data = _slab_file(tmp_path, 3)
    with open(path, "r+b") as f:
        f.truncate(2 * SLOT + 100)  # a torn tail: two whole slots and a fragment
    with SlabReader(path, SLOT, num_slots=5, tolerant=True) as rd, AlignedBuffer(SLOT) as buf:
        assert rd.num_slots == 2  # what the file holds, not what the sidecar meant
        buf.view[:] = b"\xee" * SLOT  # stale bytes of an earlier read must not survive a short one
        assert rd.read_slot_into(2, buf, SLOT) == SLOT
        assert bytes(buf.view[:100]) == data[2 * SLOT:2 * SLOT + 100].tobytes()
        assert not any(buf.view[100:])
        assert rd.read_slot_into(4, buf, 4096) == 4096 and not any(buf.view[:4096])


def test_an_owner_slab_reads_through_its_reader_which_never_closes_the_owners_descriptor(tmp_path):
    slab = DiskSlab.open(tmp_path / "o.slab", slot_bytes=SLOT, num_slots=2)
    with AlignedBuffer(SLOT) as buf:
        buf.view[:] = b"\x5a" * SLOT
        slab.write_slot(1, buf)
        out = bytearray(SLOT + 1)
        dst = memoryview(out)[1:]  # unaligned: goes through the reader's bounce buffer
        assert slab.read_slot_into(1, dst, SLOT) == SLOT and bytes(dst) == b"\x5a" * SLOT
    assert slab.counters["writes"] == 1 and sum(v for k, v in slab.counters.items() if k != "writes") == 1
    slab.close()  # one close of the descriptor: a second one (by the reader) would raise EBADF here
    slab.close()
    with pytest.raises(ValueError, match="closed"):
        slab.read_header(0)
