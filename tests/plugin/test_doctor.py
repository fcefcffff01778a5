"""`sglang-glm-ext doctor` reports the live state and exits non-zero when something enabled cannot work."""

import json
import os

import pytest


_PY = None  # the session's sglang_python (tests/conftest.py), set for this module by _fork_from_sglang


@pytest.fixture(scope="module", autouse=True)
def _fork_from_sglang(sglang_python):
    """`sglang-glm-ext doctor` in a process of its own whose parent imported SGLang but never the plugin: the CLI's
    behaviour (argv, environment, exit status, output) is what these tests check, not what importing SGLang costs."""
    global _PY
    _PY = sglang_python
    yield
    _PY = None


def doctor(*args, env=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    full_env.update(env or {})
    return _PY.run(module="sglang_glm_ext.cli", argv=["doctor", *args], env=full_env, timeout=300)


@pytest.fixture(scope="module")
def report():
    proc = doctor("--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_json_reports_supported_sglang_and_every_patch_applied(report):
    from sglang_glm_ext.plugin.registry import PATCHES

    assert report["schema"] == 1 and report["ok"] is True and report["problems"] == []
    assert report["sglang"] == {"installed": "0.5.23", "supported": True, "supported_versions": ["0.5.23"],
                                "forced": False}
    assert report["plugin"]["entry_point"] is True and report["plugin"]["loaded_via"] == "load_plugins()"
    assert [p["id"] for p in report["patches"]] == [p.id for p in PATCHES]
    # Demo-tier patches (CPU stand-ins) are never applied by register(); the CPU serving stand-ins only with
    # SGLANG_GLM_EXT_CPU_SERVE=1 (tests/cpu_serve/), the GPU bring-up ones only with SGLANG_GLM_EXT_GPU_BRINGUP=1 on
    # a GPU (tests/gpu_bringup/); everything else is.
    off = ("demo", "cpu_serve", "gpu_bringup")
    assert {p["state"] for p in report["patches"] if p["tier"] not in off} == {"applied"}
    assert {p["state"] for p in report["patches"] if p["tier"] in off} == {"skipped"}


SCHEMA_1 = {"schema", "ok", "problems", "plugin", "sglang", "versions", "patches", "features", "hardware", "l3"}


def test_json_schema_keys_are_stable(report):
    # schema 1 as first published, plus additions (never a rename): each problem's fix, the patch counts, the
    # host-dedup section (which pools run deduplicated, and why not)
    assert set(report) == SCHEMA_1 | {"problem_details", "patch_counts", "host_dedup"}
    assert report["l3"] == {"active": False}
    assert set(report["hardware"]) == {"cuda_available", "gpus", "fp4_megamoe", "hugepages", "l3_paths", "megamoe",
                                       "cpu_serve", "l3_checksum", "gpu_bringup"}
    for f in report["features"]:
        assert set(f) == {"name", "title", "active", "available", "why_unavailable"}
    assert report["hardware"]["fp4_megamoe"]["possible"] is False  # no GPU here: the reason says so
    assert report["hardware"]["fp4_megamoe"]["why"]


def test_applied_and_active_are_reported_separately(report):
    cg = next(f for f in report["features"] if f["name"] == "cg_mem")
    assert cg["active"] is False  # applied (its patches are in) but nobody switched it on


def test_enabled_feature_that_cannot_work_exits_nonzero(tmp_path):
    l3cfg = pytest.importorskip("sglang_glm_ext.l3.config")
    cfg = tmp_path / "l3.toml"
    # require_plp on a disk the operator declared unsafe: L3 cannot start, and doctor says why.
    cfg.write_text('require_plp = true\nplp = "assume_unsafe"\n' + l3cfg.example_config(str(tmp_path / "disk"))
                   .replace("require_plp = false", "").replace('plp = "auto"', ""))
    proc = doctor("--json", "--enable-cp-l3", "--cp-l3-config", str(cfg))
    assert proc.returncode == 1
    rep = json.loads(proc.stdout)
    assert any("require_plp" in p for p in rep["problems"]), rep["problems"]
    assert rep["hardware"]["l3_paths"] and isinstance(rep["hardware"]["l3_paths"][0]["o_direct"], bool)  # probed


def test_l3_section_shows_backend_class_extra_config_and_state(tmp_path):
    l3cfg = pytest.importorskip("sglang_glm_ext.l3.config")
    cfg = l3cfg.write_example_config(str(tmp_path / "l3"))
    proc = doctor("--json", "--enable-cp-l3", "--cp-l3-config", cfg)
    assert proc.returncode == 0, proc.stdout[-2000:]
    l3 = json.loads(proc.stdout)["l3"]
    assert l3["backend_class"] == "sglang_glm_ext.l3.hicache.backend.L3HiCacheStorage"
    assert l3["extra_config"]["backend_name"] == "sglang_glm_ext.l3" and l3["extra_config"]["interface_v1"] == 1
    assert l3["state"]["deployment_id"] == "example" and l3["state"]["index"]["exists"] is False
    text = doctor("-v", "--enable-cp-l3", "--cp-l3-config", cfg).stdout
    assert "L3 backend: sglang_glm_ext.l3.hicache.backend.L3HiCacheStorage" in text and "extra config:" in text


def test_kill_switch_shows_disabled_plugin():
    proc = doctor("--json", env={"SGLANG_GLM_EXT_DISABLE": "1"})
    rep = json.loads(proc.stdout)
    assert rep["plugin"]["disabled"] is True and rep["patches"] == []


def test_text_output_is_a_short_summary_and_verbose_lists_patches(report):
    proc = doctor()
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert len(lines) <= 8 + len(report["features"]), proc.stdout  # a screen tall: no patch or hardware rows
    assert lines[-1] == "OK" and "[applied]" not in proc.stdout and "hugepages 2 MB" not in proc.stdout
    for f in report["features"]:  # one line per feature with its verdict
        assert sum(ln.startswith(f"  {f['name']} ") for ln in lines) == 1, f["name"]
    verbose = doctor("-v")
    assert verbose.returncode == 0
    assert "[applied] flags.cli_group" in verbose.stdout and "L3 checksum: xxhash" in verbose.stdout
    assert verbose.stdout.splitlines()[-1] == "OK"


def test_a_bad_l3_disk_path_is_one_problem_before_anything_loads(tmp_path):
    """Before, a disk path under a regular file passed doctor (exit 0) and the launch died at attach."""
    from sglang_glm_ext.l3.config import write_example_config

    cfg = write_example_config(str(tmp_path / "l3"))
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    text = open(cfg).read().replace(f'"{tmp_path}/l3/disk0"', f'"{blocker}/disk0"')
    open(cfg, "w").write(text)
    proc = doctor("--enable-cp-l3", "--cp-l3-config", cfg)
    assert proc.returncode == 1, proc.stdout
    block = proc.stdout.split("PROBLEMS:\n", 1)[1].splitlines()
    assert len(block) == 2 and block[0].startswith(f"  - launch refused: --cp-l3-config {cfg}: disks[0].path "), block
    assert f"{blocker} is not a directory; point disks[0].path at a directory" in block[0]
    assert block[1].startswith("    fix: ")
    missing = str(tmp_path / "none.toml")
    rep = json.loads(doctor("--json", "--enable-cp-l3", "--cp-l3-config", missing).stdout)
    assert rep["problems"] == [f"launch refused: --cp-l3-config {missing}: no such file; give the path of an L3 "
                               "config (sglang-glm-ext l3 example-config --dir DIR writes one)"]  # said once


def test_unsupported_sglang_is_reported_not_exited_even_with_feature_flags():
    # doctor's argv holds the flags it checks; on an unsupported SGLang it must still print its report.
    code = (
        "import sys, sglang_glm_ext.plugin.compat as c; c.installed_sglang_version = lambda: '0.5.99';"
        "from sglang_glm_ext.cli import main; sys.argv = ['sglang-glm-ext', 'doctor', '--json', "
        "'--log-cuda-graph-buffers']; sys.exit(main(sys.argv[1:]))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    proc = _PY.run(code=code, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    rep = json.loads(proc.stdout)
    assert rep["sglang"]["installed"] == "0.5.99" and rep["sglang"]["supported"] is False
    assert any("0.5.99" in p and "0.5.23" in p for p in rep["problems"])
    assert {p["state"] for p in rep["patches"] if p["tier"] == "feature"} == {"skipped"}


# ---- patches, availability, fixes ----

def test_demo_only_patches_are_counted_apart_not_as_missing(report):
    from sglang_glm_ext.declare import Tier
    from sglang_glm_ext.plugin.registry import PATCHES

    demo = sum(p.tier is Tier.DEMO for p in PATCHES)
    # the CPU serving stand-ins are skipped here (SGLANG_GLM_EXT_CPU_SERVE is not set): off by design, not missing
    cpu = sum(p.tier is Tier.CPU_SERVE for p in PATCHES)
    gpu = sum(p.tier is Tier.GPU_BRINGUP for p in PATCHES)
    serving = len(PATCHES) - demo - cpu - gpu
    assert demo and cpu and gpu and report["patch_counts"] == {
        "serving": serving, "applied": serving, "demo_only": demo, "cpu_serve_off": cpu, "gpu_bringup_off": gpu}
    brief = doctor("--brief")
    assert brief.returncode == 0
    assert brief.stdout.strip() == (f"sglang-glm-ext {report['plugin']['version']}: {serving}/{serving} serving "
                                    f"patches applied (+{demo} demo/test-only, not applied by design) "
                                    f"(+{cpu} CPU-serving stand-ins, off) (+{gpu} GPU bring-up, off), ok")
    text = doctor("-v").stdout
    assert f"patches: {serving}/{serving} serving patches applied (+{demo} demo/test-only, never applied in a server" \
        in text
    assert "[   demo] l3_demo.cpu_kvcacheio" in text and "[skipped]" not in text
    assert "[    cpu] cpu_serve." in text and "[    gpu] gpu_bringup." in text


def test_a_feature_this_node_cannot_serve_is_not_available(report):
    feats = {f["name"]: f for f in report["features"]}
    # no GPU on this machine: MegaMoE has no kernel to run, CUDA-graph attribution no graph to attribute
    assert feats["megamoe"]["available"] is False and "no MegaMoE kernel" in feats["megamoe"]["why_unavailable"]
    assert feats["cg_mem"]["available"] is False and "CUDA GPU" in feats["cg_mem"]["why_unavailable"]
    assert feats["l3"]["available"] is True and feats["hugepages"]["available"] is True  # CPU-able
    assert report["ok"] is True  # unavailable but not switched on: not a problem


def test_every_problem_carries_a_fix(tmp_path):
    proc = doctor("--json", "--log-cuda-graph-buffers", "--moe-a2a-backend", "megamoe",
                  "--cp-l3-config", str(tmp_path / "none.toml"), env={"SGLANG_HUGEPAGE_SIZE": "3MB"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    rep = json.loads(proc.stdout)
    details = rep["problem_details"]
    assert [d["problem"] for d in details] == rep["problems"] and len(details) >= 4
    for d in details:
        assert d["fix"].strip() and d["source"], d
    by_source = {d["source"] for d in details}
    assert {"plugin", "megamoe", "hugepages", "launch", "l3"} <= by_source, details
    cg = next(d for d in details if "cg_mem" in d["problem"])
    assert "--log-cuda-graph-buffers" in cg["fix"]
    text = doctor("--log-cuda-graph-buffers", "--moe-a2a-backend", "megamoe").stdout
    block = text.split("PROBLEMS:\n", 1)[1].splitlines()
    assert len(block) >= 4 and all(
        a.startswith("  - ") and b.startswith("    fix: ") for a, b in zip(block[::2], block[1::2])), block


def test_sglang_arguments_are_checked_against_sglangs_choices():
    proc = doctor("--json", "--moe-a2a-backend", "bogus")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    rep = json.loads(proc.stdout)
    (problem,) = rep["problems"]
    assert problem.startswith("launch: argument --moe-a2a-backend: invalid choice: 'bogus' (choose from")
    assert "'megamoe'" in problem  # SGLang's own list, as its parser words it
    assert next(f for f in rep["features"] if f["name"] == "megamoe")["active"] is False


def test_the_choices_are_sglangs_live_list_not_a_copy():
    """A plugin may add choices through SGLang's own add_*_choices: doctor accepts what SGLang then accepts."""
    from sglang.srt.arg_groups import choices
    from sglang_glm_ext.plugin.doctor import _check_sglang_options, _Problems

    def check(value):
        problems = _Problems()
        launch = {"moe_runner_backend": value}
        _check_sglang_options(launch, problems)
        return problems.texts(), launch

    assert check("glm_ext_test_backend")[0]  # not a choice yet
    if "glm_ext_test_backend" not in choices.MOE_RUNNER_BACKEND_CHOICES:
        choices.add_moe_runner_backend_choices(["glm_ext_test_backend"])
    try:
        assert check("glm_ext_test_backend") == ([], {"moe_runner_backend": "glm_ext_test_backend"})
    finally:
        choices.MOE_RUNNER_BACKEND_CHOICES.remove("glm_ext_test_backend")


# ---- a launch's whole command line ----

def test_doctor_checks_exactly_the_arguments_of_a_launch_line(tmp_path):
    from sglang_glm_ext.l3.config import write_example_config

    cfg = write_example_config(str(tmp_path / "l3"))
    proc = doctor("--json", "--", "python", "-m", "sglang.launch_server", "--model-path", "zai-org/GLM-5",
                  "--tp", "8", "--enable-hierarchical-cache", "--enable-cp-l3", "--cp-l3-config", cfg,
                  "--moe-a2a-backend", "megamoe", "--hicache-size", "100")
    assert proc.returncode == 1, proc.stderr[-2000:]
    rep = json.loads(proc.stdout)
    assert rep["launch"]["entry"] == "python -m sglang.launch_server" and rep["launch"]["parsed"] is True
    assert rep["launch"]["argv"][:2] == ["--model-path", "zai-org/GLM-5"]
    feats = {f["name"]: f["active"] for f in rep["features"]}
    assert feats["l3"] is True and feats["megamoe"] is True and feats["cg_mem"] is False
    assert rep["l3"]["active"] is True and rep["l3"]["config"] == cfg
    # the only problem: this CPU node runs no MegaMoE kernel (the L3 config and the arguments are fine)
    (problem,) = rep["problems"]
    assert problem.startswith("--moe-a2a-backend megamoe: no MegaMoE kernel can run on this node")
    # the line's --hicache-size and tp reach the hugepage part (SGLANG_HUGEPAGE_SIZE unset: nothing to judge)
    fit = rep["hardware"]["hugepages"]["fit"]
    assert (fit["hicache_size_gb"], fit["ranks_per_node"], fit["fits"]) == (100, 8, None)
    assert fit["ranks_source"] == "the launch: tp*pp*dp / nnodes"


def test_a_launch_line_sglang_would_refuse_is_a_problem_with_sglangs_message(tmp_path):
    proc = doctor("--json", "--", "SGLANG_HUGEPAGE_SIZE=3MB", "sglang", "serve", "zai-org/GLM-5",
                  "--enable-hierarchical-cache", "--enable-cp-l3")
    assert proc.returncode == 1, proc.stderr[-2000:]
    rep = json.loads(proc.stdout)
    assert rep["launch"]["env"] == {"SGLANG_HUGEPAGE_SIZE": "3MB"} and rep["launch"]["entry"] == "sglang serve"
    texts = rep["problems"]
    refused = [t for t in texts if t.startswith("launch refused: --enable-cp-l3 needs --cp-l3-config PATH")]
    assert len(refused) == 1 and not any(t.startswith("--enable-cp-l3 needs") for t in texts), texts  # said once
    assert any(t.startswith("hugepages: SGLANG_HUGEPAGE_SIZE='3MB'") for t in texts), texts  # the line's env
    bad = doctor("--json", "--", "python3", "-m", "sglang.launch_server", "--model-path", "m",
                 "--moe-a2a-backend", "bogus", "--no-such-flag")
    rep = json.loads(bad.stdout)
    assert bad.returncode == 1 and rep["launch"]["parsed"] is False
    (problem,) = rep["problems"]
    assert problem.startswith("launch: ") and ("bogus" in problem or "--no-such-flag" in problem)


def test_a_launch_line_is_the_whole_launch_not_mixed_with_doctor_options():
    mixed = doctor("--moe-a2a-backend", "megamoe", "--", "--model-path", "m")
    assert mixed.returncode == 2 and "put them in the launch line" in mixed.stderr
    other = doctor("--", "vllm", "serve", "m")
    assert other.returncode == 2 and "cannot read 'vllm' as a launch" in other.stderr
