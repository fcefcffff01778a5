"""The host-dedup tests' rank zygote: one forked server per test module that preloads SGLang's HiCache stack, so
each multi-process run forks its ranks instead of importing SGLang again."""

import os
import pathlib

import pytest

from rank_zygote import Zygote

REPO = str(pathlib.Path(__file__).resolve().parents[2])
PRELOAD = ["torch", "torch.distributed", "sglang.srt.server_args", "sglang.srt.runtime_context",
           "sglang.srt.plugins", "sglang.srt.mem_cache.unified_radix_cache", "sglang.srt.mem_cache.memory_pool",
           "sglang.srt.mem_cache.allocator.paged", "sglang.srt.mem_cache.cache_init_params",
           "sglang.srt.mem_cache.hicache_storage", "sglang.srt.mem_cache.utils", "sglang.srt.mem_cache.mla_host_dedup",
           "sglang_glm_ext", "sglang_glm_ext.l3.demo.stack", "sglang_glm_ext.l3.demo.cpu_standins",
           "sglang_glm_ext.l3.hicache.backend"]


@pytest.fixture(scope="module")
def zygote():
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with Zygote(PRELOAD, env=env, cwd=REPO) as z:
        yield z
