"""sglang_glm_ext/hugepages/capacity.py on a fake sysfs (seed 322-338): what fits, what does not, and the message.

Covers enough / not enough / reserved pages / wrong size / per-NUMA shortfall / hugetlb cgroup limits, the exact
reserve commands, and that odd or missing files give "unknown", never an exception.
"""

from __future__ import annotations

import itertools

import pytest

from sglang_glm_ext.hugepages import capacity as hp

GIB, MIB = hp.GIB, hp.MIB
MB2, GB1 = 2048, 1048576  # sysfs size names, kB


def _msg(sf, **kw):
    kw.setdefault("what", "a host pool")
    kw.setdefault("default_page_bytes", 2 * MIB)
    kw.setdefault("lower_hint", "lower --hicache-size / --hicache-ratio")
    return hp.shortfall_message(sf, **kw)


@pytest.mark.parametrize("raw,expected", [
    (None, None), ("", None), ("  ", None), ("2MB", 2 * MIB), ("2mb", 2 * MIB), (" 1GB ", GIB), ("1gb", GIB),
])
def test_parse_size_accepts_exactly_sglangs_spellings(raw, expected):
    assert hp.parse_size(raw) == expected


@pytest.mark.parametrize("raw", ["2M", "1G", "2048kB", "4MB", "huge", "2 MB", "1GiB", "0"])
def test_parse_size_refuses_what_sglang_would_silently_ignore(raw):
    with pytest.raises(hp.HugepageConfigError, match=r"2MB or 1GB") as exc:
        hp.parse_size(raw)
    assert repr(raw) in str(exc.value) and "ordinary pages" in str(exc.value)


def test_enough_free_pages_fit(fake_sysfs):
    fs = fake_sysfs().pool(MB2, free=1024)
    cap = hp.capacity(fs.root, 2 * MIB)
    assert cap.usable_pages == 1024 and cap.limit_kind == "pool"
    assert hp.check(2 * GIB, cap) is None  # exactly 1024 pages


def test_not_enough_gives_need_free_and_the_exact_commands(fake_sysfs):
    fs = fake_sysfs().pool(MB2, free=100, total=300)  # 200 in use elsewhere
    cap = hp.capacity(fs.root, 2 * MIB)
    sf = hp.check(GIB + 1, cap)  # one byte over 1 GiB: 513 pages
    assert sf is not None and sf.need_pages == 513 and sf.missing_pages == 413
    msg = _msg(sf)
    for needle in ("1.0 GiB as 513 pages of 2 MB", "only 100 pages (200.0 MiB)", "100 free - 0 reserved",
                   "sysctl -w vm.nr_hugepages=713",  # the persistent pool (300) plus what is missing (413)
                   "echo 713 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
                   "hugepagesz=2M hugepages=713", "--hicache-size", "--hicache-ratio"):
        assert needle in msg, f"{needle!r} missing from:\n{msg}"


def test_reserved_pages_are_not_free(fake_sysfs):
    fs = fake_sysfs().pool(MB2, free=600, resv=200)
    cap = hp.capacity(fs.root, 2 * MIB)
    assert cap.usable_pages == 400
    sf = hp.check(GIB, cap)  # 512 pages > 400
    assert sf is not None and "600 free - 200 reserved" in _msg(sf)
    assert hp.check(400 * 2 * MIB, cap) is None


def test_wrong_size_names_the_pages_that_are_reserved(fake_sysfs):
    fs = fake_sysfs().pool(MB2, free=4096).pool(GB1, free=0)
    cap = hp.capacity(fs.root, GIB)
    sf = hp.check(4 * GIB, cap)
    msg = _msg(sf, other_sizes=hp.free_by_size(fs.root))
    assert "4096 free 2 MB pages" in msg and "selects 1 GB" in msg
    # 1 GB is not the default size: vm.nr_hugepages would resize the 2 MB pool, so only the sysfs path is given.
    assert "sysctl" not in msg and "echo 4 > /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages" in msg
    assert "hugepagesz=1G hugepages=4" in msg and "contiguous" in msg


def test_a_size_the_kernel_has_no_pool_for(fake_sysfs):
    fs = fake_sysfs().pool(MB2, free=10)
    cap = hp.capacity(fs.root, GIB)
    assert cap.limit_kind == "missing" and cap.usable_pages == 0
    msg = _msg(hp.check(GIB, cap))
    assert "hugepages-1048576kB is missing" in msg and "hugepagesz=1G hugepages=1" in msg and "pdpe1gb" in msg


