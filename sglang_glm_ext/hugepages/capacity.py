"""Hugepage capacity for host KV pools: pure reading and arithmetic over a sysfs/procfs root. No SGLang, no torch.

Every reader takes `root` (normally "/") so tests point it at a fake tree. Nothing here raises on what a kernel,
a container or a user can put in those files: a missing or non-numeric file becomes `None` ("unknown") plus a
line in `problems`, and a check over an unknown figure reports that it could not decide instead of refusing.

What the kernel lets one process map (mm/hugetlb.c, `hugetlb_acct_memory` at mmap time for MAP_SHARED mappings):
  1. the size's pool-wide `free_hugepages - resv_hugepages` (reserved pages are promised to mappings that have
     not faulted them in yet; `resv_hugepages` exists only pool-wide, not per node), and
  2. when the process is restricted to some NUMA nodes (an MPOL_BIND memory policy, as `numactl --membind`
     gives SGLang's scheduler processes, or a cpuset), the sum of `free_hugepages` of those nodes
     (`allowed_mems_nr`), and
  3. a hugetlb cgroup limit (`hugetlb.<size>.max` on cgroup v2, `.limit_in_bytes` on v1) minus its usage;
     the kernel charges it at fault time, so a shortfall there is a SIGBUS later, not an mmap error.
The usable figure is the smallest of these. Surplus pages (`nr_overcommit_hugepages`) are not counted: they are
carved out of ordinary RAM at mmap time and may not be there, which is what a reserved node is meant to avoid.

A size's names and the hugepage errors live in ``sizes.py``, a shortfall's report (the message and the reserve
commands) in ``shortfall.py``; this module re-exports both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# Every caller reads the hugepage names through this module (``capacity as hp``): the sizes, their names and errors
# (sizes.py) and the shortfall report (shortfall.py) are re-exported here.
from .shortfall import Shortfall, reserve_commands, shortfall_message
from .sizes import (CGROUP_MOUNT, GIB, KIB, MIB, SGLANG_SIZES, SYS_NODES, SYS_POOLS, HugepageAllocError,
                    HugepageCapacityError, HugepageConfigError, HugepageError, cgroup_size_name, cmdline_size, gib,
                    pages_for, parse_size, pool_dir_name, size_label)

# A cgroup v1 limit this large is the kernel's "no limit" (PAGE_COUNTER_MAX * PAGE_SIZE, about 2**63).
_CGROUP_UNLIMITED = 1 << 62


# ---- reading ----

def _read_int(path: str, problems: list[str]) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except FileNotFoundError:
        problems.append(f"{path}: missing")
        return None
    except OSError as exc:
        problems.append(f"{path}: unreadable ({exc.strerror or exc})")
        return None
    try:
        return int(text)
    except ValueError:
        problems.append(f"{path}: not a number ({text[:40]!r})")
        return None


def _join(root: str, *parts: str) -> str:
    return os.path.join(root, *parts)


@dataclass(frozen=True)
class NodePool:
    node: int
    total: int | None
    free: int | None
    surplus: int | None


@dataclass(frozen=True)
class SizePool:
    """One hugepage size, pool-wide and per NUMA node, in pages. None = unknown (see `problems`)."""

    page_bytes: int
    total: int | None
    free: int | None
    resv: int | None
    surplus: int | None
    overcommit: int | None
    nodes: tuple[NodePool, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def usable(self) -> int | None:
        """free - reserved: what a new mapping may take pool-wide."""
        if self.free is None or self.resv is None:
            return None
        return max(self.free - self.resv, 0)

    @property
    def persistent(self) -> int | None:
        if self.total is None:
            return None
        return max(self.total - (self.surplus or 0), 0)

    def node(self, n: int) -> NodePool | None:
        return next((p for p in self.nodes if p.node == n), None)


def list_sizes(root: str = "/") -> tuple[int, ...]:
    """Page sizes this kernel has a pool for (one directory each under /sys/kernel/mm/hugepages)."""
    try:
        names = os.listdir(_join(root, SYS_POOLS))
    except OSError:
        return ()
    out = []
    for name in names:
        if name.startswith("hugepages-") and name.endswith("kB"):
            try:
                out.append(int(name[len("hugepages-"):-2]) * KIB)
            except ValueError:
                continue
    return tuple(sorted(out))


def list_nodes(root: str = "/") -> tuple[int, ...]:
    try:
        names = os.listdir(_join(root, SYS_NODES))
    except OSError:
        return ()
    return tuple(sorted(int(n[4:]) for n in names if n.startswith("node") and n[4:].isdigit()))


def read_size_pool(root: str, page_bytes: int) -> SizePool | None:
    """The pool of one page size, or None when this kernel has no pool of that size at all."""
    base = _join(root, SYS_POOLS, pool_dir_name(page_bytes))
    if not os.path.isdir(base):
        return None
    problems: list[str] = []
    values = {k: _read_int(os.path.join(base, f"{k}_hugepages"), problems)
              for k in ("nr", "free", "resv", "surplus", "nr_overcommit")}
    nodes = []
    for n in list_nodes(root):
        nbase = _join(root, SYS_NODES, f"node{n}", "hugepages", pool_dir_name(page_bytes))
        if not os.path.isdir(nbase):
            continue
        nodes.append(NodePool(n, _read_int(os.path.join(nbase, "nr_hugepages"), problems),
                              _read_int(os.path.join(nbase, "free_hugepages"), problems),
                              _read_int(os.path.join(nbase, "surplus_hugepages"), problems)))
    return SizePool(page_bytes, values["nr"], values["free"], values["resv"], values["surplus"],
                    values["nr_overcommit"], tuple(nodes), tuple(problems))


def default_page_bytes(root: str = "/") -> int | None:
    """The default hugepage size (`Hugepagesize` in /proc/meminfo): the one `vm.nr_hugepages` sizes."""
    try:
        with open(_join(root, "proc", "meminfo")) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key == "Hugepagesize":
                    parts = rest.split()
                    return int(parts[0]) * KIB if parts and parts[0].isdigit() else None
    except OSError:
        return None
    return None


def meminfo_hugepages(root: str = "/") -> dict:
    """/proc/meminfo's default-size summary (doctor's original keys): total, free, size_kb; 0 where unreadable."""
    info = {"total": 0, "free": 0, "size_kb": 0}
    keys = {"HugePages_Total": "total", "HugePages_Free": "free", "Hugepagesize": "size_kb"}
    try:
        with open(_join(root, "proc", "meminfo")) as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if key in keys and parts and parts[0].isdigit():
                    info[keys[key]] = int(parts[0])
    except OSError:
        pass
    return info


def hugetlbfs_mounts(root: str = "/") -> list[str]:
    try:
        with open(_join(root, "proc", "mounts")) as f:
            return [parts[1] for parts in (ln.split() for ln in f) if len(parts) > 2 and parts[2] == "hugetlbfs"]
    except OSError:
        return []


# ---- where this process may take pages from ----

def parse_nodelist(text: str) -> frozenset[int] | None:
    """'0-3,8' -> {0,1,2,3,8}; None when it is not a node list."""
    nodes: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            return None
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a or b - a > 4096:
            return None
        nodes.update(range(a, b + 1))
    return frozenset(nodes) if nodes else None


@dataclass(frozen=True)
class MemPolicy:
    """This process's NUMA placement as the kernel applies it to hugepage allocation."""

    mode: str  # default | bind | prefer | interleave | local | ... | unknown
    policy_nodes: frozenset[int] | None  # the nodes named by the policy (bind:0 -> {0})
    allowed: frozenset[int] | None  # the cpuset's Mems_allowed_list
    all_nodes: frozenset[int] | None  # nodes with a hugepage pool directory

    @property
    def strict_nodes(self) -> frozenset[int] | None:
        """Nodes the kernel restricts this process's hugepages to; None when no restriction narrows the system.

        Only MPOL_BIND restricts (a preferred or interleave policy falls back to other nodes); a cpuset
        restricts too. Both intersect.
        """
        nodes = self.allowed
        if self.mode == "bind" and self.policy_nodes is not None:
            nodes = self.policy_nodes if nodes is None else nodes & self.policy_nodes
        if nodes is None:
            return None
        if self.all_nodes is not None and self.all_nodes <= nodes:
            return None  # allowed everywhere: nothing narrower than the pool-wide figure
        return frozenset(nodes)

    def describe(self) -> str:
        strict = self.strict_nodes
        if strict is None:
            return f"NUMA policy {self.mode}, not restricted to a node"
        return f"NUMA policy {self.mode}, restricted to node(s) {_nodes_str(strict)}"


