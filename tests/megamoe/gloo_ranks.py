"""Run a megamoe harness (miss_harness.py, glm4_block_harness.py) as WORLD gloo ranks, one OS process each, forked
from a zygote that imported torch and SGLang once (tests/rank_zygote.py), instead of WORLD fresh interpreters.

The harnesses install their fakes (deep_gemm in sys.modules, the platform) before importing SGLang's MoE modules;
PRELOAD holds only modules that never ask for deep_gemm while importing (checked with an import hook that refuses
it: none of them asked) and read no setting a harness makes (SGLang's envs are read when used, not at import).
"""

from __future__ import annotations

import json
import os
import pathlib
import socket

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]

PRELOAD = ["torch", "transformers", "sglang.srt.server_args", "sglang.srt.runtime_context",
           "sglang.srt.distributed.parallel_state", "sglang.srt.layers.moe.utils", "sglang.srt.layers.moe.topk",
           "sglang.srt.layers.moe.fused_moe_triton.layer", "sglang.srt.layers.quantization.fp8",
           "sglang.srt.models.glm4_moe", "sglang.srt.models.deepseek_v2"]


def zygote():
    """A zygote for the harnesses, with their environment: no SGLANG_* setting of the caller's, the repo on the
    path."""
    from rank_zygote import Zygote

    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return Zygote(PRELOAD, env=env, cwd=str(HERE))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(z, tmp, script, args, world, timeout) -> list[dict]:
    """Run ``script`` as ``world`` ranks (``args(rank, port)`` is each one's argv, its last item the JSON result
    path); a run that does not finish within ``timeout`` seconds fails the test (every rank killed). Returns each
    rank's result, asserting it wrote one without an error."""
    port = str(free_port())
    procs = [z.spawn(path=HERE / script, argv=args(r, port), log=tmp / f"{script}.log{r}") for r in range(world)]
    try:
        for p in procs:
            p.wait(timeout)
    except TimeoutError:
        pytest.fail(f"{script} with {world} ranks did not finish in {timeout} s (a rank waiting on the others?)")
    finally:
        for p in procs:
            p.kill()
    out = []
    for r in range(world):
        f = pathlib.Path(args(r, port)[-1])
        assert f.exists(), f"rank {r} wrote no result:\n{procs[r].read_log()[-4000:]}"
        res = json.loads(f.read_text())
        assert "error" not in res, f"rank {r} failed:\n{res['error']}"
        out.append(res)
    return out
