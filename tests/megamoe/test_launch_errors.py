"""Launch refusals reach the user as one line each, naming the fix (issue 22, defect 6).

Confirmed on 0.5.23 before the fix: `--moe-a2a-backend megamoe` on a machine without an SM90/SM100 GPU ended in
SGLang's own ValueError (arg_groups/mega_moe_hook.py:43-48) under a full traceback, and the fork's retired switch
set without megamoe ended in a traceback whose header said megamoe "would return wrong tokens".

Real: SGLang's `python -m sglang.launch_server` with the plugin loaded by SGLang's own entry-point machinery, on
this CPU (no GPU): resolution stops at the refusal, before anything is served.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from glm_configs import write_model_dir
from sglang_glm_ext.megamoe import guard, hooks


def launch(model_dir, *extra, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "DG_"))}
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--model-path", model_dir, "--device", "cpu",
                           "--skip-tokenizer-init", *extra], capture_output=True, text=True, env=env, timeout=300)
    out = proc.stdout + proc.stderr
    lines = [ln for ln in out.splitlines() if ln.startswith("sglang-glm-ext")]
    return proc.returncode, out, lines


@pytest.mark.slow
def test_megamoe_on_a_machine_without_its_gpu_is_one_line(tmp_path):
    rc, out, lines = launch(write_model_dir(tmp_path / "m"), "--moe-a2a-backend", "megamoe")
    assert rc == 1 and "Traceback" not in out, out[-3000:]
    assert len(lines) == 1, out[-3000:]
    assert "need an SM90 GPU" in lines[0] and "no CUDA GPU" in lines[0] and "drop --moe-a2a-backend megamoe" in lines[0]


@pytest.mark.slow
def test_retired_switch_without_megamoe_is_one_line_and_says_nothing_of_megamoe(tmp_path):
    rc, out, lines = launch(write_model_dir(tmp_path / "m"), env_extra={"SGLANG_OPT_USE_DEEPGEMM_MEGA_MOE": "1"})
    assert rc == 1 and "Traceback" not in out, out[-3000:]
    assert len(lines) == 1, out[-3000:]
    assert "SGLANG_OPT_USE_DEEPGEMM_MEGA_MOE='1' is a retired fork switch" in lines[0] and "unset it" in lines[0]
    assert "wrong tokens" not in out


class Record:
    def __init__(self, command):
        if command is not None:
            self._launch_command = command


def refuse(self):
    raise guard.MegaMoELaunchError("sglang-glm-ext megamoe: Glm4MoeForCausalLM: a; set --x\n"
                                   "sglang-glm-ext megamoe: Glm4MoeForCausalLM: b; set --y")


def test_command_line_launches_exit_with_the_lines_python_callers_keep_the_error():
    with pytest.raises(SystemExit) as exc:
        hooks.hook_resolve_once(refuse, Record(["--model-path", "m", "--moe-a2a-backend", "megamoe"]))
    assert str(exc.value).splitlines() == ["sglang-glm-ext megamoe: Glm4MoeForCausalLM: a; set --x",
                                           "sglang-glm-ext megamoe: Glm4MoeForCausalLM: b; set --y"]
    with pytest.raises(guard.MegaMoELaunchError):
        hooks.hook_resolve_once(refuse, Record("Engine(model_path='m', moe_a2a_backend='megamoe')"))
    with pytest.raises(guard.MegaMoELaunchError):
        hooks.hook_resolve_once(refuse, Record(None))
    with pytest.raises(ValueError, match="other"):  # anything else SGLang raises is untouched
        hooks.hook_resolve_once(lambda self: (_ for _ in ()).throw(ValueError("other")), Record(["x"]))