def read_policy(root: str = "/") -> MemPolicy:
    mode, policy_nodes = "unknown", None
    try:
        with open(_join(root, "proc", "self", "numa_maps")) as f:
            first = f.readline().split()
        # "<addr> <policy> ...": the policy of the first mapping, which is the task policy unless mbind() set one.
        if len(first) >= 2:
            word = first[1]
            name, _, nodes = word.partition(":")
            mode = name.split("=")[0].replace("(many)", "").replace("(balancing)", "").strip() or "unknown"
            policy_nodes = parse_nodelist(nodes) if nodes else None
    except OSError:
        pass
    allowed = None
    try:
        with open(_join(root, "proc", "self", "status")) as f:
            for line in f:
                if line.startswith("Mems_allowed_list:"):
                    allowed = parse_nodelist(line.split(":", 1)[1])
    except OSError:
        pass
    nodes = list_nodes(root)
    return MemPolicy(mode, policy_nodes, allowed, frozenset(nodes) if nodes else None)


# ---- hugetlb cgroup ----

@dataclass(frozen=True)
class CgroupLimit:
    path: str  # the limit file that bounds us most
    limit_bytes: int
    usage_bytes: int

    @property
    def remaining_bytes(self) -> int:
        return max(self.limit_bytes - self.usage_bytes, 0)


