"""`sglang-glm-ext demo` runs end to end on this CPU and fails loudly when bytes do not come back."""

import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_runs_every_phase_and_checks_bytes(sglang_python, tmp_path):
    # `sglang-glm-ext demo` in a process of its own (forked from a parent that imported SGLang only)
    proc = sglang_python.run(module="sglang_glm_ext.cli", timeout=900, env=dict(os.environ),
                             argv=["demo", "--requests", "2", "--pages", "2", "--layers", "8", "--dir",
                                   str(tmp_path / "w"), "--keep"])
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    for phase in ("write-back to L3", "L2 eviction", "prefetch from L3", "restart (cold_start=load)",
                  "prefetch after restart"):
        assert phase in out
    assert "8 pages durable" in out and "hits 256/256 tokens" in out and "GB/s" in out
    assert out.count("bytes exact after load-back") == 2 and out.rstrip().endswith("before and after the restart")
    assert (tmp_path / "w" / "l3.toml").exists()  # --keep leaves the slabs, index and config for fsck


def test_demo_refuses_where_a_gpu_is_visible():
    code = ("import torch, sys; torch.cuda.is_available = lambda: True;"
            "from sglang_glm_ext.cli import main; sys.exit(main(['demo']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "CUDA device is visible" in proc.stderr


@pytest.mark.slow
def test_demo_fails_when_a_page_claims_a_hit_without_its_bytes(sglang_python):
    # An engine that reports every reload as a hit but writes nothing: completion and hit counts look fine, the
    # byte check must still fail the demo.
    code = ("import sys; from sglang_glm_ext.l3.engine import store as s;"
            "s.L3Store.reload_into_layout = lambda self, kind, keys, layout, pages: [True] * len(keys);"
            "from sglang_glm_ext.cli import main;"
            "sys.exit(main(['demo', '--requests', '1', '--pages', '2', '--layers', '4']))")
    proc = sglang_python.run(code=code, env=dict(os.environ), timeout=900)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAILED" in proc.stdout and "DIFFER" in proc.stdout
