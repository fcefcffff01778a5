"""Host-cache registration: no cudaHostRegister call over the ceiling, no chunk boundary inside a transfer unit.

Guards seed lines 297-321 (fork commit: one cudaHostRegister over >~1 TB fails on B300, and a cudaMemcpyBatchAsync
whose host range straddles two registrations fails, so the host cache must be split only where no copy crosses).
SGLang 0.5.23 carries this for page-first layouts (mem_cache/pool_host/common.py `_cuda_host_register` chunks at
`SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB`, rounded down to the page granularity the pool passes). A layer-first pool
passes no granularity and is registered in ONE call: the plugin patch `host_register.ceiling`
(sglang_glm_ext/host_register) refuses that at startup above `SGLANG_GLM_EXT_HOST_REGISTER_MAX_GB` with the size, the
ceiling and the fix. tests/host_register/test_plan.py holds the planner's property tests over every layout.

Runs SGLang's real `_cuda_host_register` against a fake cudart (records each registration) and a fake buffer that
reports a multi-TB size without allocating it. Real pinning and transfers need a GPU: GPU-marked test below.
"""

from __future__ import annotations

import pytest
import regression_mutants as rm
import torch

import sglang.srt.mem_cache.pool_host.common as common
from sglang_glm_ext.host_register.plan import GIB, HostRegisterPlanError, page_first_unit
from sglang_glm_ext.plugin.registry import PATCHES
from sglang_glm_ext.patching.ledger import State, apply_one, resolve_original

CEILING = 480 * GIB  # the plugin default (envs.HOST_REGISTER_MAX_GB)
# A GLM-5-like MLA host pool: 78 layers, 64-token pages, 656 bf16 elements per token and layer.
LAYERS, PAGE, TOKEN_BYTES = 78, 64, 656 * 2
PF_UNIT = page_first_unit(PAGE, LAYERS, TOKEN_BYTES)


@pytest.fixture(autouse=True)
def _stock_register(monkeypatch):
    # Start every test from SGLang's own function: register() elsewhere in the session may have wrapped it.
    monkeypatch.setattr(common, "_cuda_host_register",
                        resolve_original("sglang.srt.mem_cache.pool_host.common._cuda_host_register"))


class _FakeBuffer:
    """What _cuda_host_register reads from a host tensor: pointer, element count and size (no 1.5 TB allocation)."""

    def __init__(self, nbytes):
        self._n = nbytes

    def data_ptr(self):
        return 1 << 40

    def numel(self):
        return self._n

    def element_size(self):
        return 1


class _FakeCudart:
    def __init__(self):
        self.calls = []

    def cudaHostRegister(self, ptr, size, flags):
        self.calls.append((ptr - (1 << 40), size))
        return 0

    def cudaHostUnregister(self, ptr):
        return 0

    def cudaGetErrorString(self, rc):
        return "fake"


def _register(monkeypatch, nbytes, granularity):
    cudart = _FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    common._cuda_host_register(_FakeBuffer(nbytes), granularity)
    return cudart.calls