def read_cgroup_limit(root: str, page_bytes: int) -> tuple[CgroupLimit | None, list[str]]:
    """The tightest hugetlb cgroup limit on this process for one page size (None: no limit found)."""
    problems: list[str] = []
    try:
        with open(_join(root, "proc", "self", "cgroup")) as f:
            lines = f.read().splitlines()
    except OSError:
        return None, problems
    name = cgroup_size_name(page_bytes)
    candidates = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # cgroup v2
            mount = _join(root, CGROUP_MOUNT)
            files = (f"hugetlb.{name}.max", f"hugetlb.{name}.current")
        elif "hugetlb" in controllers.split(","):
            mount = _join(root, CGROUP_MOUNT, "hugetlb")
            files = (f"hugetlb.{name}.limit_in_bytes", f"hugetlb.{name}.usage_in_bytes")
        else:
            continue
        candidates.extend(_walk_cgroup(mount, path, files, problems))
    if not candidates:
        return None, problems
    return min(candidates, key=lambda c: c.remaining_bytes), problems


def _walk_cgroup(mount: str, path: str, files: tuple[str, str], problems: list[str]) -> list[CgroupLimit]:
    mount = os.path.normpath(mount)
    rel = path.strip().lstrip("/")
    directory = os.path.normpath(os.path.join(mount, rel)) if rel else mount
    if not directory.startswith(mount) or not os.path.isdir(directory):
        # A container without its own cgroup namespace sees the host path; its mount is its own cgroup.
        directory = mount
    out = []
    while True:
        limit_path = os.path.join(directory, files[0])
        if os.path.exists(limit_path):
            try:
                with open(limit_path) as f:
                    text = f.read().strip()
            except OSError as exc:
                problems.append(f"{limit_path}: unreadable ({exc.strerror or exc})")
                text = "max"
            if text != "max":
                if not text.isdigit():
                    problems.append(f"{limit_path}: not a number ({text[:40]!r})")
                elif int(text) < _CGROUP_UNLIMITED:
                    usage = _read_int(os.path.join(directory, files[1]), problems)
                    if usage is not None:
                        out.append(CgroupLimit(limit_path, int(text), usage))
        if directory == mount or len(directory) <= len(mount):
            break
        directory = os.path.dirname(directory)
    return out


# ---- capacity and checks ----

@dataclass(frozen=True)
class Capacity:
    """What a mapping of one page size may take now in this process, with where each bound comes from."""

    page_bytes: int
    pool: SizePool | None
    policy: MemPolicy
    cgroup: CgroupLimit | None
    usable_pages: int | None  # None: could not be decided (see `unknown`)
    limited_by: str  # the bound that gives usable_pages, in words
    limit_kind: str  # pool | numa | cgroup | missing | unknown
    unknown: tuple[str, ...] = ()

    @property
    def usable_bytes(self) -> int | None:
        return None if self.usable_pages is None else self.usable_pages * self.page_bytes


def capacity(root: str, page_bytes: int, *, policy: MemPolicy | None = None) -> Capacity:
    """Read the pool, this process's NUMA restriction and hugetlb cgroup limit; the smallest bound wins."""
    pool = read_size_pool(root, page_bytes)
    policy = read_policy(root) if policy is None else policy
    cgroup, cg_problems = read_cgroup_limit(root, page_bytes)
    return capacity_of(pool, policy, cgroup, page_bytes, extra_unknown=tuple(cg_problems))


