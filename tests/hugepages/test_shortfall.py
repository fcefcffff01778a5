"""sglang_glm_ext/hugepages/shortfall.py: the report of a shortfall, from a capacity built in memory (no sysfs).

test_capacity.py covers every bound and message on a fake sysfs through ``capacity``'s re-exports; here the report
module on its own: the missing pages, the reserve commands of the short bound, and the message that names both.
"""

from __future__ import annotations

from sglang_glm_ext.hugepages import capacity as hp
from sglang_glm_ext.hugepages import shortfall, sizes

MIB = sizes.MIB


def _cap(free: int, resv: int, *, nodes=(), policy=None) -> hp.Capacity:
    pool = hp.SizePool(2 * MIB, total=free + 8, free=free, resv=resv, surplus=0, overcommit=0, nodes=tuple(nodes))
    policy = policy or hp.MemPolicy("default", None, None, frozenset(n.node for n in nodes) or None)
    return hp.capacity_of(pool, policy, None, 2 * MIB)


def test_a_pool_shortfall_reserves_exactly_the_missing_pages_on_top_of_the_persistent_pool():
    sf = shortfall.Shortfall(need_bytes=300 * 2 * MIB, need_pages=300, capacity=_cap(free=250, resv=50))
    assert sf.missing_pages == 100  # usable = 250 free - 50 reserved
    cmds = shortfall.reserve_commands(sf, default_page_bytes=2 * MIB)
    assert cmds == ["sysctl -w vm.nr_hugepages=358",
                    "echo 358 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
                    "kernel command line: hugepagesz=2M hugepages=358"]
    # Not the default size: no sysctl (vm.nr_hugepages sets the default size's pool only)
    assert not any(c.startswith("sysctl") for c in shortfall.reserve_commands(sf, default_page_bytes=None))
    msg = shortfall.shortfall_message(sf, what="a host pool", default_page_bytes=2 * MIB, lower_hint="lower it")
    assert "needs 600.0 MiB as 300 pages of 2 MB, but only 200 pages" in msg and "echo 358" in msg
    assert msg.endswith("or lower it.")


def test_a_numa_shortfall_splits_the_missing_pages_over_the_bound_nodes():
    nodes = (hp.NodePool(0, total=100, free=10, surplus=0), hp.NodePool(1, total=100, free=20, surplus=0))
    policy = hp.MemPolicy("bind", frozenset({0, 1}), None, frozenset({0, 1, 2}))  # bound to two of three nodes
    cap = _cap(free=500, resv=0, nodes=nodes, policy=policy)
    assert (cap.limit_kind, cap.usable_pages) == ("numa", 30)
    sf = hp.check(50 * 2 * MIB, cap)
    assert isinstance(sf, shortfall.Shortfall) and sf.missing_pages == 20
    cmds = shortfall.reserve_commands(sf, default_page_bytes=2 * MIB)
    assert cmds == ["echo 110 > /sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages",
                    "echo 110 > /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages",
                    "kernel command line: hugepagesz=2M hugepages=0:110,1:110"]


def test_capacity_reexports_the_report_and_the_size_names_it_was_split_from():
    assert (hp.Shortfall, hp.reserve_commands, hp.shortfall_message) == (
        shortfall.Shortfall, shortfall.reserve_commands, shortfall.shortfall_message)
    assert (hp.size_label, hp.parse_size, hp.HugepageCapacityError) == (
        sizes.size_label, sizes.parse_size, sizes.HugepageCapacityError)
