"""Bad input at launch through SGLang's real CLI: exit non-zero with one line and no traceback, before the model
loads (no scheduler starts). The budget-above-free-space check belongs to the L3 engine-defects issue (20)."""

import os
import subprocess
import sys

import pytest

from sglang_glm_ext.cpu_serve import served

from .conftest import l3_args, l3_config

pytestmark = [pytest.mark.server, pytest.mark.timeout(900)]


def _launch(model, cfg, tmp_path):
    env = {**os.environ, **served.CPU_SERVE_ENV}
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--host", "127.0.0.1", "--port",
           str(served.free_port()), *served.CPU_BASE_ARGS, *l3_args(cfg)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400, cwd=str(tmp_path))


def _refused_in_one_line(proc, needle):
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert "Load weight" not in text and "Scheduler" not in text, "refused only after the model started loading"
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sglang-glm-ext: ") and needle in last, text[-3000:]


@pytest.fixture
def ro_dir(tmp_path):
    """A directory on a read-only filesystem (root can write anywhere else); skipped where mounting is not allowed."""
    path = tmp_path / "ro"
    path.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], capture_output=True)
    if proc.returncode != 0:
        if os.geteuid() != 0:
            path.chmod(0o500)
            yield path
            path.chmod(0o700)
            return
        pytest.skip(f"cannot mount a read-only tmpfs here: {proc.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], capture_output=True)


@pytest.mark.parametrize("case", ["missing", "malformed"])
def test_missing_or_malformed_config(glm5_model, tmp_path, case):
    cfg = tmp_path / "l3.toml"
    if case == "malformed":
        cfg.write_text("deployment_id = \n[[disks]\npath = 3\n")
    _refused_in_one_line(_launch(glm5_model, str(cfg), tmp_path), "--cp-l3-config")


def test_unwritable_path(glm5_model, tmp_path, ro_dir):
    cfg = l3_config(str(tmp_path / "l3"), disk=str(ro_dir / "disk0"))
    _refused_in_one_line(_launch(glm5_model, cfg, tmp_path), "not writable")


def test_budget_above_free_space(glm5_model, tmp_path):
    # Needs issue 20's launch-time budget-vs-free-space check: a budget far above what this disk has free must stop
    # the launch (the message names the budget and the free space; the work path holds no such words).
    work = tmp_path / "budget"
    cfg = l3_config(str(work / "l3"), budget="100TiB")
    proc = _launch(glm5_model, cfg, tmp_path)
    _refused_in_one_line(proc, "budget")
    last = proc.stderr.strip().splitlines()[-1].replace(str(work), "")
    assert "free" in last and "cannot parse" not in last, last
