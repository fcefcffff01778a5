"""`sglang-glm-ext l3 bench` runs end to end on a tiny data set and prints every ratio row (numbers are not
asserted here: speed targets live in the benchmark's own output, measured side by side), and the A/B driver
runs the same bench file against two engines."""

import json
import os
import subprocess
import sys

import pytest

import l3kit

REPO = str(l3kit.REPO)


@pytest.mark.slow
def test_bench_smoke(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_glm_ext.cli", "l3", "bench", "--dir", str(tmp_path / "b"), "--size-gb",
         "0.02", "--repeats", "2", "--page-bytes", "1048576", "--skip-hicachefile", "--load-pages", "300",
         "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 3), proc.stderr[-3000:]  # 3: a target missed (tiny data, a shared machine)
    for row in ("spill->durable vs raw O_DIRECT write", "reload page-first vs raw read",
                "reload layer-first vs raw read", "reload layer-first single vs raw read",
                "CPU: vs raw read + xxh3 in place", "batched exists", "peak staging vs cap",
                "cold_start=load, 300 live pages"):
        assert row in proc.stdout, row
    data = json.loads(out.read_text())
    (r,) = data["results"]
    # Each side timed once per repeat (the layer-first reference once per read mode), next to what it is the
    # reference for; CPU beside every wall time; a paired ratio per repeat.
    for name, times in (("raw_write", 2), ("spill", 2), ("raw_read", 2), ("raw_read_xxh3_page_first", 2),
                        ("raw_read_xxh3_layer_first", 4), ("reload_page_first", 2), ("reload_layer_first", 2),
                        ("reload_layer_first_single", 2)):
        assert len(r[f"{name}_s"]) == len(r[f"{name}_cpu_s"]) == times, name
        assert r[f"{name}_cpu_s_per_gb"] > 0
    for name in ("page_first", "layer_first", "layer_first_single"):
        (a, b) = r[f"reload_{name}_paired"]
        assert set(a) == {"cpu_vs_raw_xxh3", "gbps_vs_raw", "gbps_vs_raw_xxh3"} and a["cpu_vs_raw_xxh3"] > 0
    assert r["staging_peak_bytes"] <= r["staging_cap_bytes"] and r["layers"] == 64
    assert r["layer_first_default"] == "vectored"
    assert data["load"]["pages"] == 300 and len(data["load"]["open_load_s"]) == 2


@pytest.mark.slow
def test_ab_driver_runs_the_bench_file_against_both_trees(tmp_path):
    out = tmp_path / "ab"
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmark", "l3_ab.py"), "--before", REPO, "--after", REPO,
         "--rounds", "1", "--out", str(out), "--", "--dir", str(tmp_path / "b"), "--size-gb", "0.01",
         "--repeats", "1", "--page-bytes", "1048576", "--skip-hicachefile"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "before0.json").exists() and (out / "after0.json").exists()
    table = (out / "ab.txt").read_text()
    assert "reload page-first CPU s/GB" in table and "/ raw read+xxh3 in place (target <= 1.2x)" in table


def test_the_engine_and_its_bench_import_without_torch_or_sglang():
    """scripts/gpu/l3_direct_ab.sh runs the bench on the GPU machine, which has torch but no SGLang (and may run it
    without either): the engine, the bench and fsck import neither."""
    code = ("import json, sys\n"
            "import sglang_glm_ext.l3.engine.store, sglang_glm_ext.l3.tools.bench, sglang_glm_ext.l3.tools.fsck\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'sglang'})))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == []
