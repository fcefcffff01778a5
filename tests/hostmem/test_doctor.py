"""Host memory's doctor part: the node's hugepages, read from /proc."""

from sglang_glm_ext.declare import DoctorInput
from sglang_glm_ext.hostmem import doctor


def test_hugepages_reports_counts_size_and_hugetlbfs_mounts():
    info = doctor.hugepages()
    assert set(info) == {"total", "free", "size_kb", "mounts"}
    assert 0 <= info["free"] <= info["total"] and info["size_kb"] >= 0 and isinstance(info["mounts"], list)


def test_hugepages_parses_meminfo_and_mounts(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 1 kB\nHugePages_Total:      64\nHugePages_Free:       10\nHugepagesize:    2048 kB\n")
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\nnone /dev/hugepages hugetlbfs rw 0 0\n")
    got = doctor.hugepages(str(meminfo), str(mounts))
    assert got == {"total": 64, "free": 10, "size_kb": 2048, "mounts": ["/dev/hugepages"]}


def test_unreadable_proc_files_report_zeros():
    assert doctor.hugepages("/nonexistent/meminfo", "/nonexistent/mounts") == {
        "total": 0, "free": 0, "size_kb": 0, "mounts": []}


def test_report_is_the_hugepages_fragment():
    assert doctor.report(DoctorInput({}, (), {})).hardware == {"hugepages": doctor.hugepages()}
