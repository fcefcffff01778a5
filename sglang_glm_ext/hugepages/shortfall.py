"""The report of a hugepage shortfall: what is missing, which bound is short, and the exact commands that reserve
the missing pages; the startup error and doctor's fix read it. Pure (standard library only). ``capacity.py`` (which
finds a shortfall: ``check``) re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass

from .sizes import GIB, SYS_NODES, SYS_POOLS, cmdline_size, gib, pool_dir_name, size_label


@dataclass(frozen=True)
class Shortfall:
    need_bytes: int
    need_pages: int
    capacity: "Capacity"  # capacity.Capacity, named not imported: capacity.py imports this module
    ranks: int = 1  # >1: the need is this many ranks' together
    baseline: str = "now"  # "now" or "at launch" (the free figure compared against)

    @property
    def missing_pages(self) -> int:
        return self.need_pages - (self.capacity.usable_pages or 0)


def reserve_commands(sf: Shortfall, *, default_page_bytes: int | None) -> list[str]:
    """The exact commands that reserve the missing pages, for the bound that is short."""
    cap, page = sf.capacity, sf.capacity.page_bytes
    missing = max(sf.missing_pages, 1)
    pool = cap.pool
    cmds: list[str] = []
    strict = cap.policy.strict_nodes
    if pool is not None and strict is not None and cap.limit_kind == "numa":
        share = -(-missing // len(strict))
        targets = {}
        for n in sorted(strict):
            node = pool.node(n)
            targets[n] = (max((node.total or 0) - (node.surplus or 0), 0) if node else 0) + share
            cmds.append(f"echo {targets[n]} > /{SYS_NODES}/node{n}/hugepages/{pool_dir_name(page)}/nr_hugepages")
        per_node = ",".join(f"{n}:{t}" for n, t in targets.items())
        cmds.append(f"kernel command line: hugepagesz={cmdline_size(page)} hugepages={per_node}")
        return cmds
    target = (pool.persistent or 0) + missing if pool is not None else missing
    if default_page_bytes == page:
        cmds.append(f"sysctl -w vm.nr_hugepages={target}")
    cmds.append(f"echo {target} > /{SYS_POOLS}/{pool_dir_name(page)}/nr_hugepages")
    cmds.append(f"kernel command line: hugepagesz={cmdline_size(page)} hugepages={target}")
    return cmds


def shortfall_message(sf: Shortfall, *, what: str, default_page_bytes: int | None, lower_hint: str,
                      other_sizes: dict[int, int] | None = None, fallback_env: str | None = None) -> str:
    """The startup error: need X GiB as N pages of SIZE, Y free, which bound is short, and each way out."""
    cap, page = sf.capacity, sf.capacity.page_bytes
    label = size_label(page)
    usable = cap.usable_pages or 0
    who = f"the {sf.ranks} ranks on this node together need" if sf.ranks > 1 else "this rank needs"
    free_when = "free when the launch started" if sf.baseline == "at launch" else "free"
    lines = [
        f"sglang-glm-ext: not enough {label} hugepages for {what}: {who} {gib(sf.need_pages * page)} as "
        f"{sf.need_pages} pages of {label}, but only {usable} pages ({gib(usable * page)}) are {free_when} "
        f"(limited by {cap.limited_by})."
    ]
    if cap.limit_kind == "cgroup" and cap.cgroup is not None:
        lines.append(f"Raise the container's hugetlb limit ({cap.cgroup.path}; Kubernetes: the pod's "
                     f"hugepages-{cmdline_size(page)}i limit) by at least {gib(sf.missing_pages * page)}, or:")
    elif cap.limit_kind == "missing":
        lines.append(f"Boot with `hugepagesz={cmdline_size(page)} hugepages={sf.need_pages}` on the kernel command "
                     "line" + (" (1 GB pages also need CPU support: the pdpe1gb flag on x86)" if page >= GIB else "")
                     + ", or:")
    else:
        lines.append(f"Reserve at least {sf.missing_pages} more {label} pages, e.g.:")
        lines.extend(f"  {c}" for c in reserve_commands(sf, default_page_bytes=default_page_bytes))
        if page >= GIB:
            lines.append("  (1 GB pages reserved at runtime need that much contiguous free memory; the kernel "
                         "command line is the reliable way)")
    lines.append(f"or {lower_hint}.")
    spare = {s: n for s, n in (other_sizes or {}).items() if s != page and n}
    if spare:
        have = ", ".join(f"{n} free {size_label(s)} pages" for s, n in sorted(spare.items()))
        lines.append(f"This node has {have}: SGLANG_HUGEPAGE_SIZE selects {label}; is that the size you reserved?")
    if fallback_env:
        lines.append(f"{fallback_env}=1 restores SGLang's fallback to ordinary pages (checked against RAM).")
    return "\n".join(lines)
