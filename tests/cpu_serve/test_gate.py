"""Reachability of the stand-in and the mode's refusals: register() puts it on sys.path only with the mode on and its
checks passed; spawned children inherit it; a launch is refused with one line (no traceback) where an accelerator
is visible, a real sgl_kernel is installed, SGLANG_USE_CPU_ENGINE is missing or --device is not cpu."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sglang_glm_ext.cpu_serve import gate

PROBE = textwrap.dedent("""
    import json, sys
    __PRE__
    from sglang.srt.plugins import load_plugins
    load_plugins()
    import sglang_glm_ext as plugin
    from sglang_glm_ext.cpu_serve import gate
    led = plugin.ledger_state()
    states = {k: [v.state.value, v.detail] for k, v in led.status.items() if v.patch.tier.value == "cpu_serve"}
    out = {"reachable": gate.standin_reachable(), "first": sys.path[0] == gate.SHADOW_DIR, "states": states}
    if __SPAWN__:
        import multiprocessing as mp
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=gate._probe_child, args=(q,))
        p.start(); out["child"] = q.get(timeout=120); p.join(60)
    print("RESULT" + json.dumps(out))
""")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env.update(extra)
    return env


def probe(env, pre="", spawn=False):
    code = PROBE.replace("__PRE__", pre).replace("__SPAWN__", repr(spawn))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert line, proc.stderr[-4000:]
    return json.loads(line[-1][6:])


ON = {"SGLANG_GLM_EXT_CPU_SERVE": "1", "SGLANG_USE_CPU_ENGINE": "1"}


@pytest.mark.slow
def test_mode_off_the_standin_is_unreachable_and_its_patches_skipped():
    out = probe(_env())
    assert out["reachable"] is False
    assert {s for s, _ in out["states"].values()} == {"skipped"}
    assert all("SGLANG_GLM_EXT_CPU_SERVE is not set" in d for _, d in out["states"].values())


@pytest.mark.slow
def test_mode_on_register_puts_the_standin_first_and_a_spawned_child_imports_it():
    out = probe(_env(**ON), spawn=True)
    assert out["reachable"] and out["first"]
    assert {s for s, _ in out["states"].values()} == {"applied"}, out["states"]
    # The scheduler's situation: a spawn child imports sgl_kernel before anything of the plugin runs in it.
    assert out["child"]["standin"] is True and out["child"]["first"] is True


@pytest.mark.slow
def test_a_visible_gpu_keeps_the_standin_unreachable():
    pre = "import torch; torch.cuda.is_available = lambda: True"
    out = probe(_env(**ON), pre=pre)
    assert out["reachable"] is False
    assert all("cuda device is visible" in d for _, d in out["states"].values())


@pytest.mark.slow
def test_a_real_sgl_kernel_is_never_shadowed(tmp_path):
    (tmp_path / "sgl_kernel").mkdir()
    (tmp_path / "sgl_kernel" / "__init__.py").write_text("REAL = True\n")
    out = probe(_env(**ON, PYTHONPATH=str(tmp_path)))
    assert out["reachable"] is False
    assert all("real sgl_kernel is installed" in d and str(tmp_path) in d for _, d in out["states"].values())


def test_refusal_reasons_in_process(monkeypatch, tmp_path):
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    assert gate.refusal_reason() == ""
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE")
    assert "SGLANG_USE_CPU_ENGINE=1" in gate.refusal_reason()
    assert gate.device_refusal("cpu") == "" and "--device cuda" in gate.device_refusal("cuda")
    assert "--device auto" in gate.device_refusal(None)


def _launch(env, *args):
    return subprocess.run([sys.executable, "-m", "sglang.launch_server", "--model-path", "/nonexistent/model",
                           "--load-format", "dummy", *args], capture_output=True, text=True, env=env, timeout=600)


def _one_line_refusal(proc, needle):
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert err and err[-1].startswith("sglang-glm-ext: SGLANG_GLM_EXT_CPU_SERVE=1 refused:") and needle in err[-1], \
        proc.stderr[-3000:]


@pytest.mark.slow
def test_launch_without_device_cpu_or_cpu_engine_is_one_line_before_the_model_loads():
    _one_line_refusal(_launch(_env(**ON), "--device", "cuda"), "serves only --device cpu")
    _one_line_refusal(_launch(_env(SGLANG_GLM_EXT_CPU_SERVE="1"), "--device", "cpu"), "SGLANG_USE_CPU_ENGINE=1")
