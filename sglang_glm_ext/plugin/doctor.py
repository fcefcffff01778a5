"""`sglang-glm-ext doctor`: what is installed, what the plugin did to SGLang, and whether what you enabled works.

JSON schema (stable; bump SCHEMA on any breaking change, documented in README "doctor --json"):
  schema: int, ok: bool, problems: [str],
  plugin: {version, disabled, entry_point, loaded_via}, sglang: {installed, supported, supported_versions, forced},
  versions: {python, torch, deep_gemm, flashinfer, sglang},
  patches: [{id, target, feature, tier, state, detail}],
  features: [{name, title, active, available, why_unavailable}],
  hardware: {cuda_available, gpus: [{index, name, sm}],
             fp4_megamoe: {possible, why, deep_gemm, trtllm_layout: {supported, why}},
             hugepages: {total, free, size_kb, mounts, default_size_kb, sizes: [{size_kb, total, free, resv,
                         surplus, overcommit, usable, nodes: [{node, total, free, surplus}]}],
                         selected: {env, size_kb, error}, cgroup_limits: [{size_kb, path, limit_bytes,
                         usage_bytes}], fit: null | {hicache_size_gb, ranks_per_node, ranks_source, size_kb,
                         need_pages, usable_pages, fits, limited_by, message}, unknown: [str]},
             l3_paths: [{path, exists, o_direct, free_bytes, budget_bytes}],
             megamoe: {fp8_sm90: {possible, why}, fp4_sm100: {possible, why},
                       deep_gemm: {version, imports, error}, retired_env: [str], dg_use_fp4_acts_set: bool}}
  l3: {active, [backend_class, hicache_storage_backend, config, extra_config | error,
       state: {deployment_id, cold_start, ranks, require_plp, plp, index: {path, exists, entries_for_deployment,
       entries_total}, slabs: [{rank, path, bytes, slots, page_bytes, namespace}]]}          (added in schema 1)
  (hugepages: null = the kernel did not say; `unknown` names why.)

The GPU listing is plugin-wide (here); every other "hardware" key, and the problems that go with it, is a
folder's part (`<folder>/doctor.py` report(), listed in plugin/registry.py DOCTOR_PARTS). A part may also own
top-level sections (`DoctorPart.sections`, e.g. "l3"): schema additions, never one of the keys above.

A feature that SGLang's own arguments switch on (`Feature.active_when`: megamoe) is `active` when doctor is given
those arguments (`doctor --moe-a2a-backend megamoe`, registry.SGLANG_ARGS, passed as `launch`); without them it
reports off.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import sys
from types import SimpleNamespace
from typing import Any

from ..declare import DoctorInput
from ..hostmem import doctor as hostmem_doctor
from ..l3 import doctor as l3_doctor
from ..megamoe import doctor as megamoe_doctor
from ..patching.ledger import State
from . import __version__, compat, features, flags
from . import register as plugin
from .registry import DOCTOR_PARTS, FEATURES, SGLANG_ARGS

SCHEMA = 1


def _entry_point_registered() -> bool:
    eps = importlib.metadata.entry_points(group="sglang.srt.plugins")
    return any(ep.name == "glm_ext" and ep.value == "sglang_glm_ext:register" for ep in eps)


def _load_plugin() -> str:
    """Load the plugin the way a server does, minus the launch check of argv; returns how it was loaded.

    doctor's own argv carries the flags being checked (`doctor --enable-cp-l3 ...`), not a launch: on an
    unsupported SGLang it must report, not exit. So it registers with no argv to check first; load_plugins()
    then runs the entry point (which returns that ledger) and applies other plugins' hooks, as in a server.
    """
    try:
        from sglang.srt.plugins import load_plugins
    except Exception as exc:  # sglang missing or broken: register() cannot patch anything either
        return f"sglang.srt.plugins not importable: {exc}"
    plugin.register(argv=())
    load_plugins()
    if not _entry_point_registered():
        return "register() called directly (entry point not installed)"
    return "load_plugins()"


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


def collect(flag_values: dict[str, Any] | None = None, launch: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report; `launch`: SGLang-side values of the launch being checked (DoctorInput.launch)."""
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
            "id": p.id, "target": p.target, "feature": p.feature.name, "tier": p.tier.value,
            "state": st.state.value if st else State.PENDING.value, "detail": st.detail if st else "",
        })
        if st and st.state is State.FAILED:
            problems.append(f"patch {p.id} on {p.target} failed: {st.detail}")

    values = dict(flags.get())
    values.update({k: v for k, v in (flag_values or {}).items() if v not in (None, False)})
    feats = []
    for f in FEATURES:
        active = f.switched_on(values, SimpleNamespace(**(launch or {})))  # active_when reads SGLang's own args
        why = features.why_unavailable(f) if not plugin.is_disabled() else "plugin disabled"
        feats.append({"name": f.name, "title": f.title, "active": active, "available": not why,
                      "why_unavailable": why})
        if active and why:
            problems.append(f"feature {f.name} is enabled but cannot work: {why}")

    cuda, gpu_list = gpus()
    versions = {"python": platform.python_version(), "sglang": status.installed,
                "torch": compat.installed_version("torch"),
                # sglang pins the `sgl-deep-gemm` distribution (import name deep_gemm)
                "deep_gemm": compat.installed_version("sgl-deep-gemm") or compat.installed_version("deep_gemm")
                or compat.installed_version("deep-gemm"),
                "flashinfer": compat.installed_version("flashinfer-python") or compat.installed_version("flashinfer")}
    hardware: dict[str, Any] = {"cuda_available": cuda, "gpus": gpu_list}
    probe = DoctorInput(values=values, gpus=tuple(gpu_list), versions=versions,
                        launch={k: v for k, v in (launch or {}).items() if v is not None})
    sections: dict[str, Any] = {}
    for part in DOCTOR_PARTS:  # each folder's part: its hardware keys, its top-level sections and its problems
        got = part(probe)
        hardware.update(got.hardware)
        sections.update(got.sections)
        problems.extend(got.problems)
    report = {
        "schema": SCHEMA,
        "ok": not problems,
        "problems": problems,
        "plugin": {"version": __version__, "disabled": plugin.is_disabled(),
                   "entry_point": _entry_point_registered(), "loaded_via": loaded_via},
        "sglang": {"installed": status.installed, "supported": status.supported,
                   "supported_versions": list(compat.SUPPORTED_SGLANG), "forced": status.forced},
        "versions": versions,
        "patches": patches,
        "features": feats,
        "hardware": hardware,
    }
    clash = set(sections) & set(report)
    if clash:  # a folder bug: never let it overwrite a fixed key of schema 1
        raise RuntimeError(f"doctor parts claim fixed report keys: {sorted(clash)}")
    report.update(sections)
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
    mm = h["megamoe"]
    lines.append("  MegaMoE: " + "; ".join(
        f"{k} {'possible' if mm[k]['possible'] else 'no: ' + mm[k]['why']}" for k in ("fp8_sm90", "fp4_sm100"))
        + f"; deep_gemm {mm['deep_gemm']['version'] or 'absent'}"
        + ("" if mm["deep_gemm"]["imports"] or not mm["deep_gemm"]["error"] else f" ({mm['deep_gemm']['error']})")
        + ("; NVFP4 on the TRTLLM layout: " + ("yes" if h["fp4_megamoe"]["trtllm_layout"]["supported"]
                                                 else h["fp4_megamoe"]["trtllm_layout"]["why"])))
    lines.extend(megamoe_doctor.render_shared_expert(mm.get("shared_expert")))
    lines.extend(hostmem_doctor.render_lines(h["hugepages"]))
    for row in h["l3_paths"]:
        lines.append(f"  L3 path {row['path']}: o_direct={row.get('o_direct')} free={row.get('free_bytes')} "
                     f"budget={row.get('budget_bytes')}")
    lines.extend(l3_doctor.render_section(report.get("l3") or {}))
    lines.append("OK" if report["ok"] else "PROBLEMS:\n  - " + "\n  - ".join(report["problems"]))
    return "\n".join(lines)


def main(args) -> int:
    values = flags.values_from_namespace(args)
    launch = {"hicache_size": getattr(args, "hicache_size", None),
              "ranks_per_node": getattr(args, "ranks_per_node", None)}
    launch.update({a: getattr(args, a, None) for a in SGLANG_ARGS})
    report = collect(values, launch=launch)
    if args.json:
        json.dump(report, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    elif getattr(args, "brief", False):
        applied = sum(p["state"] == State.APPLIED.value for p in report["patches"])
        print(f"sglang-glm-ext {report['plugin']['version']}: {applied}/{len(report['patches'])} patches applied, "
              f"{'ok' if report['ok'] else 'problems: ' + '; '.join(report['problems'])}")
    else:
        print(render_text(report))
    return 0 if report["ok"] else 1

