"""hugepages' part of `doctor`: the node's hugepages, and whether a hugepage-backed HiCache launch fits them.

`report()` gives doctor's `hardware.hugepages` (JSON schema 1): the original keys (`total`, `free`, `size_kb`,
`mounts`: /proc/meminfo's default size and the hugetlbfs mounts) plus `default_size_kb`, `sizes` (every size, per
NUMA node), `selected` (SGLANG_HUGEPAGE_SIZE as the launch will read it), `cgroup_limits`, `fit` and `unknown`.
A figure the kernel does not give (missing or odd file) is null and named in `unknown`; nothing here raises on
what sysfs contains. The launch being checked reaches it through `DoctorInput.launch` (`hicache_size`,
`ranks_per_node`: doctor's `--hicache-size` / `--ranks-per-node`; from a launch line, its own --hicache-size,
tp*pp*dp / nnodes, --enable-hierarchical-cache and --hicache-storage-backend, whose allocator may ignore hugepages).
Every problem is a `Problem` with its fix (the reserve command, the size to set).
"""

from __future__ import annotations

from typing import Any

from ..declare import DoctorInput, DoctorPart, DoctorReporter, Problem
from . import capacity as hp
from .feature import HUGEPAGE_FALLBACK


def report(inp: DoctorInput) -> DoctorPart:
    ranks = inp.launch.get("ranks_per_node")
    if ranks:
        source = inp.launch.get("ranks_source", "--ranks-per-node")
    elif inp.gpus:
        ranks, source = len(inp.gpus), "one per visible GPU"
    else:
        ranks, source = 1, "default; pass --ranks-per-node"
    # A launch line without --enable-hierarchical-cache has no host KV pool to size (SGLang reads the size then).
    hicache = inp.launch.get("enable_hierarchical_cache", True)
    info, problems = hugepages("/", selected_raw=selected_size(),
                               hicache_size=inp.launch.get("hicache_size") if hicache else None,
                               ranks_per_node=ranks, ranks_source=source)
    if hicache and (info.get("selected") or {}).get("size_kb"):
        problems.extend(allocator_problems(inp.launch))
    return DoctorPart({"hugepages": info}, tuple(problems))


def allocator_problems(launch) -> list[Problem]:
    """A launch's host-pool allocator that ignores SGLANG_HUGEPAGE_SIZE: the launch check refuses it
    (hooks.plan_launch), unless the fallback is allowed."""
    from . import hooks as hh

    if "hicache_storage_backend" not in launch:
        return []
    kind = hh._allocator_kind(launch.get("hicache_storage_backend"), launch.get("hicache_storage_backend_extra_config"))
    why = hh._why_not_hugepage_backed(kind)
    try:
        fallback = HUGEPAGE_FALLBACK.get_bool()
    except ValueError:  # an odd value: the launch check refuses it, and so does the allocator's answer here
        fallback = False
    if not why or fallback:
        return []
    return [Problem(f"hugepages: SGLANG_HUGEPAGE_SIZE is set, but {why}; the launch stops",
                    fix="unset SGLANG_HUGEPAGE_SIZE, or use a storage backend whose host pool comes from SGLang's "
                        f"default allocator, or {HUGEPAGE_FALLBACK.name}=1 to serve from ordinary pages")]


def selected_size() -> str | None:
    """SGLANG_HUGEPAGE_SIZE as the launch will read it (through SGLang's env registry); None when unset."""
    try:
        from sglang.srt.environ import envs as sglang_envs

        return sglang_envs.SGLANG_HUGEPAGE_SIZE.get() or None
    except Exception:  # SGLang missing or broken: doctor reports that elsewhere
        return None


def _size_row(pool: hp.SizePool) -> dict[str, Any]:
    return {
        "size_kb": pool.page_bytes // hp.KIB, "total": pool.total, "free": pool.free, "resv": pool.resv,
        "surplus": pool.surplus, "overcommit": pool.overcommit, "usable": pool.usable,
        "nodes": [{"node": n.node, "total": n.total, "free": n.free, "surplus": n.surplus} for n in pool.nodes],
    }


