"""The SGLang modules the plugin touches import in this environment, and SGLang's native page hash builds.

On a CPU machine SGLang is installed without its dependency tree (requirements/sglang-cpu-deps.txt fills in
what these modules need); a dependency missing from that file fails here, by module name.
"""

import importlib

import pytest

from sglang_glm_ext.plugin.registry import PATCHES

MODULES = sorted(
    {
        "sglang.srt.plugins",
        "sglang.srt.server_args",
        "sglang.srt.entrypoints.engine",
        "sglang.srt.mem_cache.hicache_storage",
        "sglang.srt.mem_cache.storage.backend_factory",
        "sglang.srt.mem_cache.unified_radix_cache",
        "sglang.srt.managers.cache_controller",
        "sglang.srt.managers.scheduler",
        "sglang.srt.disaggregation.decode",
        "sglang.srt.speculative.eagle_worker_v2",
        "sglang.srt.observability.metrics_collector",
        "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
        "sglang.srt.mem_cache.utils",
    }
    | {p.target.rsplit(".", 2)[0] if p.target.split(".")[-2][:1].isupper() else p.target.rsplit(".", 1)[0]
       for p in PATCHES}
)


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)


def test_native_page_hash_builds_and_chains(tmp_path, monkeypatch):
    # HiCache storage keys are SGLang's SHA-256 page chain, computed by a JIT-built C++ extension (needs a
    # compiler and -lcrypto); L3 keys are exactly these strings.
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    from sglang.srt.mem_cache.utils import get_hash_str

    tokens = list(range(128))
    hashes = get_hash_str(tokens, None, page_size=64)
    assert len(hashes) == 2 and all(len(h) == 64 for h in hashes)
    # The chain: page 2's hash depends on page 1's, so a different first page changes both.
    other = get_hash_str([7] + tokens[1:], None, page_size=64)
    assert other[0] != hashes[0] and other[1] != hashes[1]
    assert get_hash_str(tokens, None, page_size=64) == hashes