def test_per_numa_node_shortfall_when_bound(fake_sysfs):
    fs = fake_sysfs(nodes=(0, 1)).pool(MB2, free=1100, node_free={0: 1000, 1: 100}).policy("bind:1")
    cap = hp.capacity(fs.root, 2 * MIB)
    assert cap.usable_pages == 100 and cap.limit_kind == "numa"
    sf = hp.check(GIB, cap)
    msg = _msg(sf)
    assert "NUMA node(s) 1" in msg and "bind policy" in msg
    assert "echo 512 > /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages" in msg
    assert "hugepagesz=2M hugepages=1:512" in msg
    assert "vm.nr_hugepages" not in msg  # a pool-wide reservation may land on the other node


def test_cpuset_restricts_like_a_bind_policy(fake_sysfs):
    fs = fake_sysfs(nodes=(0, 1)).pool(MB2, free=1100, node_free={0: 1000, 1: 100}).policy("default", mems="1")
    assert hp.capacity(fs.root, 2 * MIB).usable_pages == 100


@pytest.mark.parametrize("policy", ["prefer:1", "default", "interleave:0-1", "local"])
def test_non_strict_policies_may_use_every_node(fake_sysfs, policy):
    fs = fake_sysfs(nodes=(0, 1)).pool(MB2, free=1100, node_free={0: 1000, 1: 100}).policy(policy)
    cap = hp.capacity(fs.root, 2 * MIB)
    assert cap.usable_pages == 1100 and cap.limit_kind == "pool"


def test_bound_to_every_node_is_the_pool_wide_figure(fake_sysfs):
    fs = fake_sysfs(nodes=(0, 1)).pool(MB2, free=1100, resv=50, node_free={0: 1000, 1: 100}).policy("bind:0-1")
    assert hp.capacity(fs.root, 2 * MIB).usable_pages == 1050


def test_node_free_does_not_beat_pool_wide_reservations(fake_sysfs):
    # Reservations exist only pool-wide; the kernel checks both bounds, so do we.
    fs = fake_sysfs(nodes=(0, 1)).pool(MB2, free=1100, resv=1000, node_free={0: 1000, 1: 100}).policy("bind:0")
    cap = hp.capacity(fs.root, 2 * MIB)
    assert cap.usable_pages == 100 and cap.limit_kind == "pool"


def test_cgroup_v2_hugetlb_limit_bounds_and_is_named(fake_sysfs):
    fs = fake_sysfs().pool(MB2, free=4096).cgroup_v2("/kubepods/pod1", "2MB", max_bytes=GIB, current=512 * MIB)
    cap = hp.capacity(fs.root, 2 * MIB)
    assert cap.usable_pages == 256 and cap.limit_kind == "cgroup"
    msg = _msg(hp.check(GIB, cap))
    assert "hugetlb.2MB.max" in msg and "hugepages-2Mi" in msg and "Raise the container's hugetlb limit" in msg


def test_cgroup_v2_parent_limit_and_max(fake_sysfs):
    fs = fake_sysfs().pool(MB2, free=4096).cgroup_v2("/a/b", "2MB", max_bytes="max")
    assert hp.capacity(fs.root, 2 * MIB).cgroup is None
    fs.write("sys/fs/cgroup/a/hugetlb.2MB.max", GIB)
    fs.write("sys/fs/cgroup/a/hugetlb.2MB.current", 0)
    cap = hp.capacity(fs.root, 2 * MIB)
    assert cap.usable_pages == 512 and cap.cgroup.path.endswith("a/hugetlb.2MB.max")


def test_cgroup_v1_limit_and_its_unlimited_value(fake_sysfs):
    fs = fake_sysfs().pool(GB1, free=64).cgroup_v1("/docker/abc", "1GB", limit=8 * GIB, usage=2 * GIB)
    assert hp.capacity(fs.root, GIB).usable_pages == 6
    fs.write("sys/fs/cgroup/hugetlb/docker/abc/hugetlb.1GB.limit_in_bytes", 9223372036854771712)
    assert hp.capacity(fs.root, GIB).usable_pages == 64


def test_odd_or_missing_files_are_unknown_never_an_exception(fake_sysfs):
    fs = fake_sysfs(nodes=(0, 1)).pool(MB2, free=100, node_free={0: 50, 1: 50}).policy("bind:1")
    fs.cgroup_v2("/x", "2MB", max_bytes=GIB)
    files = ["sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages",
             "sys/kernel/mm/hugepages/hugepages-2048kB/resv_hugepages",
             "sys/devices/system/node/node1/hugepages/hugepages-2048kB/free_hugepages",
             "proc/self/numa_maps", "proc/self/status", "proc/self/cgroup", "sys/fs/cgroup/x/hugetlb.2MB.max",
             "sys/fs/cgroup/x/hugetlb.2MB.current", "proc/meminfo"]
    odd = ["", "abc", "-5", "1e3", "\x00\xff", "9" * 40, "12 34", "bind:", ":::", "0::/../../..\n"]
    seen_unknown = False
    for rel, text in itertools.product(files, odd):
        keep = fs.read(rel)
        fs.write(rel, text)
        cap = hp.capacity(fs.root, 2 * MIB)  # must not raise
        sf = hp.check(GIB, cap)
        if cap.usable_pages is None:
            seen_unknown = True
            assert sf is None and cap.unknown, "an unknown figure must be reported, not refused"
        if sf is not None:
            _msg(sf, other_sizes=hp.free_by_size(fs.root))  # the message builds from any readable state
        hp.default_page_bytes(fs.root)
        hp.meminfo_hugepages(fs.root)
        fs.write(rel, keep)
    assert seen_unknown


