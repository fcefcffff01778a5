"""A command-line launch with a bad hugepage setting stops with the plugin's message alone, not a traceback.

The launch runs in a subprocess through SGLang's own steps of `python -m sglang.launch_server`: load_plugins(),
prepare_server_args(argv) on a tiny GLM config (`--load-format dummy`, no weights), then
Engine._launch_subprocesses, which http_server.launch_server calls first and where ServerArgs.check_server_args
(the hugepage launch check) runs before any process is spawned. `sglang.launch_server` itself cannot be run on
this CPU environment yet: its run_server imports the HTTP server, which needs `jsonschema`, not in
requirements/sglang-cpu-deps.txt. The spawn functions raise, so a launch that got past the check says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

LAUNCH = r"""
import os, sys
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import prepare_server_args
from sglang.srt.utils import kill_process_tree
from sglang.srt.entrypoints.engine import Engine

def never(*args, **kwargs):
    raise RuntimeError("LAUNCHED PAST THE HUGEPAGE CHECK")

load_plugins()
server_args = prepare_server_args(sys.argv[1:])
try:
    Engine._launch_subprocesses(server_args, never, never, never)
finally:
    kill_process_tree(os.getpid(), include_parent=False)
"""

TINY_GLM = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": 64, "intermediate_size": 128,
    "moe_intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1,
    "topk_group": 1, "first_k_dense_replace": 1, "routed_scaling_factor": 1.0, "norm_topk_prob": True,
    "partial_rotary_factor": 0.5, "vocab_size": 512, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
    "hidden_act": "silu", "torch_dtype": "bfloat16",
}


@pytest.mark.slow
def test_unknown_hugepage_size_stops_a_command_line_launch_with_one_line(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_GLM))
    script = tmp_path / "launch.py"
    script.write_text(LAUNCH)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env["SGLANG_HUGEPAGE_SIZE"] = "3MB"
    proc = subprocess.run(
        [sys.executable, str(script), "--model-path", str(model), "--load-format", "dummy", "--device", "cpu",
         "--enable-hierarchical-cache"],
        capture_output=True, text=True, env=env, timeout=540)
    err = proc.stderr
    assert "LAUNCHED PAST THE HUGEPAGE CHECK" not in err, err[-3000:]
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith("sglang-glm-ext: SGLANG_HUGEPAGE_SIZE='3MB' is not a hugepage size"), last
    assert "set SGLANG_HUGEPAGE_SIZE to 2MB or 1GB" in last and "or unset it" in last, last
    assert sum("SGLANG_HUGEPAGE_SIZE='3MB'" in line for line in err.splitlines()) == 1  # said once, on one line