def hugepages(root: str = "/", *, selected_raw: str | None = None, hicache_size: int | None = None,
              ranks_per_node: int | None = None, ranks_source: str = "") -> tuple[dict[str, Any], list[str]]:
    """(hardware.hugepages, problems) read under `root`. `selected_raw` is SGLANG_HUGEPAGE_SIZE as the launch
    will see it; `hicache_size` (GB per rank) x `ranks_per_node` is the launch whose fit is judged."""
    problems: list[str] = []
    info: dict[str, Any] = dict(hp.meminfo_hugepages(root))
    info["mounts"] = hp.hugetlbfs_mounts(root)
    default = hp.default_page_bytes(root)
    info["default_size_kb"] = default // hp.KIB if default else None
    unknown: list[str] = []
    pools = {}
    for size in hp.list_sizes(root):
        pool = hp.read_size_pool(root, size)
        if pool is not None:
            pools[size] = pool
            unknown.extend(pool.problems)
    info["sizes"] = [_size_row(p) for p in pools.values()]
    limits = []
    for size in pools:
        limit, cg_problems = hp.read_cgroup_limit(root, size)
        unknown.extend(cg_problems)
        if limit is not None:
            limits.append({"size_kb": size // hp.KIB, "path": limit.path, "limit_bytes": limit.limit_bytes,
                           "usage_bytes": limit.usage_bytes})
    info["cgroup_limits"] = limits

    page, error = None, None
    try:
        page = hp.parse_size(selected_raw)
    except hp.HugepageConfigError as exc:
        error = str(exc)
        problems.append(Problem(f"hugepages: {error}",
                                fix=f"set SGLANG_HUGEPAGE_SIZE to {' or '.join(hp.SGLANG_SIZES)}, or unset it"))
    info["selected"] = {"env": selected_raw or None, "size_kb": page // hp.KIB if page else None, "error": error}
    if page is not None and page not in pools:
        problems.append(Problem(
            f"hugepages: SGLANG_HUGEPAGE_SIZE={selected_raw} but this kernel has no {hp.size_label(page)} pool "
            f"(/{hp.SYS_POOLS}/{hp.pool_dir_name(page)} is missing)",
            fix=f"boot with hugepagesz={hp.cmdline_size(page)} hugepages=N on the kernel command line, or set "
                "SGLANG_HUGEPAGE_SIZE to a size this kernel has"))
    info["fit"] = None
    if hicache_size:
        info["fit"] = _fit(root, page, error, hicache_size, ranks_per_node or 1, ranks_source, default, problems)
    info["unknown"] = unknown
    return info, problems


def _fit(root, page, error, hicache_size, ranks, ranks_source, default, problems) -> dict[str, Any]:
    fit: dict[str, Any] = {"hicache_size_gb": hicache_size, "ranks_per_node": ranks, "ranks_source": ranks_source,
                           "size_kb": page // hp.KIB if page else None, "need_pages": None, "usable_pages": None,
                           "fits": None, "limited_by": None, "message": ""}
    if page is None:
        fit["message"] = error or ("SGLANG_HUGEPAGE_SIZE is not set: the host pool uses ordinary pages and SGLang "
                                   "checks it against RAM")
        return fit
    per_rank = hp.launch_need_pages(hicache_size, page)
    cap = hp.capacity(root, page, policy=hp.MemPolicy("doctor", None, None, None))
    fit.update(need_pages=per_rank * ranks, usable_pages=cap.usable_pages, limited_by=cap.limited_by)
    if cap.usable_pages is None:
        fit["message"] = "cannot tell: " + "; ".join(cap.unknown)
        return fit
    sf = hp.check(int(hicache_size * 1e9), cap, ranks=ranks, per_rank_pages=per_rank)
    fit["fits"] = sf is None
    if sf is None:
        fit["message"] = (f"{ranks} x {hicache_size} GB fit: {per_rank * ranks} of {cap.usable_pages} usable "
                          f"{hp.size_label(page)} pages (at least; DSA indexer and MTP draft pools add to it)")
    else:
        share, share_gb = hp.per_rank_budget(cap.usable_pages, page, ranks)
        lower = f"lower --hicache-size to at most {share_gb} GB per rank ({hp.gib(share)}), or --hicache-ratio"
        fit["message"] = hp.shortfall_message(
            sf, what=f"--hicache-size {hicache_size} GB per rank", default_page_bytes=default,
            other_sizes=hp.free_by_size(root), lower_hint=lower)
        head, _, rest = fit["message"].partition("\n")
        if cap.limit_kind in ("cgroup", "missing"):  # the message's first way out: raise the limit / boot with pages
            way = rest.splitlines()[0].removesuffix(", or:")
        else:
            way = (f"reserve {sf.missing_pages} more {hp.size_label(page)} pages "
                   f"({hp.reserve_commands(sf, default_page_bytes=default)[0]})")
        problems.append(Problem(head, fix=f"{way}, or {lower}"))
    return fit


def render_lines(info: dict[str, Any]) -> list[str]:
    """The text report's lines for `hardware.hugepages`, one summary line first."""
    def v(x):
        return "unknown" if x is None else x

    lines = [f"  hugepages: {info['free']}/{info['total']} free x {info['size_kb']} kB, hugetlbfs mounts: "
             f"{info['mounts'] or 'none'}"]
    for row in info.get("sizes", []):
        label = hp.size_label(row["size_kb"] * hp.KIB)
        lines.append(f"  hugepages {label}: total {v(row['total'])}, free {v(row['free'])}, reserved "
                     f"{v(row['resv'])}, usable {v(row['usable'])}, surplus {v(row['surplus'])}/"
                     f"{v(row['overcommit'])} overcommit")
        for n in row["nodes"]:
            lines.append(f"    node{n['node']}: total {v(n['total'])}, free {v(n['free'])}")
    for lim in info.get("cgroup_limits", []):
        lines.append(f"  hugetlb cgroup {hp.size_label(lim['size_kb'] * hp.KIB)}: "
                     f"{hp.gib(lim['usage_bytes'])} of {hp.gib(lim['limit_bytes'])} ({lim['path']})")
    sel = info.get("selected") or {}
    if sel.get("env") is not None:
        lines.append(f"  SGLANG_HUGEPAGE_SIZE={sel['env']}: " + (sel["error"] or "ok"))
    fit = info.get("fit")
    if fit:
        head = {True: "fits", False: "DOES NOT FIT", None: "unknown"}[fit["fits"]]
        lines.append(f"  --hicache-size {fit['hicache_size_gb']} x {fit['ranks_per_node']} ranks "
                     f"({fit['ranks_source']}): {head}")
        lines.extend("    " + ln for ln in fit["message"].splitlines())
    for u in info.get("unknown", []):
        lines.append(f"  unknown: {u}")
    return lines


def render(hardware: dict[str, Any], sections: dict[str, Any]) -> list[str]:
    return render_lines(hardware["hugepages"])


REPORTER = DoctorReporter(report, render, hardware=("hugepages",))
