"""cg_mem's hooks against the installed SGLang 0.5.23 classes, on a CPU.

Runners are built with object.__new__ of the real classes and only the attributes the capture loop and the
hooks read. The real `capture()` and SGLang's real `_capture_one_stream` loop run; what is faked is below them
(`_capture`'s warm-up/graph context and each class's `capture_one_shape`, which would need a model and a GPU),
and the allocator counters, which a fake pool drives.
"""

import contextlib
import inspect
import logging
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional

import pytest
import torch

from sglang.srt.model_executor.runner import decode_cuda_graph_runner as dcgr
from sglang.srt.model_executor import input_buffers
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.plugins.hook_registry import HookType, _wrap_fn
from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner
from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import EAGLEDraftExtendCudaGraphRunner

from sglang_glm_ext.cuda_graph_mem import attribution as attr
from sglang_glm_ext.cuda_graph_mem import hooks
from sglang_glm_ext.plugin.registry import PATCHES

Decode = dcgr.DecodeCudaGraphRunner
MIB = 1 << 20


@dataclass
class TargetBufs(input_buffers.ForwardInputBuffers):
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    next_token_logits_buffer: torch.Tensor


@dataclass
class DraftBufs(input_buffers.ForwardInputBuffers):
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    topk_p: torch.Tensor
    hidden_states: Optional[torch.Tensor] = None


class FakePool:
    """Stands in for the graph pool: each captured shape grows it by bs MiB, of which 1 MiB stays live."""

    def __init__(self):
        self.reserved = self.live = 0

    def stats(self):
        return {"pool": self.reserved, "pool_live": self.live}


@pytest.fixture
def env(monkeypatch):
    """The real capture path with the cg_mem hooks wrapped on the way SGLang's HookRegistry wraps them, around
    SGLang's own functions (unwrapped: a module that registered the plugin in this process has wrapped them once)."""
    hooks.reset_for_tests()
    monkeypatch.setattr(input_buffers, "_forward_input_buffer_pool", {})  # a fresh process-wide share pool
    monkeypatch.setattr(hooks, "_tp_rank", lambda: 0)
    monkeypatch.setattr(dcgr, "get_parallel", lambda: SimpleNamespace(tp_rank=0, tp_group=None))
    monkeypatch.setattr(dcgr, "get_available_gpu_memory", lambda *a, **k: 100.0)
    monkeypatch.setattr(Decode, "capture", _wrap_fn(inspect.unwrap(Decode.capture), hooks.hook_capture,
                                                    HookType.AROUND))
    monkeypatch.setattr(Decode, "_post_process_after_profile", _wrap_fn(
        inspect.unwrap(Decode._post_process_after_profile), hooks.hook_post_process_after_profile, HookType.AROUND))
    pool = FakePool()
    monkeypatch.setattr(hooks, "_stats_fn", lambda runner: pool.stats)
    calls = SimpleNamespace(inner=0, shapes=[])

    def fake_inner_capture(self):  # what _capture does around the loop needs a GPU; the loop itself is real
        calls.inner += 1
        self._capture_one_stream()

    def fake_capture_one_shape(self, size, forward, stream_idx=None, variant_label=None, attention_variant=None):
        calls.shapes.append((type(self).__name__, size))
        pool.reserved += size * MIB
        pool.live += MIB

    monkeypatch.setattr(Decode, "_capture", fake_inner_capture)
    for cls in (Decode, EAGLEDraftCudaGraphRunner, EAGLEDraftExtendCudaGraphRunner):
        monkeypatch.setattr(cls, "capture_one_shape", fake_capture_one_shape)
    yield SimpleNamespace(pool=pool, calls=calls, monkeypatch=monkeypatch)
    hooks.reset_for_tests()


def make_runner(cls, mode, buffers, capture_bs=(1, 2, 4), draft_worker=False):
    r = object.__new__(cls)
    r.capture_forward_mode = mode
    r.buffers = buffers
    r.device = "cpu"
    r.model_runner = SimpleNamespace(is_draft_worker=draft_worker, device="cpu", gpu_id=0,
                                     model=SimpleNamespace(forward=lambda *a, **k: None))
    r.capture_bs = list(capture_bs)
    r.record_nolora_graph = False
    r.attention_graph_variants = None
    r.compile_bs = []
    r.captured_req_width = 1
    r.model_context = contextlib.nullcontext  # selects the model's layout; nothing to select here
    return r


