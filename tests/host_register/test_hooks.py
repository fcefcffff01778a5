"""The host-register hook on its own: what it lets through, what it refuses, and how the ceiling is read."""

import pytest

from sglang_glm_ext.host_register import hooks
from sglang_glm_ext.host_register.plan import GIB, HostRegisterPlanError


class Buf:
    def __init__(self, nbytes):
        self.n = nbytes

    def numel(self):
        return self.n

    def element_size(self):
        return 1


@pytest.fixture(autouse=True)
def _defaults(monkeypatch):
    monkeypatch.delenv("SGLANG_GLM_EXT_HOST_REGISTER_MAX_GB", raising=False)
    monkeypatch.setattr(hooks, "_hicache_layout", lambda: "layer_first")
    monkeypatch.setattr(hooks, "_sglang_chunk_limit_bytes", lambda: 256 * GIB)


def test_ceiling_defaults_to_480_gib_and_follows_the_env_var(monkeypatch):
    assert hooks.ceiling_bytes() == 480 * GIB
    monkeypatch.setenv("SGLANG_GLM_EXT_HOST_REGISTER_MAX_GB", "0.5")
    assert hooks.ceiling_bytes() == GIB // 2


@pytest.mark.parametrize("raw, needle", [("lots", "expected a number"), ("0", "must be positive"),
                                         ("-3", "must be positive")])
def test_bad_ceiling_is_a_clear_error(monkeypatch, raw, needle):
    monkeypatch.setenv("SGLANG_GLM_EXT_HOST_REGISTER_MAX_GB", raw)
    with pytest.raises(HostRegisterPlanError, match=f"SGLANG_GLM_EXT_HOST_REGISTER_MAX_GB={raw!r}: {needle}"):
        hooks.ceiling_bytes()


def test_one_call_under_the_ceiling_passes_and_over_it_is_refused_with_size_ceiling_and_fix(monkeypatch):
    assert hooks.check_cuda_host_register(Buf(480 * GIB), None) is None
    with pytest.raises(HostRegisterPlanError) as exc:
        hooks.check_cuda_host_register(Buf(481 * GIB), None)
    msg = str(exc.value)
    for needle in ("481.0 GiB", "480.0 GiB", "SGLANG_GLM_EXT_HOST_REGISTER_MAX_GB", "layer_first", "page_first"):
        assert needle in msg, msg
    monkeypatch.setenv("SGLANG_GLM_EXT_HOST_REGISTER_MAX_GB", "100")  # the env var moves the line
    with pytest.raises(HostRegisterPlanError, match="100.0 GiB"):
        hooks.check_cuda_host_register(Buf(150 * GIB), None)


def test_chunked_registration_passes_unless_sglang_chunks_above_the_ceiling(monkeypatch):
    page = 6 * 1024 * 1024
    assert hooks.check_cuda_host_register(Buf(2048 * GIB // page * page), page) is None
    monkeypatch.setattr(hooks, "_sglang_chunk_limit_bytes", lambda: 600 * GIB)
    with pytest.raises(HostRegisterPlanError, match="SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB to at most 480"):
        hooks.check_cuda_host_register(Buf(2048 * GIB // page * page), page)


def test_what_sglang_judges_itself_is_left_to_it():
    assert hooks.check_cuda_host_register(object(), None) is None  # not a tensor we understand
    assert hooks.check_cuda_host_register(Buf(GIB), 0) is None  # SGLang raises its own ValueError
    assert hooks.check_cuda_host_register(Buf(GIB), 300 * GIB) is None  # granularity above SGLang's limit
