"""The direct-I/O alignment is read from the system (statx on the file itself, then sysfs, then the file system's
block size), and a reader uses what its own file reports."""

import os

from sglang_glm_ext.l3.disk import dio_align as A
from sglang_glm_ext.l3.disk.slab_reader import SlabReader


def _pow2(n):
    return n > 0 and n & (n - 1) == 0


def test_a_real_file_reports_power_of_two_alignments(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(bytes(8192))
    fd = os.open(path, os.O_RDONLY)
    try:
        got = A.probe_dio_alignment(fd)
        assert _pow2(got.mem) and _pow2(got.offset) and got.source
        direct = A.statx_dioalign(fd)
        if direct is not None:  # Linux >= 6.1 on ext4 / xfs / btrfs: the file's own answer wins
            assert (got.mem, got.offset) == direct and got.source == "statx STATX_DIOALIGN"
    finally:
        os.close(fd)


def test_without_statx_the_block_device_then_the_file_system_answers(tmp_path):
    sysfs = tmp_path / "sys"
    path = tmp_path / "f"
    path.write_bytes(b"x")
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        major, minor = os.major(st.st_dev), os.minor(st.st_dev)
        none = lambda fd: None  # noqa: E731  (a kernel without STATX_DIOALIGN)
        if major:
            disk = sysfs / "devices" / "vdz"
            part = disk / "vdz1"
            (disk / "queue").mkdir(parents=True)
            part.mkdir()
            (disk / "queue" / "logical_block_size").write_text("4096\n")
            (sysfs / "dev" / "block").mkdir(parents=True)
            os.symlink(part, sysfs / "dev" / "block" / f"{major}:{minor}")  # a partition: its disk's queue
            got = A.probe_dio_alignment(fd, statx=none, sysfs_root=str(sysfs))
            assert (got.mem, got.offset, got.source) == (4096, 4096, "sysfs logical_block_size")
        got = A.probe_dio_alignment(fd, statx=none, sysfs_root=str(tmp_path / "nosys"))
        assert got.source == "fstatvfs f_bsize" and got.mem == got.offset == os.fstatvfs(fd).f_bsize
        bogus = A.probe_dio_alignment(fd, statx=lambda fd: (3, 512), sysfs_root=str(tmp_path / "nosys"))
        assert bogus.source == "fstatvfs f_bsize"  # not a power of two: not believed
    finally:
        os.close(fd)


def test_a_reader_plans_with_what_its_file_reports_and_buffered_needs_none(tmp_path, monkeypatch):
    path = tmp_path / "s.slab"
    path.write_bytes(bytes(3 * 4096))
    monkeypatch.setattr("sglang_glm_ext.l3.disk.slab_reader.probe_dio_alignment",
                        lambda fd: A.DioAlignment(2048, 1024, "injected"))
    with SlabReader(path, 4096) as rd:
        assert rd.align == (A.DioAlignment(2048, 1024, "injected") if rd.direct else A.BUFFERED)
    with SlabReader(path, 4096, direct=False) as rd:
        assert rd.align == A.BUFFERED
    monkeypatch.setattr("sglang_glm_ext.l3.disk.slab_reader.probe_dio_alignment",
                        lambda fd: A.DioAlignment(512, 8192, "a 8 KiB-sector device"))
    with SlabReader(path, 4096) as rd:  # does not fit the 4 KiB slot grid: 4 KiB plans
        if rd.direct:
            assert (rd.align.mem, rd.align.offset) == (4096, 4096) and "slot grid" in rd.align.source
