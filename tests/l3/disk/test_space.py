"""disk/space.py: where a configured L3 path lives, whether it takes O_DIRECT writes, and whether the config's budget
fits (``budget_fit``: what the slabs will preallocate, minus what this deployment's slabs already hold, against the
free space of each file system, disks on one file system added up).

Free space on this shared disk moves while the tests run (other processes write): an expected value that depends on
it is read from the row itself (``free_bytes``) or bracketed by two independent reads, and a budget that must (not)
fit is chosen a wide margin away from it.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import shutil

import pytest

import l3kit
from sglang_glm_ext.l3.disk.slab import DiskSlab
from sglang_glm_ext.l3.disk.space import budget_fit, free_bytes, nearest_dir, o_direct_works, slab_bytes_held

SLOT = 4096
SLACK = 256 * 2**20  # what other writers on the shared disk may change between two reads of its free space
PROBE_PREFIX = ".glm_ext_odirect_"


def _cfg(tmp_path, disks, **over):
    """An L3Config over ``disks``: [(path, budget), ...]."""
    d = l3kit.config_dict(tmp_path, budget=1, disks=[{"path": str(p), "budget": b} for p, b in disks], **over)
    from sglang_glm_ext.l3.config import L3Config

    return L3Config.from_dict(d)


def _independent_o_direct(directory) -> "int | None":
    """0 when an aligned O_DIRECT write works in ``directory``, else the errno that refused it (the test's own
    probe, to compare against)."""
    path = os.path.join(directory, "own-odirect-probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)
    try:
        try:
            dfd = os.open(path, os.O_WRONLY | os.O_DIRECT)
        except OSError as e:
            return e.errno
        try:
            os.pwrite(dfd, mmap.mmap(-1, 4096), 0)
            return 0
        except OSError as e:
            return e.errno
        finally:
            os.close(dfd)
    finally:
        os.unlink(path)


def _probe_files(directory):
    return sorted(n for n in os.listdir(directory) if n.startswith(PROBE_PREFIX))


def _bytes_of(text: str) -> float:
    """'12.3 GiB' -> bytes (the message's own rounding: 0.05 of a unit)."""
    value, unit = text.split()
    return float(value) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}[unit]


def _cap_in(problem: str) -> float:
    m = re.search(r"at most (\d+(?:\.\d)? (?:B|KiB|MiB|GiB|TiB))", problem)
    assert m, problem
    return _bytes_of(m.group(1))


def _close_to(got: float, want: float) -> bool:
    unit = next(u for u in (2**40, 2**30, 2**20, 2**10, 1) if want >= u) if want >= 1 else 1
    return abs(got - want) <= 0.051 * unit


