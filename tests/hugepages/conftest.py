"""A fake sysfs/procfs tree for the hugepage tests: the files the kernel exposes, written by the test itself."""

from __future__ import annotations

import os

import pytest

MB2, GB1 = 2048, 1048576  # hugepage sizes in kB, as sysfs names them


class FakeSysfs:
    """Writes /sys/kernel/mm/hugepages, /sys/devices/system/node, /proc/{meminfo,self/*}, /sys/fs/cgroup under root."""

    def __init__(self, root: str, nodes=(0,), default_kb: int = MB2):
        self.root = root
        self.nodes = tuple(nodes)
        self.write("proc/meminfo", f"MemTotal: 1000 kB\nHugepagesize:    {default_kb} kB\n")
        self.write("proc/mounts", "proc /proc proc rw 0 0\n")
        for n in self.nodes:
            os.makedirs(self.path(f"sys/devices/system/node/node{n}"), exist_ok=True)
        self.policy("default", mems=",".join(map(str, self.nodes)))
        self.write("proc/self/cgroup", "0::/\n")

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def write(self, rel: str, text) -> None:
        p = self.path(rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(str(text))

    def read(self, rel: str) -> str:
        with open(self.path(rel)) as f:
            return f.read().strip()

    def pool(self, size_kb: int, *, free: int, total: int | None = None, resv: int = 0, surplus: int = 0,
             overcommit: int = 0, node_free: dict | None = None) -> "FakeSysfs":
        """One size; `node_free` {node: free} (default: everything on the first node)."""
        total = free if total is None else total
        base = f"sys/kernel/mm/hugepages/hugepages-{size_kb}kB"
        for name, v in (("nr", total), ("free", free), ("resv", resv), ("surplus", surplus),
                        ("nr_overcommit", overcommit)):
            self.write(f"{base}/{name}_hugepages", f"{v}\n")
        node_free = node_free if node_free is not None else {self.nodes[0]: free}
        for n in self.nodes:
            nb = f"sys/devices/system/node/node{n}/hugepages/hugepages-{size_kb}kB"
            nf = node_free.get(n, 0)
            used = total - free if n == self.nodes[0] else 0  # pages in use sit on the first node
            self.write(f"{nb}/nr_hugepages", f"{nf + used}\n")
            self.write(f"{nb}/free_hugepages", f"{nf}\n")
            self.write(f"{nb}/surplus_hugepages", "0\n")
        return self

    def consume(self, size_kb: int, pages: int, node: int | None = None) -> None:
        """What a rank's mmap of `pages` does to the counters (MAP_POPULATE: reserved and faulted at once)."""
        base = f"sys/kernel/mm/hugepages/hugepages-{size_kb}kB"
        self.write(f"{base}/free_hugepages", int(self.read(f"{base}/free_hugepages")) - pages)
        node = self.nodes[0] if node is None else node
        nb = f"sys/devices/system/node/node{node}/hugepages/hugepages-{size_kb}kB/free_hugepages"
        self.write(nb, int(self.read(nb)) - pages)

    def policy(self, numa_maps_policy: str, mems: str | None = None) -> "FakeSysfs":
        self.write("proc/self/numa_maps", f"55d0c0000000 {numa_maps_policy} file=/usr/bin/python3 mapped=2 N0=2\n")
        mems = mems if mems is not None else ",".join(map(str, self.nodes))
        self.write("proc/self/status", f"Name:\tpython3\nMems_allowed_list:\t{mems}\n")
        return self

    def cgroup_v2(self, path: str, size: str, max_bytes, current: int = 0) -> "FakeSysfs":
        self.write("proc/self/cgroup", f"0::{path}\n")
        d = f"sys/fs/cgroup{path}".rstrip("/")
        self.write(f"{d}/hugetlb.{size}.max", f"{max_bytes}\n")
        self.write(f"{d}/hugetlb.{size}.current", f"{current}\n")
        return self

    def cgroup_v1(self, path: str, size: str, limit: int, usage: int = 0) -> "FakeSysfs":
        self.write("proc/self/cgroup", f"5:hugetlb:{path}\n4:memory:{path}\n0::/\n")
        d = f"sys/fs/cgroup/hugetlb{path}".rstrip("/")
        self.write(f"{d}/hugetlb.{size}.limit_in_bytes", f"{limit}\n")
        self.write(f"{d}/hugetlb.{size}.usage_in_bytes", f"{usage}\n")
        return self


@pytest.fixture
def fake_sysfs(tmp_path):
    def make(**kw) -> FakeSysfs:
        return FakeSysfs(str(tmp_path / "root"), **kw)

    return make


@pytest.fixture
def tiny_pool():
    """The smallest SGLang HostKVCache (its own __init__ / _allocate_host_buffer; one buffer via ALLOC_MEMORY_FUNCS).

    init_kv_buffer allocates up to 64 MiB for real; above that it records the size the RAM check let through.
    """
    import torch

    import sglang.srt.mem_cache.pool_host.base as base
    import sglang.srt.mem_cache.pool_host.common as common

    MIB = 1024**2

    class TinyHostPool(base.HostKVCache):
        layer_num = target_layer_num = 1
        allocated = None

        def __init__(self, host_size_gb, bytes_per_token=4096):
            super().__init__(dtype=torch.uint8, device_capacity_tokens=64, size_per_token=bytes_per_token,
                             start_layer=0, end_layer=1, host_to_device_ratio=2.0, host_size=host_size_gb,
                             page_size=64, layout="layer_first", pin_memory=False, device="cpu")

        def init_kv_buffer(self):
            nbytes = self.size * self.size_per_token
            if nbytes > 64 * MIB:  # the RAM check passed; stop before allocating a pool this machine cannot hold
                TinyHostPool.allocated = nbytes
                return None
            return common.ALLOC_MEMORY_FUNCS["cpu"]((nbytes,), dtype=torch.uint8, device="cpu", pin_memory=False,
                                                    allocator=self.allocator)

        def clear(self):
            pass

        get_size_per_token = load_to_device_per_layer = backup_from_device_all_layer = lambda *a, **k: None
        get_data_page = get_dummy_flat_data_page = set_from_flat_data_page = lambda *a, **k: None

    TinyHostPool.allocated = None
    return TinyHostPool


@pytest.fixture
def hugepage_plugin(monkeypatch):
    """The plugin's hugepage patches applied to the installed SGLang; no size selected, no launch plan published."""
    from sglang.srt.plugins.hook_registry import HookSource

    from sglang_glm_ext.hugepages import hooks as hh
    from sglang_glm_ext.hugepages.feature import FEATURE as HUGEPAGES
    from sglang_glm_ext.patching.ledger import State, apply_one
    from sglang_glm_ext.plugin.registry import PATCHES

    src = HookSource(plugin_name="glm_ext", dist_name="sglang-glm-ext")
    patches = [p for p in PATCHES if p.feature is HUGEPAGES]  # what the registry hands the ledger
    assert [p.id for p in patches] == ["hugepages.launch_check", "hugepages.ram_check", "hugepages.alloc_check",
                                       "hugepages.no_fallback"]
    for patch in patches:
        status = apply_one(patch, src)
        assert status.state is State.APPLIED, status.detail
    monkeypatch.delenv("SGLANG_HUGEPAGE_SIZE", raising=False)
    monkeypatch.delenv("SGLANG_GLM_EXT_HUGEPAGE_FALLBACK", raising=False)
    monkeypatch.setattr(hh, "_server_args", lambda: None)  # no launch plan unless a test publishes one
    hh._reset_for_tests()
    yield hh
    hh._reset_for_tests()