def test_a_file_that_is_a_directory_or_vanished_is_unknown(fake_sysfs, tmp_path):
    import os
    import shutil

    fs = fake_sysfs().pool(MB2, free=100)
    p = fs.path("sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
    os.remove(p)
    cap = hp.capacity(fs.root, 2 * MIB)
    assert cap.usable_pages is None and any("free_hugepages: missing" in u for u in cap.unknown)
    os.makedirs(p)
    assert hp.capacity(fs.root, 2 * MIB).usable_pages is None
    shutil.rmtree(fs.path("sys"))
    assert hp.capacity(fs.root, 2 * MIB).limit_kind == "missing" and hp.list_sizes(fs.root) == ()
    assert hp.capacity(str(tmp_path / "nothing-here"), GIB).usable_pages == 0


@pytest.mark.parametrize("text,nodes", [("0", {0}), ("0-3,8", {0, 1, 2, 3, 8}), ("1,3-4", {1, 3, 4}),
                                        ("", None), ("a-b", None), ("3-1", None), ("0-99999", None)])
def test_parse_nodelist(text, nodes):
    assert hp.parse_nodelist(text) == (frozenset(nodes) if nodes is not None else None)


def test_several_ranks_need_their_sum(fake_sysfs):
    fs = fake_sysfs().pool(GB1, free=800)
    cap = hp.capacity(fs.root, GIB)
    per_rank = hp.launch_need_pages(100, GIB)  # 100 GB = 93.1 GiB -> 94 pages
    assert per_rank == 94
    assert hp.check(int(100e9), cap, ranks=8, per_rank_pages=per_rank) is None  # 752 <= 800
    sf = hp.check(int(100e9), cap, ranks=9, per_rank_pages=per_rank)
    assert sf.need_pages == 846 and "the 9 ranks on this node together need 846.0 GiB as 846 pages of 1 GB" in _msg(sf)


@pytest.mark.parametrize("tp,pp,dp,nnodes,expected", [(8, 1, 1, 1, 8), (16, 1, 1, 2, 8), (4, 2, 1, 1, 8),
                                                       (2, 1, 4, 1, 8), (8, 4, 1, 4, 8), (1, 1, 1, 1, 1)])
def test_ranks_on_node(tp, pp, dp, nnodes, expected):
    assert hp.ranks_on_node(tp, pp, dp, nnodes) == expected


@pytest.mark.parametrize("usable,ranks", [(800, 9), (750, 8), (1024, 3), (5, 7), (100000, 64), (7, 1)])
def test_suggested_hicache_size_really_fits(usable, ranks):
    per_rank, gb = hp.per_rank_budget(usable, GIB, ranks)
    assert ranks * hp.launch_need_pages(gb, GIB) <= usable  # the GB figure doctor and the errors suggest fits
    assert (gb + 1) * 1e9 > per_rank  # and it is the largest whole GB within each rank's whole pages


def test_launch_plan_travels_as_a_plain_dict_and_rejects_garbage():
    plan = hp.LaunchPlan(GIB, 8, 800, True)
    assert hp.LaunchPlan.from_dict(plan.to_dict()) == plan
    for junk in ({}, {"page_bytes": "x"}, {"page_bytes": 1, "ranks_on_node": None}, None):
        assert hp.LaunchPlan.from_dict(junk or {}) is None


def test_size_names():
    assert [hp.size_label(s) for s in (64 * 1024, 2 * MIB, 32 * MIB, GIB, 16 * GIB)] == [
        "64 kB", "2 MB", "32 MB", "1 GB", "16 GB"]
    assert [hp.cmdline_size(s) for s in (64 * 1024, 2 * MIB, GIB)] == ["64K", "2M", "1G"]
    assert [hp.cgroup_size_name(s) for s in (64 * 1024, 2 * MIB, GIB)] == ["64KB", "2MB", "1GB"]
    assert hp.pool_dir_name(GIB) == "hugepages-1048576kB" and hp.pages_for(GIB + 1, GIB) == 2
