"""When the GPU bring-up tier may run, and its refusals: register() puts the stand-in on sys.path only with the tier
on and its checks passed (a CUDA GPU, no real sgl_kernel, SGLang's settings for a node without one, not the CPU
mode too), names every stand-in in one warning, and a launch elsewhere stops with one line naming the fix."""

import importlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

from sglang_glm_ext.declare import PluginFlagError
from sglang_glm_ext.gpu_bringup import feature, gate, kernels

ON = {"SGLANG_GLM_EXT_GPU_BRINGUP": "1", "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",
      "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1"}


@pytest.fixture
def here(monkeypatch):
    """This process as a GPU node without sgl_kernel: a CUDA GPU visible, the tier's settings in place."""
    monkeypatch.setattr(gate, "cuda_gpu", lambda: "")
    for k, v in ON.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SGLANG_GLM_EXT_CPU_SERVE", raising=False)
    # activate() may insert the stand-in's folder; on the GPU machine served.sh has it on PYTHONPATH already
    monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.abspath(p or os.getcwd()) != gate.SHADOW_DIR])


def test_a_gpu_node_without_sgl_kernel_activates_the_standin(here):
    assert gate.refusal_reason() == "" and gate.activate() == ""
    assert sys.path[0] == gate.SHADOW_DIR and gate.standin_reachable()
    assert gate.activate() == "" and sys.path.count(gate.SHADOW_DIR) == 1  # idempotent


def test_each_refusal_names_its_fix(here, monkeypatch, tmp_path):
    monkeypatch.delenv("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND")
    why = gate.refusal_reason()
    assert why.startswith("SGLang needs, without sgl-kernel: SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python (the "
                          "bundled Rust radix-tree core") and "SKIP_SGL_KERNEL" not in why
    monkeypatch.setenv("SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK", "0")
    assert "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 (launch_server asserts" in gate.refusal_reason()
    assert gate.activate() == gate.refusal_reason() and not gate.standin_reachable()
    monkeypatch.setenv("SGLANG_GLM_EXT_CPU_SERVE", "1")
    assert "exclude each other" in gate.refusal_reason()
    monkeypatch.delenv("SGLANG_GLM_EXT_CPU_SERVE")
    monkeypatch.setattr(gate, "cuda_gpu", lambda: "no CUDA GPU is visible to torch")
    assert gate.refusal_reason() == ("no CUDA GPU is visible to torch; on a machine without a CUDA GPU use the CPU "
                                     "serving mode (SGLANG_GLM_EXT_CPU_SERVE=1)")
    monkeypatch.setattr(gate, "cuda_gpu", lambda: "")
    (tmp_path / "sgl_kernel").mkdir()
    (tmp_path / "sgl_kernel" / "__init__.py").write_text("REAL = True\n")
    # into the fixture's copy of sys.path (monkeypatch.syspath_prepend would restore the copy's contents at the end)
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    assert "a real sgl_kernel is installed (" + str(tmp_path) in gate.refusal_reason()
    monkeypatch.setenv("SGLANG_GLM_EXT_GPU_BRINGUP", "0")
    assert gate.activate() == "SGLANG_GLM_EXT_GPU_BRINGUP is not set"


def test_no_cuda_here_is_a_refusal_not_a_crash():
    import torch

    want = "" if torch.cuda.is_available() else "no CUDA GPU is visible to torch"  # this CPU machine: the refusal
    assert gate.cuda_gpu() == want


def test_the_warning_names_every_standin_and_says_what_it_is():
    line = gate.warning_line()
    assert "\n" not in line and "not SGLang's kernels" in line and "bring-up and tests only" in line
    assert all(name in line for name in kernels.STANDIN_NAMES)


def test_validate_raises_the_refusal_for_the_launch(here, monkeypatch):
    feature.validate({})
    monkeypatch.setattr(gate, "cuda_gpu", lambda: "no CUDA GPU is visible to torch")
    with pytest.raises(PluginFlagError, match="^SGLANG_GLM_EXT_GPU_BRINGUP=1 refused: no CUDA GPU"):
        feature.validate({})
    monkeypatch.setenv("SGLANG_GLM_EXT_GPU_BRINGUP", "maybe")
    with pytest.raises(PluginFlagError, match="SGLANG_GLM_EXT_GPU_BRINGUP='maybe'"):
        feature.validate({})


PROBE = textwrap.dedent("""
    import json, logging, sys
    __PRE__
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from sglang.srt.plugins import load_plugins
    load_plugins()
    import sglang_glm_ext as plugin
    from sglang_glm_ext.gpu_bringup import gate
    led = plugin.ledger_state()
    states = {k: [v.state.value, v.detail] for k, v in led.status.items() if v.patch.tier.value == "gpu_bringup"}
    print("RESULT" + json.dumps({"reachable": gate.standin_reachable(), "states": states}))
""")


def _probe(env, pre=""):
    proc = subprocess.run([sys.executable, "-c", PROBE.replace("__PRE__", pre)], capture_output=True, text=True,
                          env=env, timeout=600)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert line, proc.stderr[-4000:]
    return json.loads(line[-1][6:]), proc.stderr


def _env(**extra):
    return {**{k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}, **extra}


@pytest.mark.slow
def test_register_on_a_gpu_node_applies_the_tier_and_warns_once_elsewhere_skips_it_with_the_reason():
    out, err = _probe(_env(**ON))  # this CPU machine: refused
    assert out["reachable"] is False and {s for s, _ in out["states"].values()} == {"skipped"}
    assert all("GPU bring-up tier off: no CUDA GPU is visible" in d for _, d in out["states"].values())
    assert "sgl_kernel in this process is the plugin's stand-in" not in err
    # The tier's own CUDA check answers "a GPU" (faking torch.cuda itself would make SGLang's platform probe ask the
    # missing device its name)
    fake_gpu = "import sglang_glm_ext.gpu_bringup.gate as g; g.cuda_gpu = lambda: ''"
    out, err = _probe(_env(**ON), pre=fake_gpu)
    assert out["reachable"] is True and {s for s, _ in out["states"].values()} == {"applied"}, out["states"]
    assert err.count("sgl_kernel in this process is the plugin's stand-in") == 1, err[-3000:]


@pytest.mark.slow
def test_a_launch_where_the_tier_cannot_run_is_one_line_before_the_model_loads():
    proc = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--model-path", "/nonexistent/model",
                           "--load-format", "dummy"], capture_output=True, text=True, env=_env(**ON), timeout=600)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert err[-1].startswith("sglang-glm-ext: SGLANG_GLM_EXT_GPU_BRINGUP=1 refused: no CUDA GPU"), err[-3:]
