"""`sglang-glm-ext l3 bench` runs end to end on a tiny data set and prints every ratio row (numbers are not
asserted here: speed targets live in the benchmark's own output, measured side by side)."""

import json
import subprocess
import sys


def test_bench_smoke(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_glm_ext.cli", "l3", "bench", "--dir", str(tmp_path / "b"), "--size-gb",
         "0.02", "--repeats", "2", "--page-bytes", "1048576", "--skip-hicachefile", "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for row in ("spill->durable vs raw O_DIRECT write", "reload (O_DIRECT) vs raw O_DIRECT read",
                "batched exists", "peak staging vs cap"):
        assert row in proc.stdout
    data = json.loads(out.read_text())
    rows = data if isinstance(data, list) else data["results"]
    (r,) = rows
    # Both sides were timed once per repeat, in alternating order.
    assert len(r["raw_write_s"]) == len(r["spill_s"]) == len(r["raw_read_s"]) == len(r["reload_s"]) == 2
    assert r["staging_peak_bytes"] <= r["staging_cap_bytes"]