def three_runners():
    """target verify, draft and draft-extend, with buffers coalesced by SGLang's real share_buffers()."""
    t = TargetBufs(torch.zeros(64, dtype=torch.int64), torch.zeros(8, dtype=torch.int32),
                   torch.zeros(8, 1024, dtype=torch.float32))
    t.share_buffers()
    d = DraftBufs(torch.zeros(64, dtype=torch.int64), torch.zeros(16, dtype=torch.int32),
                  torch.zeros(8, 4, dtype=torch.float32))
    d.share_buffers()
    e = DraftBufs(torch.zeros(64, dtype=torch.int64), torch.zeros(8, dtype=torch.int32),
                  torch.zeros(8, 4, dtype=torch.float32), hidden_states=torch.zeros(8, 16))
    e.share_buffers(exclude={"topk_p"})
    return (
        make_runner(Decode, ForwardMode.TARGET_VERIFY, t, capture_bs=(1, 2, 4, 8)),
        make_runner(EAGLEDraftCudaGraphRunner, ForwardMode.DECODE, d, draft_worker=True),
        make_runner(EAGLEDraftExtendCudaGraphRunner, ForwardMode.DRAFT_EXTEND_V2, e, draft_worker=True),
    )


def cg_lines(caplog):
    return "\n".join(r.getMessage() for r in caplog.records if r.name == "sglang_glm_ext")


class Untouchable:
    def __getattribute__(self, name):
        raise AssertionError(f"read {name} while cg_mem is off")


def test_off_calls_original_once_and_touches_nothing(env, monkeypatch, caplog):
    monkeypatch.delenv("SGLANG_LOG_CG_BUFFERS", raising=False)
    calls = []

    def original(self, *a, **k):
        calls.append((self, a, k))
        return "captured"

    runner = make_runner(Decode, ForwardMode.DECODE, Untouchable())
    with caplog.at_level(logging.DEBUG, logger="sglang_glm_ext"):
        assert hooks.hook_capture(original, runner, 7, k=1) == "captured"
        runner.capture()  # the real patched method, real loop below it
    assert calls == [(runner, (7,), {"k": 1})]
    assert env.calls.inner == 1 and len(env.calls.shapes) == 3  # the capture itself ran as usual
    assert "_glm_ext_cg_label" not in runner.__dict__ and "capture_one_shape" not in runner.__dict__
    assert cg_lines(caplog) == ""


def test_three_families_tables_aliases_deltas_totals(env, monkeypatch, caplog):
    monkeypatch.setenv("SGLANG_LOG_CG_BUFFERS", "1")
    target, draft, extend = three_runners()
    with caplog.at_level(logging.INFO, logger="sglang_glm_ext"):
        for r in (target, draft, extend):
            r.capture()
    text = cg_lines(caplog)

    # One table per family, named from class + capture mode.
    for label in ("target_verify", "draft", "draft_extend"):
        assert f"[cg_mem] {label}: static buffers" in text
        assert f"[cg_mem] {label}: TOTAL" in text
    # share_buffers() coalesced input_ids (same name and size) for all three; seq_lens only for the same size.
    draft_table = text.split("[cg_mem] draft: static buffers")[1].split("[cg_mem]")[0]
    assert _line(draft_table, "input_ids").endswith("target_verify.input_ids")
    assert "target_verify" not in _line(draft_table, "seq_lens")  # 16 != 8 entries: its own allocation
    ext_table = text.split("[cg_mem] draft_extend: static buffers")[1].split("[cg_mem]")[0]
    assert _line(ext_table, "input_ids").endswith("target_verify.input_ids")
    assert _line(ext_table, "seq_lens").endswith("target_verify.seq_lens")
    assert "target_verify" not in _line(ext_table, "topk_p")  # excluded from sharing

    # The real loop captured large shapes first, through each class's own capture_one_shape override.
    assert env.calls.shapes[:4] == [("DecodeCudaGraphRunner", b) for b in (8, 4, 2, 1)]
    assert ("EAGLEDraftExtendCudaGraphRunner", 4) in env.calls.shapes
    # Per-shape growth and the family total.
    assert "bs=8" in text and "+8.00" in text
    # CPU tensors stand in for the buffers here, so they are counted as host bytes (8x1024 fp32 = 0.03 MiB).
    assert "[cg_mem] target_verify: TOTAL static buffers 0.00 MiB own (+0.00 MiB aliased" in text
    assert "0.03 MiB host" in text
    assert "graph pool +15.00 MiB over 4 shapes (largest shape +8.00)" in text
    assert "[cg_mem] draft: TOTAL" in text and "graph pool +7.00 MiB over 3 shapes" in text
    assert "whole capture graph pool +15.00 MiB" in text  # the whole call, read around the original
    # The per-shape wrapper is gone afterwards: replay and recapture use the class method again.
    for r in (target, draft, extend):
        assert "capture_one_shape" not in r.__dict__