def check_page_first_chunks(monkeypatch) -> None:
    """SGLang's own chunker on a page-first pool above the ceiling (1.5 TB)."""
    total = (1536 * GIB // PF_UNIT) * PF_UNIT
    calls = _register(monkeypatch, total, PF_UNIT)
    assert len(calls) > 1, "a 1.5 TB page-first pool must be registered in several calls"
    pos = 0
    for off, size in calls:
        assert off == pos, f"registrations do not tile the buffer: {calls}"
        assert size <= CEILING, f"a registration of {size / GIB:.0f} GiB exceeds the {CEILING / GIB:.0f} GiB ceiling"
        assert off % PF_UNIT == 0, f"boundary at byte {off} splits a page (unit {PF_UNIT})"
        pos += size
    assert pos == total


def test_installed_page_first_chunking(monkeypatch):
    check_page_first_chunks(monkeypatch)


def test_check_detects_unchunked_registration(monkeypatch):
    # A chunker that ignores the pool's granularity registers the whole pool in one call again.
    rm.check_catches_mutant(
        monkeypatch, common, "_cuda_host_register",
        rm.DropIfBlocks("registration_granularity_bytes is not None"),
        check_page_first_chunks, monkeypatch,
    )


def test_check_detects_byte_granular_chunking(monkeypatch):
    # A chunker that splits at the raw byte limit (granularity 1, i.e. "just chunk it"): 256 GiB is not a whole
    # number of 6.2 MiB pages, so a page straddles two registrations.
    original = common._cuda_host_register
    monkeypatch.setattr(common, "_cuda_host_register", lambda buffer, granularity=None: original(buffer, 1))
    with pytest.raises(AssertionError):
        check_page_first_chunks(monkeypatch)


def test_layer_first_is_one_registration_in_0523(monkeypatch):
    # The gap the plugin covers: no granularity -> one call for the whole pool, whatever its size.
    calls = _register(monkeypatch, 600 * GIB, None)
    assert calls == [(0, 600 * GIB)]


def _apply_plugin_patch(monkeypatch):
    (patch,) = [p for p in PATCHES if p.id == "host_register.ceiling"]
    from sglang.srt.plugins.hook_registry import HookSource

    status = apply_one(patch, HookSource(plugin_name="glm_ext", dist_name="sglang-glm-ext"))
    assert status.state is State.APPLIED, status.detail


def check_plugin_refuses_layer_first_over_ceiling(monkeypatch) -> None:
    monkeypatch.delenv("SGLANG_GLM_EXT_HOST_REGISTER_MAX_GB", raising=False)
    cudart = _FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    try:
        common._cuda_host_register(_FakeBuffer(600 * GIB), None)
    except HostRegisterPlanError as exc:
        msg = str(exc)
    else:
        raise AssertionError("a 600 GiB single registration passed the 480 GiB ceiling")
    assert cudart.calls == [], "nothing may be registered before the refusal"
    for needle in ("600.0 GiB", "480.0 GiB", "SGLANG_GLM_EXT_HOST_REGISTER_MAX_GB", "page_first", "--hicache-size"):
        assert needle in msg, f"startup error must name {needle!r}: {msg}"
    # Under the ceiling, and page-first pools of any size, SGLang registers exactly as without the plugin.
    common._cuda_host_register(_FakeBuffer(100 * GIB), None)
    assert cudart.calls == [(0, 100 * GIB)]
    cudart.calls.clear()
    total = (1536 * GIB // PF_UNIT) * PF_UNIT
    common._cuda_host_register(_FakeBuffer(total), PF_UNIT)
    assert len(cudart.calls) > 1 and all(s <= CEILING for _, s in cudart.calls)


def test_plugin_refuses_layer_first_over_ceiling(monkeypatch):
    _apply_plugin_patch(monkeypatch)
    check_plugin_refuses_layer_first_over_ceiling(monkeypatch)


def test_plugin_refuses_sglang_chunk_limit_over_ceiling(monkeypatch):
    _apply_plugin_patch(monkeypatch)
    monkeypatch.setenv("SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB", "600")
    monkeypatch.setattr(torch.cuda, "cudart", lambda: _FakeCudart())
    with pytest.raises(HostRegisterPlanError, match="SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB to at most 480"):
        common._cuda_host_register(_FakeBuffer((1536 * GIB // PF_UNIT) * PF_UNIT), PF_UNIT)


def test_check_detects_missing_plugin_hook(monkeypatch):
    # Without the patch (or with a hook that lets everything through) the check must fail.
    monkeypatch.setattr("sglang_glm_ext.host_register.hooks.check_cuda_host_register", lambda *a, **k: None)
    _apply_plugin_patch(monkeypatch)
    with pytest.raises(AssertionError):
        check_plugin_refuses_layer_first_over_ceiling(monkeypatch)


@pytest.mark.gpu(reason=(
    "proves on a real GPU that a page-first host buffer registered by SGLang in several chunks transfers every "
    "page (including the pages next to each registration boundary) to and from the device intact; uses a 2 GiB "
    "buffer with SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB=1; not run here: no GPU node with SGLang exists for this "
    "project"
))
def test_gpu_chunked_registration_transfers_across_boundaries(monkeypatch):
    monkeypatch.setenv("SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB", "1")
    unit = 3 * 1024 * 1024  # 3 MiB pages: 1 GiB is not a multiple, so rounding matters
    pages = (2 * GIB) // unit
    host = torch.empty(pages * unit, dtype=torch.uint8)
    common._cuda_host_register(host, unit)
    try:
        ranges = getattr(host, "_sglang_cuda_host_registered_ranges")
        assert len(ranges) >= 2
        for off in (r[0] - host.data_ptr() for r in ranges[1:]):
            p = off // unit
            for q in (p - 1, p):  # the pages on both sides of the boundary
                src = torch.randint(0, 255, (unit,), dtype=torch.uint8, device="cuda")
                host[q * unit:(q + 1) * unit].copy_(src, non_blocking=True)
                back = host[q * unit:(q + 1) * unit].to("cuda", non_blocking=True)
                torch.cuda.synchronize()
                assert torch.equal(back, src)
    finally:
        common._cuda_host_unregister(host)
