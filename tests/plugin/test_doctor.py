"""`sglang-glm-ext doctor` reports the live state and exits non-zero when something enabled cannot work."""

import json
import os
import subprocess
import sys

import pytest


def doctor(*args, env=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "sglang_glm_ext.cli", "doctor", *args],
                          capture_output=True, text=True, env=full_env, timeout=300)
    return proc


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
    # SGLANG_GLM_EXT_CPU_SERVE=1 (tests/cpu_serve/); everything else is.
    assert {p["state"] for p in report["patches"] if p["tier"] not in ("demo", "cpu_serve")} == {"applied"}
    assert {p["state"] for p in report["patches"] if p["tier"] in ("demo", "cpu_serve")} == {"skipped"}


def test_json_schema_keys_are_stable(report):
    assert set(report) == {"schema", "ok", "problems", "plugin", "sglang", "versions", "patches", "features",
                           "hardware", "l3"}
    assert report["l3"] == {"active": False}
    assert set(report["hardware"]) == {"cuda_available", "gpus", "fp4_megamoe", "hugepages", "l3_paths", "megamoe",
                                       "cpu_serve"}
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
    assert rep["hardware"]["l3_paths"] and rep["hardware"]["l3_paths"][0]["o_direct"] in (True, False, None)


def test_l3_section_shows_backend_class_extra_config_and_state(tmp_path):
    l3cfg = pytest.importorskip("sglang_glm_ext.l3.config")
    cfg = l3cfg.write_example_config(str(tmp_path / "l3"))
    proc = doctor("--json", "--enable-cp-l3", "--cp-l3-config", cfg)
    assert proc.returncode == 0, proc.stdout[-2000:]
    l3 = json.loads(proc.stdout)["l3"]
    assert l3["backend_class"] == "sglang_glm_ext.l3.hicache.backend.L3HiCacheStorage"
    assert l3["extra_config"]["backend_name"] == "sglang_glm_ext.l3" and l3["extra_config"]["interface_v1"] == 1
    assert l3["state"]["deployment_id"] == "example" and l3["state"]["index"]["exists"] is False
    text = doctor("--enable-cp-l3", "--cp-l3-config", cfg).stdout
    assert "L3 backend: sglang_glm_ext.l3.hicache.backend.L3HiCacheStorage" in text and "extra config:" in text


def test_kill_switch_shows_disabled_plugin():
    proc = doctor("--json", env={"SGLANG_GLM_EXT_DISABLE": "1"})
    rep = json.loads(proc.stdout)
    assert rep["plugin"]["disabled"] is True and rep["patches"] == []


def test_text_output_lists_patches():
    proc = doctor()
    assert proc.returncode == 0
    assert "[applied] flags.cli_group" in proc.stdout


def test_unsupported_sglang_is_reported_not_exited_even_with_feature_flags():
    # doctor's argv holds the flags it checks; on an unsupported SGLang it must still print its report.
    code = (
        "import sys, sglang_glm_ext.plugin.compat as c; c.installed_sglang_version = lambda: '0.5.99';"
        "from sglang_glm_ext.cli import main; sys.argv = ['sglang-glm-ext', 'doctor', '--json', "
        "'--log-cuda-graph-buffers']; sys.exit(main(sys.argv[1:]))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    rep = json.loads(proc.stdout)
    assert rep["sglang"]["installed"] == "0.5.99" and rep["sglang"]["supported"] is False
    assert any("0.5.99" in p and "0.5.23" in p for p in rep["problems"])
    assert {p["state"] for p in rep["patches"] if p["tier"] == "feature"} == {"skipped"}