def _line(table, name):
    return next(ln for ln in table.splitlines() if ln.strip().startswith(name + " ")).rstrip()


def test_only_rank_zero_logs(env, monkeypatch, caplog):
    monkeypatch.setenv("SGLANG_LOG_CG_BUFFERS", "1")
    monkeypatch.setattr(hooks, "_tp_rank", lambda: 1)
    target, _, _ = three_runners()
    with caplog.at_level(logging.INFO, logger="sglang_glm_ext"):
        target.capture()
    assert env.calls.inner == 1 and cg_lines(caplog) == ""


def test_attribution_failure_never_breaks_capture(env, monkeypatch, caplog):
    monkeypatch.setenv("SGLANG_LOG_CG_BUFFERS", "1")

    def broken(_):
        raise RuntimeError("table exploded")

    monkeypatch.setattr(attr, "buffer_rows", broken)
    target, draft, _ = three_runners()
    with caplog.at_level(logging.INFO, logger="sglang_glm_ext"):
        target.capture()
        draft.capture()
    assert env.calls.inner == 2 and len(env.calls.shapes) == 7
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "table exploded" in r.getMessage()]
    assert len(warnings) == 1  # logged once, not once per runner


def test_capture_errors_pass_through_and_the_wrapper_is_removed(env, monkeypatch):
    monkeypatch.setenv("SGLANG_LOG_CG_BUFFERS", "1")

    def failing_shape(self, size, *a, **k):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(EAGLEDraftCudaGraphRunner, "capture_one_shape", failing_shape)
    _, draft, _ = three_runners()
    with pytest.raises(RuntimeError, match="out of memory"):
        draft.capture()
    assert "capture_one_shape" not in draft.__dict__


class FakeProf:
    def key_averages(self, **_):
        return SimpleNamespace(table=lambda **__: "table")


def test_profile_snapshot_one_pickle_per_family(env, monkeypatch, caplog):
    monkeypatch.delenv("SGLANG_LOG_CG_BUFFERS", raising=False)  # a fix to --enable-profile-cuda-graph, not gated
    dumped = []
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda filename="x": dumped.append(filename))
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda *a, **k: None)
    fake_dump = torch.cuda.memory._dump_snapshot
    target, draft, extend = three_runners()
    with caplog.at_level(logging.INFO, logger="sglang_glm_ext"):
        for r in (target, draft, extend):
            r._post_process_after_profile(FakeProf())
    assert dumped == ["cuda_graph_mem_target_verify.pickle", "cuda_graph_mem_draft.pickle",
                      "cuda_graph_mem_draft_extend.pickle"]
    assert torch.cuda.memory._dump_snapshot is fake_dump  # restored after each call
    assert "saved to cuda_graph_mem_draft_extend.pickle" in cg_lines(caplog)

    # Without the hook SGLang names every runner's snapshot the same: what the hook exists to fix.
    dumped.clear()
    hooks_free = inspect.unwrap(Decode._post_process_after_profile)
    hooks_free(target, FakeProf())
    hooks_free(draft, FakeProf())
    assert dumped == [attr.LEGACY_PICKLE, attr.LEGACY_PICKLE]