# ------------------------------------------------------------------------------------------------ nearest_dir
def test_nearest_dir_of_an_existing_directory_is_itself_made_absolute(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    assert nearest_dir(str(tmp_path / "a")) == str(tmp_path / "a")
    monkeypatch.chdir(tmp_path)
    assert nearest_dir("a") == str(tmp_path / "a")  # relative to the cwd, returned absolute


def test_nearest_dir_of_a_path_not_created_yet_is_its_closest_existing_ancestor(tmp_path):
    (tmp_path / "a").mkdir()
    assert nearest_dir(str(tmp_path / "a" / "b" / "c" / "d")) == str(tmp_path / "a")
    assert not (tmp_path / "a" / "b").exists()  # looking creates nothing


def test_nearest_dir_of_a_regular_file_is_the_directory_holding_it(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    assert nearest_dir(str(tmp_path / "f")) == str(tmp_path)
    assert nearest_dir(str(tmp_path / "f" / "below")) == str(tmp_path)


# ------------------------------------------------------------------------------------------------ free_bytes
def test_free_bytes_is_what_an_unprivileged_writer_may_still_allocate(tmp_path):
    """f_bavail (not f_bfree: the root reserve is not L3's), as shutil.disk_usage reports it; a path not created yet
    reads its ancestor's file system."""
    before = shutil.disk_usage(tmp_path).free
    got = free_bytes(str(tmp_path))
    missing = free_bytes(str(tmp_path / "not" / "yet"))
    after = shutil.disk_usage(tmp_path).free
    lo, hi = min(before, after) - SLACK, max(before, after) + SLACK
    assert lo <= got <= hi and lo <= missing <= hi
    st = os.statvfs(tmp_path)
    if st.f_bfree - st.f_bavail > 2 * SLACK // st.f_frsize:  # a root reserve large enough to tell them apart
        assert got < st.f_bfree * st.f_frsize - SLACK


# ------------------------------------------------------------------------------------------------ o_direct_works
def test_o_direct_works_agrees_with_an_independent_probe_and_leaves_no_file(tmp_path):
    want = _independent_o_direct(tmp_path)
    ok, why = o_direct_works(str(tmp_path))
    if want == 0:
        assert (ok, why) == (True, "")
    elif want == errno.EINVAL:
        assert ok is False and "EINVAL" in why and "fallback" in why
    else:
        assert ok is not True
    assert _probe_files(tmp_path) == []


def test_o_direct_on_tmpfs_matches_what_the_kernel_allows(tmp_path):
    """tmpfs refused O_DIRECT before Linux 6.6 and accepts it since: the answer must be the kernel's, either way."""
    shm = "/dev/shm"
    if not os.path.isdir(shm) or os.stat(shm).st_dev == os.stat(tmp_path).st_dev or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm on a file system of its own")
    before = _probe_files(shm)
    want = _independent_o_direct(shm)
    ok, why = o_direct_works(shm)
    if want == 0:
        assert (ok, why) == (True, "")
    elif want == errno.EINVAL:
        assert ok is False and "EINVAL" in why
    assert _probe_files(shm) == before


def test_o_direct_in_a_directory_that_does_not_exist_cannot_be_tried(tmp_path):
    ok, why = o_direct_works(str(tmp_path / "missing"))
    assert ok is None and why.startswith("cannot create a file")
    assert not (tmp_path / "missing").exists()


# ------------------------------------------------------------------------------------------------ slab_bytes_held
def test_slab_bytes_held_counts_allocated_blocks_of_this_deployments_slabs_only(tmp_path):
    """Every rank mapped to the disk, ``*.slab`` files only (not sidecars), not another deployment's, and what a
    sparse slab really holds (its allocated blocks), not its length."""
    cfg = _cfg(tmp_path, [(tmp_path / "disk[0]", "1GiB")], ranks={"count": 3})  # brackets: globbed literally
    slabs = [DiskSlab.open(os.path.join(cfg.slab_dir(r, 0), "target_kv.slab"), slot_bytes=SLOT, num_slots=4 + r)
             for r in range(3)]
    try:
        held = sum(s.held_bytes() for s in slabs)
        assert held >= sum((4 + r) * SLOT for r in range(3))  # preallocated: at least their slots
        sparse = os.path.join(cfg.slab_dir(1, 0), "index_k.slab")
        with open(sparse, "wb") as f:
            f.truncate(64 * 2**20)  # 64 MiB long, no block allocated
        sparse_blocks = os.stat(sparse).st_blocks * 512
        with open(os.path.join(cfg.slab_dir(0, 0), "target_kv.slab.meta.json"), "w") as f:
            f.write("{}" * 4096)  # a sidecar: not a slab
        other = tmp_path / "disk[0]" / "someone-else" / "rank0"
        other.mkdir(parents=True)
        with DiskSlab.open(other / "target_kv.slab", slot_bytes=SLOT, num_slots=16):
            assert slab_bytes_held(cfg, 0) == held + sparse_blocks
        assert sparse_blocks < 64 * 2**20
    finally:
        for s in slabs:
            s.close()


def test_slab_bytes_held_is_zero_before_any_slab_exists(tmp_path):
    cfg = _cfg(tmp_path, [(tmp_path / "never-made", "1GiB")])
    assert slab_bytes_held(cfg, 0) == 0 and not (tmp_path / "never-made").exists()


def test_slab_bytes_held_sums_only_the_ranks_mapped_to_that_disk(tmp_path):
    cfg = _cfg(tmp_path, [(tmp_path / "d0", "1GiB"), (tmp_path / "d1", "1GiB")], ranks={"count": 2})
    assert cfg.ranks_on_disk(0) == [0] and cfg.ranks_on_disk(1) == [1]  # balanced: rank r on disk r % 2
    with DiskSlab.open(os.path.join(cfg.slab_dir(0, 0), "target_kv.slab"), slot_bytes=SLOT, num_slots=8) as s0:
        assert slab_bytes_held(cfg, 0) == s0.held_bytes() > 0
        assert slab_bytes_held(cfg, 1) == 0


# ------------------------------------------------------------------------------------------------ budget_fit
def test_a_budget_that_fits_reports_what_its_ranks_preallocate_rounded_down_per_rank(tmp_path):
    budget = 10 * 2**20 + 2  # split over 3 ranks: 2 bytes are nobody's
    cfg = _cfg(tmp_path, [(tmp_path / "disk" / "l3", budget)], ranks={"count": 3})
    rows = budget_fit(cfg, source="l3.toml")
    assert len(rows) == 1
    row = rows[0]
    assert row["disk"] == 0 and row["path"] == str(tmp_path / "disk" / "l3") and row["budget_bytes"] == budget
    assert row["slab_bytes"] == 3 * (budget // 3) == budget - budget % 3
    assert row["held_bytes"] == 0 and row["need_bytes"] == row["slab_bytes"]
    assert row["free_bytes"] > 0 and row["problem"] == ""
    assert not (tmp_path / "disk").exists()  # the check creates nothing


def test_what_this_deployments_slabs_already_hold_is_not_needed_again(tmp_path):
    cfg = _cfg(tmp_path, [(tmp_path / "disk", 1024 * SLOT)])
    with DiskSlab.open(os.path.join(cfg.slab_dir(0, 0), "target_kv.slab"), slot_bytes=SLOT, num_slots=64) as s:
        row, = budget_fit(cfg)
        assert row["held_bytes"] == s.held_bytes() > 0
        assert row["need_bytes"] == 1024 * SLOT - s.held_bytes()
    small = _cfg(tmp_path, [(tmp_path / "disk", SLOT)])  # the slabs already hold more than the whole budget
    row, = budget_fit(small)
    assert row["held_bytes"] > SLOT and row["need_bytes"] == 0 and row["problem"] == ""


def test_a_budget_larger_than_the_free_space_names_the_disk_the_path_and_the_largest_budget_that_fits(tmp_path):
    huge = 2**60  # 1 EiB: larger than any disk this runs on
    cfg = _cfg(tmp_path, [(tmp_path / "disk", huge)])
    with DiskSlab.open(os.path.join(cfg.slab_dir(0, 0), "target_kv.slab"), slot_bytes=SLOT, num_slots=64):
        row, = budget_fit(cfg, source="/etc/l3.toml")
    p = row["problem"]
    assert p.startswith("--cp-l3-config /etc/l3.toml: disks[0].budget ")
    assert f"does not fit on {tmp_path / 'disk'}" in p and "lower disks[0].budget to at most" in p
    assert "shared by" not in p  # one disk on its file system
    # What would fit: the free space plus what its slabs already hold (they are not preallocated twice).
    assert _close_to(_cap_in(p), row["free_bytes"] + row["held_bytes"])
    row, = budget_fit(cfg)  # no source: the message starts with the key
    assert row["problem"].startswith("disks[0].budget ")


def test_disks_on_one_file_system_compete_for_its_free_space(tmp_path):
    """Each of two disks on one file system asks for 60% of its free space: alone each fits, together they do not,
    and each row says so, naming both and the budget that would fit beside the other's."""
    free = free_bytes(str(tmp_path))
    share = int(free * 0.6)
    a, b = tmp_path / "a", tmp_path / "b"
    for alone in (a, b):
        row, = budget_fit(_cfg(tmp_path, [(alone, share)]))
        assert row["problem"] == "", row
    rows = budget_fit(_cfg(tmp_path, [(a, share), (b, share)], ranks={"count": 2}))
    for row in rows:
        assert "(shared by disks[0], disks[1])" in row["problem"], row
        assert _close_to(_cap_in(row["problem"]), row["free_bytes"] - share)  # what the other disk leaves


def test_disks_on_different_file_systems_are_not_added_up(tmp_path):
    shm = "/dev/shm"
    if not os.path.isdir(shm) or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second file system (/dev/shm) to put a disk on")
    ours = tmp_path / "a"
    theirs = os.path.join(shm, f"glm-ext-test-{os.getpid()}-not-created")
    rows = budget_fit(_cfg(tmp_path, [(ours, int(free_bytes(str(tmp_path)) * 0.6)),
                                      (theirs, int(free_bytes(shm) * 0.6))], ranks={"count": 2}))
    assert [r["problem"] for r in rows] == ["", ""], rows
    assert not os.path.exists(theirs)
