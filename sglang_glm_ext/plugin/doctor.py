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
             l3_paths: [{path, exists, o_direct, free_bytes, budget_bytes, slab_bytes, held_bytes, need_bytes}],
             l3_checksum: {version, xxhash_c, vector, how, cpu_best, warning} | {error}         (added in schema 1)
             megamoe: {fp8_sm90: {possible, why}, fp4_sm100: {possible, why},
                       deep_gemm: {version, imports, error}, retired_env: [str], dg_use_fp4_acts_set: bool},
             cpu_serve: {mode, may_run, why_not, standin_reachable, accelerator, real_sgl_kernel,
                         use_cpu_engine},                                                 (cpu_serve: added in schema 1)
             gpu_bringup: {mode, may_run, why_not, standin_reachable, real_sgl_kernel, missing_settings,
                           indexer_torch_path}}                                         (gpu_bringup: added in schema 1)
  l3: {active, [backend_class, hicache_storage_backend, config, extra_config | error,
       state: {deployment_id, cold_start, ack, wait_ms, ranks, require_plp, plp, index: {path, exists,
       entries_for_deployment, entries_total}, slabs: [{rank, path, bytes, slots, page_bytes, namespace}]]}          (added in schema 1)
  (hugepages: null = the kernel did not say; `unknown` names why.)
  Added in schema 1 (nothing above renamed): problem_details: [{problem, fix, source}] (one per `problems` entry,
  same order; source: plugin | launch | the folder of the doctor part), patch_counts: {serving, applied,
  demo_only, cpu_serve_off, gpu_bringup_off}, launch (given a launch line): {command, entry, env, argv, parsed}.

The GPU listing is plugin-wide (here); every other "hardware" key, and the problems that go with it, is a
folder's part (`<folder>/doctor.py` REPORTER, listed in plugin/registry.py DOCTOR_PARTS), which names the keys it
owns and renders their text lines, so nothing here names a feature's keys. A part may also own top-level sections
(`DoctorPart.sections`, e.g. "l3"): schema additions, never one of the keys above.

A feature that SGLang's own arguments switch on (`Feature.active_when`: megamoe) is `active` when doctor is given
those arguments (`doctor --moe-a2a-backend megamoe`, registry.SGLANG_ARGS, passed as `launch`); without them it
reports off. `available` means it can work here: its patches are in (features.why_unavailable), and this node can
serve it (`Feature.needs_cuda_gpu`; a part's `DoctorPart.unavailable`, e.g. megamoe with no SM90/SM100 GPU).

The launch being checked: either doctor's own options (plugin flags, `--hicache-size`, SGLang's `--moe-a2a-backend`
...: each SGLang one parsed by SGLang's own parser, so its choices are SGLang's live lists; plugin flags validated
as at a launch), or its whole command line after `--` (plugin/launch.py): leading NAME=VALUE words become this
process's environment first, then SGLang's parser (the plugin's flags on it) reads exactly those arguments and
ServerArgs.from_cli_args runs the plugin's launch checks. What SGLang's parser or those checks refuse is a problem.
Every problem carries a fix (a part's `Problem.fix`, else its `DoctorPart.fix`).

Text: a summary a screen tall by default (`render_summary`: versions, patch counts, one line per feature, every
problem with its fix); `-v` (the CLI's global count) adds every patch, each part's hardware lines and the L3 state.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import sys
from types import SimpleNamespace
from typing import Any

from ..declare import DoctorInput, DoctorPart, DoctorReporter, PluginFlagError, Tier
from ..patching.ledger import State
from . import __version__, compat, envs, features, flags
from . import launch as launch_line
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


class _Problems:
    """The report's problems in order, each with its fix and where it came from; one text is reported once (a bad
    L3 config reaches doctor through the launch checks and through the L3 part)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, str]] = []
        self._seen: set[str] = set()

    def add(self, problem: str, source: str, fix: str = "") -> None:
        key = _same(problem)
        if key in self._seen:
            return
        self._seen.add(key)
        self.rows.append({"problem": str(problem), "fix": getattr(problem, "fix", "") or fix, "source": source})

    def texts(self) -> list[str]:
        return [r["problem"] for r in self.rows]


_LABELS = ("launch refused: ", "launch: ", "sglang-glm-ext: ")


def _same(text: str) -> str:
    """What two wordings of one problem share: no label or "sglang-glm-ext: " prefix, no quotes around values."""
    text = str(text)
    while text.startswith(_LABELS):
        text = text.split(": ", 1)[1]
    return text.replace("'", "").replace('"', "")


def _check_part_keys(part: DoctorReporter, got: DoctorPart) -> None:
    """A part fills exactly the keys it declares (what render_text shows and JSON readers rely on); anything else
    is a folder bug, stopped here rather than shipped as a changed schema."""
    if set(got.hardware) != set(part.hardware) or set(got.sections) != set(part.sections):
        raise RuntimeError(f"doctor part {part.source} filled hardware {sorted(got.hardware)} and sections "
                           f"{sorted(got.sections)}; it declares {sorted(part.hardware)} and {sorted(part.sections)}")


FIX_CONTRACT = ("SGLang's code at the target is not what the patch was written for: tests/patching/test_contract.py "
                "names what moved; SGLANG_GLM_EXT_DISABLE=1 serves without the plugin meanwhile")
FIX_LAUNCH = ("correct that argument (`python -m sglang.launch_server --help` lists SGLang's arguments and their "
              "choices, and the plugin's under \"sglang-glm-ext\")")
FIX_REFUSED = "a real launch stops with this same line before serving: change what it names"


def _sglang_problems(status: compat.VersionStatus, problems: _Problems) -> None:
    newest = compat.SUPPORTED_SGLANG[-1]
    if status.installed is None:
        problems.add("sglang is not installed", "plugin",
                     f"pip install sglang=={newest} (a CPU-only machine: bash scripts/setup_env.sh)")
    elif not status.supported:
        problems.add(status.unsupported_message("sglang-glm-ext"), "plugin",
                     f"pip install sglang=={newest}, or a sglang-glm-ext that supports {status.installed}")
    if not _entry_point_registered():
        problems.add("entry point sglang.srt.plugins:glm_ext is not installed, so SGLang never loads the plugin",
                     "plugin", "install the package, not only put it on PYTHONPATH: pip install . in its checkout, "
                     "or pip install the wheel built from it (README: Install on a GPU node)")


def _fix_unavailable(why: str) -> str:
    if plugin.is_disabled():
        return f"unset {envs.DISABLE.name} (it turns the whole plugin off)"
    if plugin.ledger_state() is None:
        return "let SGLang load the plugin: install it (its sglang.srt.plugins entry point) and leave SGLANG_PLUGINS unset"
    if "skipped" in why and not compat.version_status().patches_allowed:
        return f"pip install sglang=={compat.SUPPORTED_SGLANG[-1]} (the supported release)"
    return FIX_CONTRACT


def _parse_launch(command: launch_line.Command, problems: _Problems):
    """SGLang's parse of the launch and the record it builds (the plugin's launch checks on it); None when SGLang's
    parser refuses the arguments."""
    try:
        ns = launch_line.parse(launch_line.sglang_argv(command))
    except launch_line.LaunchLineError as exc:
        fix = FIX_LAUNCH
        if plugin.is_disabled() and any(f.cli in str(exc) for f in flags.FLAGS):
            fix = f"the plugin is off ({envs.DISABLE.name}=1), so SGLang does not know its flags: unset it"
        problems.add(f"launch: {exc}", "launch", fix)
        return None
    try:
        launch_line.server_args(ns)
    except SystemExit as exc:  # the plugin's flag and L3 hooks refuse a launch with one line
        problems.add(f"launch refused: {str(exc.code).removeprefix('sglang-glm-ext: ')}", "launch", FIX_REFUSED)
    except Exception as exc:  # noqa: BLE001 - SGLang's own construction error: report it, do not crash doctor
        problems.add(f"launch refused: {type(exc).__name__}: {exc}", "launch", FIX_REFUSED)
    return ns


def _check_sglang_options(launch: dict[str, Any], problems: _Problems) -> None:
    """doctor's own `--moe-a2a-backend X`-style options, parsed by SGLang's parser: SGLang's choices, its types."""
    argv: list[str] = []
    for name in SGLANG_ARGS:
        if launch.get(name) is not None:
            argv += ["--" + name.replace("_", "-"), str(launch[name])]
    if not argv:
        return
    try:
        ns = launch_line.parse(argv, require_model_path=False)
    except launch_line.LaunchLineError as exc:
        problems.add(f"launch: {exc}", "launch", FIX_LAUNCH)
        for name in SGLANG_ARGS:  # an invalid value switches nothing on
            launch[name] = None
        return
    launch.update({name: getattr(ns, name) for name in SGLANG_ARGS if launch.get(name) is not None})


def _launch_from_namespace(ns, ranks_per_node: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(plugin flag values, SGLang-side launch values) of a parsed launch line."""
    from ..hugepages.capacity import ranks_on_node

    values = flags.values_from_namespace(ns)
    launch = {k: v for k, v in vars(ns).items() if not k.startswith("glm_ext__")}
    launch["hicache_size"] = launch.get("hicache_size") or None  # SGLang's 0: not given (--hicache-ratio sizes it)
    if ranks_per_node:
        launch["ranks_per_node"], launch["ranks_source"] = ranks_per_node, "--ranks-per-node"
    else:
        launch["ranks_per_node"] = ranks_on_node(*(int(launch.get(k) or 1)
                                                   for k in ("tp_size", "pp_size", "dp_size", "nnodes")))
        launch["ranks_source"] = "the launch: tp*pp*dp / nnodes"
    return values, launch


def collect(flag_values: dict[str, Any] | None = None, launch: dict[str, Any] | None = None,
            command: launch_line.Command | None = None) -> dict[str, Any]:
    """The report. `launch`: SGLang-side values of the launch being checked (DoctorInput.launch), or `command`:
    the launch's whole command line (its environment already applied), parsed here by SGLang's own parser once
    the plugin has registered (its flags are then on that parser, as in a server)."""
    loaded_via = _load_plugin()
    status = compat.version_status()
    problems = _Problems()
    _sglang_problems(status, problems)
    patches = _patch_rows(problems)
    values, launch, sections = _launch_checked(flag_values, dict(launch or {}), command, problems)
    cuda, gpu_list = gpus()
    versions = _versions(status)
    hardware: dict[str, Any] = {"cuda_available": cuda, "gpus": gpu_list}
    probe = DoctorInput(values=values, gpus=tuple(gpu_list), versions=versions,
                        launch={k: v for k, v in launch.items() if v is not None})
    node_unavailable, part_problems = _gather_parts(probe, hardware, sections)
    feats = _feature_rows(values, launch, gpu_list, node_unavailable, problems)
    for problem, source, fix in part_problems:  # after the plugin's and the launch's: theirs come first
        problems.add(problem, source, fix)

    texts = problems.texts()
    report = {
        "schema": SCHEMA,
        "ok": not texts,
        "problems": texts,
        "problem_details": problems.rows,
        "plugin": {"version": __version__, "disabled": plugin.is_disabled(),
                   "entry_point": _entry_point_registered(), "loaded_via": loaded_via},
        "sglang": {"installed": status.installed, "supported": status.supported,
                   "supported_versions": list(compat.SUPPORTED_SGLANG), "forced": status.forced},
        "versions": versions,
        "patches": patches,
        "patch_counts": patch_counts(patches),
        "features": feats,
        "hardware": hardware,
    }
    clash = set(sections) & set(report)
    if clash:  # a folder bug: never let it overwrite a fixed key of schema 1
        raise RuntimeError(f"doctor parts claim fixed report keys: {sorted(clash)}")
    report.update(sections)
    return report


def _patch_rows(problems: _Problems) -> list[dict[str, Any]]:
    """Every declared patch with its live state; a failed one is a problem."""
    ledger = plugin.ledger_state()
    rows = []
    for p in (ledger.patches if ledger else ()):
        st = ledger.status.get(p.id)
        rows.append({"id": p.id, "target": p.target, "feature": p.feature.name, "tier": p.tier.value,
                     "state": st.state.value if st else State.PENDING.value, "detail": st.detail if st else ""})
        if st and st.state is State.FAILED:
            problems.add(f"patch {p.id} on {p.target} failed: {st.detail}", "plugin", FIX_CONTRACT)
    return rows


def _launch_checked(flag_values: dict[str, Any] | None, launch: dict[str, Any],
                    command: launch_line.Command | None, problems: _Problems):
    """(plugin flag values, SGLang-side launch values, the "launch" section) of the launch being checked, its
    refusals added to ``problems``: a launch line through SGLang's parser and the plugin's hooks, or doctor's own
    options through SGLang's parser and the plugin's flag check."""
    sections: dict[str, Any] = {}
    if command is not None:
        ns = _parse_launch(command, problems)
        sections["launch"] = {"command": command.describe(), "entry": command.entry, "env": dict(command.env),
                              "argv": list(command.argv), "parsed": ns is not None}
        flag_values, launch = _launch_from_namespace(ns, launch.get("ranks_per_node")) if ns else ({}, {})
    else:
        _check_sglang_options(launch, problems)
    values = dict(flags.get())
    values.update({k: v for k, v in (flag_values or {}).items() if v not in (None, False)})
    if command is None:  # a launch line already ran these checks through the plugin's own hooks
        try:
            flags.validate(values)
        except PluginFlagError as exc:
            problems.add(f"launch refused: {exc}", "launch", FIX_REFUSED)
    return values, launch, sections


def _versions(status: compat.VersionStatus) -> dict[str, Any]:
    return {"python": platform.python_version(), "sglang": status.installed,
            "torch": compat.installed_version("torch"),
            # sglang pins the `sgl-deep-gemm` distribution (import name deep_gemm)
            "deep_gemm": compat.installed_version("sgl-deep-gemm") or compat.installed_version("deep_gemm")
            or compat.installed_version("deep-gemm"),
            "flashinfer": compat.installed_version("flashinfer-python") or compat.installed_version("flashinfer")}


def _gather_parts(probe: DoctorInput, hardware: dict[str, Any], sections: dict[str, Any]):
    """Every folder's part, gathered: its hardware keys and top-level sections go into ``hardware`` and
    ``sections``; returns (feature -> why this node cannot serve it, [(problem, source, fix)])."""
    node_unavailable: dict[str, str] = {}
    part_problems: list[tuple[str, str, str]] = []
    for part in DOCTOR_PARTS:
        got = part.report(probe)
        _check_part_keys(part, got)
        hardware.update(got.hardware)
        sections.update(got.sections)
        node_unavailable.update(got.unavailable)
        part_problems += [(p, part.source, got.fix) for p in got.problems]
    return node_unavailable, part_problems


def _feature_rows(values: dict[str, Any], launch: dict[str, Any], gpu_list: list, node_unavailable: dict[str, str],
                  problems: _Problems) -> list[dict[str, Any]]:
    """One row per feature: switched on for this launch, and whether it can work here; a feature switched on that
    cannot is a problem."""
    server = SimpleNamespace(**launch)  # active_when reads SGLang's own arguments
    feats = []
    for f in FEATURES:
        active = f.switched_on(values, server)
        why = features.why_unavailable(f) if not plugin.is_disabled() else "plugin disabled"
        if why and active:
            problems.add(f"feature {f.name} is switched on but cannot work: {why}", "plugin", _fix_unavailable(why))
        node = node_unavailable.get(f.name, "")
        if not node and f.needs_cuda_gpu and not gpu_list:
            node = "needs a CUDA GPU; none is visible on this node"
            if active:
                switch = " / ".join(fl.cli for fl in f.flags if fl.switches) or f.name
                problems.add(f"feature {f.name} is switched on but {node}", "plugin",
                             f"run this launch on a GPU node, or leave out {switch}")
        why = "; ".join(w for w in (why, node) if w)
        feats.append({"name": f.name, "title": f.title, "active": active, "available": not why,
                      "why_unavailable": why})
    return feats


def patch_counts(patches: list[dict[str, Any]]) -> dict[str, int]:
    """Serving patches (guard and feature tiers, and the CPU serving stand-ins where that mode is on) applied of
    all, and the rest apart: register() never applies a demo-tier patch (CPU stand-ins for GPU copy ops), nor a
    CPU-serving one unless SGLANG_GLM_EXT_CPU_SERVE=1 may run here, so a skipped one of those is not missing."""
    def off_by_design(p: dict[str, Any]) -> str | None:
        if p["tier"] == Tier.DEMO.value:
            return "demo_only"
        if p["tier"] == Tier.CPU_SERVE.value and p["state"] != State.APPLIED.value:
            return "cpu_serve_off"
        if p["tier"] == Tier.GPU_BRINGUP.value and p["state"] != State.APPLIED.value:
            return "gpu_bringup_off"
        return None

    apart = [off_by_design(p) for p in patches]
    serving = [p for p, why in zip(patches, apart) if why is None]
    return {"serving": len(serving), "applied": sum(p["state"] == State.APPLIED.value for p in serving),
            "demo_only": apart.count("demo_only"), "cpu_serve_off": apart.count("cpu_serve_off"),
            "gpu_bringup_off": apart.count("gpu_bringup_off")}


def patch_summary(report: dict[str, Any], *, brief: bool = False) -> str:
    c = report.get("patch_counts") or patch_counts(report["patches"])
    why = "not applied by design" if brief else "never applied in a server: CPU stand-ins for GPU copy ops"
    demo = f" (+{c['demo_only']} demo/test-only, {why})" if c["demo_only"] else ""
    if c.get("cpu_serve_off"):
        demo += (f" (+{c['cpu_serve_off']} CPU-serving stand-ins, off" + ("" if brief else
                 ": applied only under SGLANG_GLM_EXT_CPU_SERVE=1 on a machine with no accelerator") + ")")
    if c.get("gpu_bringup_off"):
        demo += (f" (+{c['gpu_bringup_off']} GPU bring-up, off" + ("" if brief else
                 ": applied only under SGLANG_GLM_EXT_GPU_BRINGUP=1 on a GPU without a real sgl_kernel") + ")")
    return f"{c['applied']}/{c['serving']} serving patches applied{demo}"


def render_text(report: dict[str, Any]) -> str:
    """Everything (`doctor -v`): versions, every patch with its state, features, each part's hardware lines."""
    lines = [f"sglang-glm-ext {report['plugin']['version']}  (loaded via {report['plugin']['loaded_via']})"]
    s = report["sglang"]
    lines.append(f"sglang {s['installed']}: {'supported' if s['supported'] else 'NOT supported'} "
                 f"(supported: {', '.join(s['supported_versions'])})")
    v = report["versions"]
    lines.append("versions: " + ", ".join(f"{k}={v[k]}" for k in ("python", "torch", "deep_gemm", "flashinfer")))
    if report.get("launch"):
        lines.append(f"launch checked: {report['launch']['command']}")
    lines.append(f"patches: {patch_summary(report)}")
    for p in report["patches"]:
        state = {Tier.DEMO.value: "demo", Tier.CPU_SERVE.value: "cpu", Tier.GPU_BRINGUP.value: "gpu"}.get(
            p["tier"], p["state"]) \
            if p["state"] == State.SKIPPED.value else p["state"]
        detail = f"  ({p['detail']})" if p["detail"] else ""
        lines.append(f"  [{state:>7}] {p['id']:<28} {p['target']}{detail}")
    lines += _feature_lines(report)
    h = report["hardware"]
    lines.append(_gpu_line(h))
    for part in DOCTOR_PARTS:  # each folder renders the keys it owns
        lines.extend(part.render({k: h[k] for k in part.hardware if k in h},
                                 {k: report[k] for k in part.sections if k in report}))
    return "\n".join(lines + _problem_lines(report))


def render_summary(report: dict[str, Any]) -> str:
    """The default text, a screen tall: what runs, one line per feature with its verdict, every problem in full
    with its fix; the patch list, the hardware details and the L3 state are `-v`'s."""
    s = report["sglang"]
    lines = [f"sglang-glm-ext {report['plugin']['version']} on sglang {s['installed']} "
             f"({'supported' if s['supported'] else 'NOT supported: ' + ', '.join(s['supported_versions'])}), "
             f"torch {report['versions']['torch']}"]
    if report.get("launch"):
        lines.append(f"launch checked: {report['launch']['command']}")
    lines.append(f"patches: {patch_summary(report, brief=True)}")
    lines += _feature_lines(report)
    lines.append(_gpu_line(report["hardware"]))
    lines.append("(doctor -v: every patch, the hardware and the L3 state; --json: all of it)")
    return "\n".join(lines + _problem_lines(report))


def _feature_lines(report: dict[str, Any]) -> list[str]:
    lines = ["features:"]
    for f in report["features"]:
        state = "active" if f["active"] else "off"
        avail = "available" if f["available"] else f"unavailable: {f['why_unavailable']}"
        lines.append(f"  {f['name']:<14} {state:<7} {avail}")
    return lines


def _gpu_line(hardware: dict[str, Any]) -> str:
    return "hardware: GPUs: " + (", ".join(f"{g['name']} (SM{g['sm']})" for g in hardware["gpus"]) or "none")


def _problem_lines(report: dict[str, Any]) -> list[str]:
    if report["ok"]:
        return ["OK"]
    lines = ["PROBLEMS:"]
    for row in report["problem_details"]:
        lines.append(f"  - {row['problem']}")
        lines.append(f"    fix: {row['fix'] or '(none known: please report it)'}")
    return lines


def render_brief(report: dict[str, Any]) -> str:
    head = f"sglang-glm-ext {report['plugin']['version']}: {patch_summary(report, brief=True)}"
    if report["ok"]:
        return f"{head}, ok"
    return f"{head}, {len(report['problems'])} problem(s): " + "; ".join(report["problems"])


def main(args) -> int:
    values = flags.values_from_namespace(args)
    launch = {"hicache_size": getattr(args, "hicache_size", None),
              "ranks_per_node": getattr(args, "ranks_per_node", None)}
    launch.update({a: getattr(args, a, None) for a in SGLANG_ARGS})
    words = list(getattr(args, "launch_line", None) or [])
    command = None
    if words:
        mixed = [f.cli for f in flags.FLAGS if values.get(f.name) not in (None, False)]
        mixed += ["--" + k.replace("_", "-") for k, v in launch.items() if v is not None and k != "ranks_per_node"]
        if mixed:
            print(f"sglang-glm-ext doctor: {' '.join(mixed)} and a launch line after --: put them in the launch "
                  "line (doctor checks exactly its arguments)", file=sys.stderr)
            return 2
        try:
            command = launch_line.split_command(words)
        except launch_line.LaunchLineError as exc:
            print(f"sglang-glm-ext doctor: {exc}", file=sys.stderr)
            return 2
        os.environ.update(command.env)  # as the launch's environment: the plugin and SGLang read it from here
    report = collect(values, launch=launch, command=command)
    if args.json:
        json.dump(report, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    elif getattr(args, "brief", False):
        print(render_brief(report))
    elif getattr(args, "verbose", 0):  # the CLI's global -v / --verbose count
        print(render_text(report))
    else:
        print(render_summary(report))
    return 0 if report["ok"] else 1
