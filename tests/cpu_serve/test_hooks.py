"""The CPU serving hooks on SGLang's own objects (they only act with the mode on and the stand-in reachable)."""

import sys

import pytest
import torch

from sglang_glm_ext.cpu_serve import gate, hooks


@pytest.fixture
def mode_on(monkeypatch):
    monkeypatch.setenv("SGLANG_GLM_EXT_CPU_SERVE", "1")
    monkeypatch.setattr(sys, "path", [gate.SHADOW_DIR, *sys.path])


def test_no_cuda_capability_only_during_the_call_and_only_without_cuda(mode_on):
    seen = []

    def original(server_args):
        seen.append(torch.cuda.get_device_capability())
        return "done"

    before = torch.cuda.get_device_capability
    assert hooks.hook_model_adjustments(original, object()) == "done"
    assert seen == [(0, 0)] and torch.cuda.get_device_capability is before


def test_torch_native_gets_sglangs_mla_dispatch_other_backends_unchanged(mode_on):
    from sglang.srt.models.deepseek_common.attention_backend_handler import (
        AttentionBackendRegistry, _dispatch_mla_subtype)
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import AttnForwardMethod

    raw = AttentionBackendRegistry.get_handler.__func__
    while hasattr(raw, "__wrapped__"):
        raw = raw.__wrapped__
    handler = hooks.hook_get_handler(raw, AttentionBackendRegistry, "torch_native")
    assert handler is hooks._torch_native_mla

    class Attn:  # no fused AMX projection: SGLang's own dispatch answers plain MLA
        pass

    assert handler(Attn(), None) == _dispatch_mla_subtype(Attn(), None) == AttnForwardMethod.MLA
    assert hooks.hook_get_handler(raw, AttentionBackendRegistry, "fa3") is raw(AttentionBackendRegistry, "fa3")


def test_mode_off_hooks_run_sglangs_own_code(monkeypatch):
    monkeypatch.delenv("SGLANG_GLM_EXT_CPU_SERVE", raising=False)
    from sglang.srt.models.deepseek_common.attention_backend_handler import AttentionBackendRegistry

    raw = AttentionBackendRegistry.get_handler.__func__
    while hasattr(raw, "__wrapped__"):
        raw = raw.__wrapped__
    assert hooks.hook_get_handler(raw, AttentionBackendRegistry, "torch_native") is not hooks._torch_native_mla
    assert hooks.hook_model_adjustments(lambda sa: torch.cuda.get_device_capability, None) is \
        torch.cuda.get_device_capability


def test_unpinned_host_pool_forces_pin_memory_off_positional_or_keyword(mode_on):
    got = []

    def init(self, buffer_info, host_to_device_ratio, host_size, page_size, layout, pin_memory=True, device="cpu"):
        got.append(pin_memory)

    hooks.hook_unpinned_host_pool(init, object(), 1, 2.0, 0, 64, "layer_first", True)
    hooks.hook_unpinned_host_pool(init, object(), 1, 2.0, 0, 64, "layer_first", pin_memory=True)
    hooks.hook_unpinned_host_pool(init, object(), 1, 2.0, 0, 64, "layer_first")
    assert got == [False, False, False]


def test_perturb_loads_only_with_its_env_var(mode_on, monkeypatch):
    class Pool:
        def __init__(self):
            self.device_k_buffers = [torch.ones(8, 4)]
            self.device_v_buffers = [torch.ones(8, 4)]

    def load(self, device_pool, host_indices, device_indices, layer_id, io_backend, is_draft=False):
        return None

    pool, idx = Pool(), torch.tensor([1, 2])
    hooks.hook_perturb_loads(load, pool, None, idx, idx, 0, "direct")
    assert torch.all(pool.device_k_buffers[0] == 1)
    monkeypatch.setenv("SGLANG_GLM_EXT_CPU_SERVE_PERTURB_LOADS", "1")
    hooks.hook_perturb_loads(load, pool, None, idx, idx, 0, "direct")
    assert torch.all(pool.device_k_buffers[0][idx] == -3) and torch.all(pool.device_k_buffers[0][0] == 1)
    assert torch.all(pool.device_v_buffers[0][idx] == -3)


def test_launch_check_needs_device_cpu(monkeypatch):
    from sglang_glm_ext.declare import PluginFlagError

    monkeypatch.setenv("SGLANG_GLM_EXT_CPU_SERVE", "1")

    class Args:
        device = "cuda"

    with pytest.raises(PluginFlagError, match="serves only --device cpu"):
        hooks.check_launch(Args())
    Args.device = "cpu"
    hooks.check_launch(Args())
    monkeypatch.delenv("SGLANG_GLM_EXT_CPU_SERVE")
    Args.device = "cuda"
    hooks.check_launch(Args())  # mode off: nothing to check


def test_l2_transfer_streams_get_a_synchronize_on_cpu(mode_on):
    from sglang.srt.mem_cache.l2_transfer import L2TransferEngine

    raw = L2TransferEngine.__init__
    while hasattr(raw, "__wrapped__"):
        raw = raw.__wrapped__
    engine = L2TransferEngine.__new__(L2TransferEngine)
    raw(engine, "direct")
    assert not hasattr(engine.device_to_host_stream, "synchronize")  # torch.cpu.Stream as 0.5.23 makes it
    hooks.hook_cpu_streams(None, engine, "direct")
    engine.device_to_host_stream.synchronize()
    engine.host_to_device_stream.synchronize()
    assert isinstance(engine.device_to_host_stream, torch.cpu.Stream)