def capacity_of(pool: SizePool | None, policy: MemPolicy, cgroup: CgroupLimit | None, page_bytes: int,
                *, extra_unknown: tuple[str, ...] = ()) -> Capacity:
    if pool is None:
        return Capacity(page_bytes, None, policy, cgroup, 0, f"this kernel has no {size_label(page_bytes)} "
                        f"hugepage pool (/{SYS_POOLS}/{pool_dir_name(page_bytes)} is missing)", "missing",
                        extra_unknown)
    unknown = list(pool.problems) + list(extra_unknown)
    if pool.usable is None:  # the pool-wide figure is the one bound that always applies
        return Capacity(page_bytes, pool, policy, cgroup, None, "unknown", "unknown", tuple(unknown))
    bounds = [(pool.usable, "pool", f"the {size_label(page_bytes)} pool: {pool.free} free - {pool.resv} reserved")]
    strict = policy.strict_nodes
    if strict is not None:
        nodes = [pool.node(n) for n in sorted(strict)]
        if all(p is not None and p.free is not None for p in nodes):
            free = sum(p.free for p in nodes)
            bounds.append((free, "numa", f"NUMA node(s) {_nodes_str(strict)} this process is bound to "
                           f"({policy.mode} policy): {free} free there"))
        else:
            unknown.append(f"free pages of NUMA node(s) {_nodes_str(strict)} unknown")
    if cgroup is not None:
        bounds.append((cgroup.remaining_bytes // page_bytes, "cgroup",
                       f"the hugetlb cgroup limit {gib(cgroup.limit_bytes)}, {gib(cgroup.usage_bytes)} used "
                       f"({cgroup.path})"))
    usable, kind, why = min(bounds, key=lambda b: b[0])
    return Capacity(page_bytes, pool, policy, cgroup, usable, why, kind, tuple(unknown))


def check(need_bytes: int, cap: Capacity, *, ranks: int = 1, per_rank_pages: int | None = None,
          baseline: str = "now") -> Shortfall | None:
    """A Shortfall when `ranks` x the need does not fit `cap`; None when it fits or cannot be decided.

    `per_rank_pages` lets a caller that knows each rank's page count (rounding included) pass it; otherwise the
    need is `need_bytes` rounded up to whole pages per rank.
    """
    pages = per_rank_pages if per_rank_pages is not None else pages_for(need_bytes, cap.page_bytes)
    total_pages = pages * max(ranks, 1)
    if cap.usable_pages is None or total_pages <= cap.usable_pages:
        return None
    return Shortfall(need_bytes * max(ranks, 1), total_pages, cap, max(ranks, 1), baseline)


def _nodes_str(nodes) -> str:
    return ",".join(str(n) for n in sorted(nodes))


@dataclass(frozen=True)
class LaunchPlan:
    """What the launcher saw before any rank of this launch mapped a page; travels to every scheduler process.

    `usable_pages` is the node's usable figure for the selected size at launch (pool-wide and cgroup bounds;
    the launcher itself is not NUMA-bound). `symmetric` is True when every rank on the node builds the same
    host pools (no pipeline stages), which is what makes `ranks x my need` the node total.
    """

    page_bytes: int
    ranks_on_node: int
    usable_pages: int | None
    symmetric: bool

    def to_dict(self) -> dict:
        return {"page_bytes": self.page_bytes, "ranks_on_node": self.ranks_on_node,
                "usable_pages": self.usable_pages, "symmetric": self.symmetric}

    @classmethod
    def from_dict(cls, d) -> "LaunchPlan | None":
        try:
            return cls(int(d["page_bytes"]), max(int(d["ranks_on_node"]), 1),
                       None if d.get("usable_pages") is None else int(d["usable_pages"]), bool(d.get("symmetric")))
        except (KeyError, TypeError, ValueError):
            return None


def ranks_on_node(tp_size: int, pp_size: int, dp_size: int, nnodes: int) -> int:
    """Scheduler processes per node, assuming uniform placement as SGLang does.

    0.5.23 runs `dp_size` replicas of `tp_size x pp_size` ranks (attention DP lives inside tp_size), spread over
    `nnodes`; every one of them builds its own host pools.
    """
    world = max(tp_size, 1) * max(pp_size, 1) * max(dp_size, 1)
    return max(world // max(nnodes, 1), 1)


def launch_need_pages(hicache_size_gb: float, page_bytes: int) -> int:
    """Pages one rank's host KV pool takes at least under --hicache-size (GB = 1e9 bytes, as SGLang sizes it).

    SGLang sizes the pool to floor(size*1e9 / bytes_per_token) tokens plus a padding page, so it is never
    smaller than size*1e9 bytes; extra pools (a DSA indexer, MTP draft layers) only add to it.
    """
    return pages_for(int(hicache_size_gb * 1e9), page_bytes)


def per_rank_budget(usable_pages: int, page_bytes: int, ranks: int) -> tuple[int, int]:
    """(bytes, whole GB for --hicache-size) one of `ranks` equal ranks may take so all of them fit.

    Whole pages per rank first: each rank's mapping rounds up to a page, so the GB figure is rounded down
    through the page count (a GB figure from the byte share could need one page more per rank).
    """
    per_rank = (max(usable_pages, 0) // max(ranks, 1)) * page_bytes
    return per_rank, int(per_rank // 10**9)


def free_by_size(root: str) -> dict[int, int]:
    """Usable pages of every size this kernel has, for the 'wrong size?' hint."""
    out = {}
    for s in list_sizes(root):
        p = read_size_pool(root, s)
        if p is not None and p.usable:
            out[s] = p.usable
    return out

