"""`sglang-glm-ext doctor`: what is installed, what the plugin did to SGLang, and whether what you enabled works.

JSON schema (stable; bump SCHEMA on any breaking change, documented in README "doctor --json"):
  schema: int, ok: bool, problems: [str],
  plugin: {version, disabled, entry_point}, sglang: {installed, supported, supported_versions, forced},
  versions: {python, torch, deep_gemm, flashinfer, sglang},
  patches: [{id, target, feature, tier, state, detail}],
  features: [{name, title, active, available, why_unavailable}],
  hardware: {cuda_available, gpus: [{index, name, sm}], fp4_megamoe: {possible, why},
             hugepages: {...}, l3_paths: [{path, exists, o_direct, free_bytes, budget_bytes}]},
  l3: {active, [backend_class, hicache_storage_backend, config, extra_config | error,
       state: {deployment_id, cold_start, ranks, require_plp, plp, index: {path, exists, entries_for_deployment,
       entries_total}, slabs: [{rank, path, bytes, slots, page_bytes, namespace}]}]}   (added in schema 1)
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import sys
from typing import Any

SCHEMA = 1


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _entry_point_registered() -> bool:
    eps = importlib.metadata.entry_points(group="sglang.srt.plugins")
    return any(ep.name == "glm_ext" and ep.value == "sglang_glm_ext:register" for ep in eps)


def _load_plugin() -> str:
    """Load the plugin the way a server does; returns how it was loaded."""
    import sglang_glm_ext as plugin

    try:
        from sglang.srt.plugins import load_plugins
    except Exception as exc:  # sglang missing or broken: register() cannot patch anything either
        return f"sglang.srt.plugins not importable: {exc}"
    # doctor's own argv carries the flags being checked (`doctor --enable-cp-l3 ...`); on an unsupported SGLang
    # register() would treat them as a launch asking for a feature and exit, and doctor must report instead.
    saved_argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        load_plugins()
    finally:
        sys.argv = saved_argv
    if plugin.ledger_state() is None and not plugin.is_disabled():
        plugin.register()  # not installed as a distribution (source checkout): still show the patches
        return "register() called directly (entry point not installed)"
    return "load_plugins()"


def hugepages() -> dict[str, Any]:
    info: dict[str, Any] = {"total": 0, "free": 0, "size_kb": 0, "mounts": []}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key == "HugePages_Total":
                    info["total"] = int(rest.split()[0])
                elif key == "HugePages_Free":
                    info["free"] = int(rest.split()[0])
                elif key == "Hugepagesize":
                    info["size_kb"] = int(rest.split()[0])
        with open("/proc/mounts") as f:
            info["mounts"] = [ln.split()[1] for ln in f if ln.split()[2:3] == ["hugetlbfs"]]
    except OSError:
        pass
    return info


def gpus() -> tuple[bool, list[dict[str, Any]]]:
    try:
        import torch
    except Exception:
        return False, []
    if not torch.cuda.is_available():
        return False, []
    out = []
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        out.append({"index": i, "name": torch.cuda.get_device_name(i), "sm": major * 10 + minor})
    return True, out


def fp4_megamoe(gpu_list: list[dict[str, Any]]) -> dict[str, Any]:
    if not gpu_list:
        return {"possible": False, "why": "no CUDA GPU visible"}
    if not all(g["sm"] // 10 == 10 for g in gpu_list):
        sms = sorted({g["sm"] for g in gpu_list})
        return {"possible": False, "why": f"FP4 MegaMoE kernels are SM100-only; this node has SM {sms}"}
    if _version("deep_gemm") is None and _version("deep-gemm") is None:
        return {"possible": False, "why": "deep_gemm is not installed"}
    return {"possible": True, "why": ""}


def l3_paths(config_path: str | None) -> tuple[list[dict[str, Any]], list[str]]:
    if not config_path:
        return [], []
    problems: list[str] = []
    try:
        from .l3.config import L3Config
        from .diskcheck import probe_path
    except ImportError as exc:
        return [], [f"L3 engine not importable: {exc}"]
    try:
        cfg = L3Config.load(config_path)
    except Exception as exc:
        return [], [f"--cp-l3-config {config_path}: {exc}"]
    rows = []
    for disk in cfg.disks:
        row = probe_path(disk.path, disk.budget)
        rows.append(row)
        problems.extend(row.get("problems", []))
    return rows, problems


def collect(flag_values: dict[str, Any] | None = None) -> dict[str, Any]:
    import sglang_glm_ext as plugin
    from . import compat, features, flags

    loaded_via = _load_plugin()
    status = compat.version_status()
    ledger = plugin.ledger_state()
    problems: list[str] = []
    if status.installed is None:
        problems.append("sglang is not installed")
    elif not status.supported:
        problems.append(status.unsupported_message("sglang-glm-ext"))
    if not _entry_point_registered():
        problems.append("entry point sglang.srt.plugins:glm_ext is not installed (pip install sglang-glm-ext)")

    patches = []
    for p in (ledger.patches if ledger else ()):
        st = ledger.status.get(p.id)
        patches.append({
            "id": p.id, "target": p.target, "feature": p.feature, "tier": p.tier.value,
            "state": st.state.value if st else "pending", "detail": st.detail if st else "",
        })
        if st and st.state.value == "failed":
            problems.append(f"patch {p.id} on {p.target} failed: {st.detail}")

    values = dict(flags.get())
    values.update({k: v for k, v in (flag_values or {}).items() if v not in (None, False)})
    feats = []
    for f in features.FEATURES:
        active = features.active_in(f.name, values)
        why = features.why_unavailable(f.name) if not plugin.is_disabled() else "plugin disabled"
        feats.append({"name": f.name, "title": f.title, "active": active, "available": not why,
                      "why_unavailable": why})
        if active and why:
            problems.append(f"feature {f.name} is enabled but cannot work: {why}")

    cuda, gpu_list = gpus()
    l3_rows, l3_problems = l3_paths(values.get("cp_l3_config"))
    problems.extend(l3_problems)
    # --- l3 backend: backend class, resolved extra config, L3 state on disk ---
    from .l3.hicache.doctor import report as l3_backend_report

    l3_section, l3_backend_problems = l3_backend_report(values)
    problems.extend(p for p in l3_backend_problems if p not in problems)
    report = {
        "schema": SCHEMA,
        "ok": not problems,
        "problems": problems,
        "plugin": {"version": plugin.__version__, "disabled": plugin.is_disabled(),
                   "entry_point": _entry_point_registered(), "loaded_via": loaded_via},
        "sglang": {"installed": status.installed, "supported": status.supported,
                   "supported_versions": list(compat.SUPPORTED_SGLANG), "forced": status.forced},
        "versions": {"python": platform.python_version(), "sglang": status.installed, "torch": _version("torch"),
                     "deep_gemm": _version("deep_gemm") or _version("deep-gemm"),
                     "flashinfer": _version("flashinfer-python") or _version("flashinfer")},
        "patches": patches,
        "features": feats,
        "hardware": {"cuda_available": cuda, "gpus": gpu_list, "fp4_megamoe": fp4_megamoe(gpu_list),
                     "hugepages": hugepages(), "l3_paths": l3_rows},
        "l3": l3_section,  # --- l3 backend ---
    }
    return report


def render_text(report: dict[str, Any]) -> str:
    lines = [f"sglang-glm-ext {report['plugin']['version']}  (loaded via {report['plugin']['loaded_via']})"]
    s = report["sglang"]
    lines.append(f"sglang {s['installed']}: {'supported' if s['supported'] else 'NOT supported'} "
                 f"(supported: {', '.join(s['supported_versions'])})")
    v = report["versions"]
    lines.append("versions: " + ", ".join(f"{k}={v[k]}" for k in ("python", "torch", "deep_gemm", "flashinfer")))
    lines.append("patches:")
    for p in report["patches"]:
        detail = f"  ({p['detail']})" if p["detail"] else ""
        lines.append(f"  [{p['state']:>7}] {p['id']:<28} {p['target']}{detail}")
    lines.append("features:")
    for f in report["features"]:
        state = "active" if f["active"] else "off"
        avail = "available" if f["available"] else f"unavailable: {f['why_unavailable']}"
        lines.append(f"  {f['name']:<14} {state:<7} {avail}")
    h = report["hardware"]
    gpu_s = ", ".join(f"{g['name']} (SM{g['sm']})" for g in h["gpus"]) or "none"
    lines.append(f"hardware: GPUs: {gpu_s}; FP4 MegaMoE: "
                 f"{'possible' if h['fp4_megamoe']['possible'] else h['fp4_megamoe']['why']}")
    hp = h["hugepages"]
    lines.append(f"  hugepages: {hp['free']}/{hp['total']} free x {hp['size_kb']} kB, hugetlbfs mounts: "
                 f"{hp['mounts'] or 'none'}")
    for row in h["l3_paths"]:
        lines.append(f"  L3 path {row['path']}: o_direct={row.get('o_direct')} free={row.get('free_bytes')} "
                     f"budget={row.get('budget_bytes')}")
    from .l3.hicache.doctor import render as render_l3  # --- l3 backend ---

    lines.extend(render_l3(report.get("l3", {})))
    lines.append("OK" if report["ok"] else "PROBLEMS:\n  - " + "\n  - ".join(report["problems"]))
    return "\n".join(lines)


def main(args) -> int:
    from . import flags

    values = flags.values_from_namespace(args)
    report = collect(values)
    if args.json:
        json.dump(report, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    elif getattr(args, "brief", False):
        print(f"sglang-glm-ext {report['plugin']['version']}: "
              f"{sum(p['state'] == 'applied' for p in report['patches'])}/{len(report['patches'])} patches applied, "
              f"{'ok' if report['ok'] else 'problems: ' + '; '.join(report['problems'])}")
    else:
        print(render_text(report))
    return 0 if report["ok"] else 1