def test_profile_snapshot_on_other_ranks_gets_a_rank_suffix(env, monkeypatch):
    dumped = []
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda filename="x": dumped.append(filename))
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda *a, **k: None)
    monkeypatch.setattr(hooks, "_tp_rank", lambda: 2)
    _, draft, _ = three_runners()
    draft._post_process_after_profile(FakeProf())
    assert dumped == ["cuda_graph_mem_draft_tp2.pickle"]


def test_sglang_still_has_the_shape_the_hooks_rely_on():
    """The instance-attribute trick needs: capture() inherited by the EAGLE runners, and the capture loop
    calling `self.capture_one_shape(...)` (an instance attribute shadows the class method there)."""
    for cls in (EAGLEDraftCudaGraphRunner, EAGLEDraftExtendCudaGraphRunner):
        for name in ("capture", "_capture", "_capture_one_stream", "_post_process_after_profile"):
            assert name not in cls.__dict__, f"{cls.__name__} overrides {name}; the cg_mem hooks would miss it"
        assert "capture_one_shape" in cls.__dict__  # why a class-level hook on the base is not enough
    src = inspect.getsource(Decode._capture_one_stream)
    assert "self.capture_one_shape(" in src
    declared = {p.target.rsplit(".", 1)[1]: p for p in PATCHES if p.feature.name == "cg_mem"}
    assert set(declared) == {"capture", "_post_process_after_profile"}
    assert all(p.seed_lines == "152-162" and p.hook_type == "around" for p in declared.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=(
    "needs a CUDA GPU: proves the default counter reader (allocator + graph-pool segments) reports real "
    "per-shape graph-pool growth through the patched capture of a real SGLang runner class. It has not run on "
    "a GPU node with SGLang; the torch-only core ran on an H200 (docs_internal/cg_mem_h200_run.md)."))
def test_real_cuda_graph_capture_records_pool_growth(monkeypatch, caplog, request):
    hooks.reset_for_tests()
    request.addfinalizer(hooks.reset_for_tests)  # the switch is read once per process: not on for the next test
    monkeypatch.setenv("SGLANG_LOG_CG_BUFFERS", "1")
    monkeypatch.setattr(hooks, "_tp_rank", lambda: 0)
    monkeypatch.setattr(dcgr, "get_parallel", lambda: SimpleNamespace(tp_rank=0, tp_group=None))
    monkeypatch.setattr(Decode, "capture", _wrap_fn(inspect.unwrap(Decode.capture), hooks.hook_capture,
                                                    HookType.AROUND))
    pool = torch.cuda.graph_pool_handle()
    monkeypatch.setattr(hooks, "_graph_pool_id", lambda: pool)
    weight = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    graphs = []

    def capture_one_shape(self, size, *a, **k):
        x = torch.randn(size * 64, 4096, device="cuda", dtype=torch.bfloat16)
        torch.matmul(x, weight)  # warm-up outside the graph, as SGLang does
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            y = torch.relu(torch.matmul(x, weight)) @ weight
        graphs.append((g, y))

    monkeypatch.setattr(Decode, "_capture", lambda self: self._capture_one_stream())
    monkeypatch.setattr(Decode, "capture_one_shape", capture_one_shape)
    bufs = TargetBufs(torch.zeros(64, dtype=torch.int64, device="cuda"), torch.zeros(8, dtype=torch.int32,
                      device="cuda"), torch.zeros(8, 1024, device="cuda"))
    runner = make_runner(Decode, ForwardMode.DECODE, bufs, capture_bs=(1, 4, 16))
    runner.device = "cuda"
    runner.model_runner.device = "cuda"
    with caplog.at_level(logging.INFO, logger="sglang_glm_ext"):
        runner.capture()
    text = cg_lines(caplog)
    assert "[cg_mem] decode: TOTAL" in text and "graph pool +" in text
    assert "graph pool +0.00 MiB" not in text  # a real capture grows the pool
    hooks.reset_for_tests()
