"""Spec-v2 draft extend: the plan stream waits on the current stream before preparing draft-extend metadata.

Guards seed lines 116-127 (fork commit "... orders plan-stream metadata work after current-stream inputs are
available"; 0.5.23 speculative/eagle_worker_v2.py `EagleDraftWorker._draft_extend_for_decode` adds
`self.plan_stream.wait_stream(current_stream())` before `prepare_for_draft_extend`; 0.5.20 lacked it). With
SGLANG_ENABLE_OVERLAP_PLAN_STREAM=1 the metadata is built on a second stream; without the wait it can read
accept lengths / token ids that the verify step on the compute stream has not written yet (CUDA illegal address in
the fork's warm-up).

Runs the installed method with fake streams (upstream's test_draft_extend_stream_order.py checks the same order
with an AST-extracted prefix; here the method itself runs on CPU). The real race needs CUDA: GPU-marked test below.
The other items of that commit (draft-extend mutates only forward_batch.seq_lens, monotonic KV allocation, verify
metadata after DP padding) are covered by docs_internal/regression_map.md.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import regression_mutants as rm
import torch

import sglang.srt.speculative.eagle_worker_v2 as ew2
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

DRAFT_TOKENS = 2


class _Stop(Exception):
    pass


class _PlanStream:
    def __init__(self, log):
        self.log = log

    def wait_stream(self, other):
        self.log.append(("plan.wait", type(other).__name__))


def _run_until_prepare(monkeypatch, log):
    w = EagleDraftWorker.__new__(EagleDraftWorker)
    w.device = "cpu"  # torch.get_device_module("cpu").current_stream() is a torch.cpu.Stream
    w.speculative_num_draft_tokens = DRAFT_TOKENS
    w.plan_stream = _PlanStream(log)

    @contextlib.contextmanager
    def plan_ctx():
        log.append(("plan.enter",))
        yield
        log.append(("plan.exit",))

    w.plan_stream_ctx = plan_ctx()
    w.draft_runner = SimpleNamespace(canary_manager=None)
    w.cuda_graph_runner_for_draft_extend = None

    def prepare(*args, **kwargs):
        log.append(("prepare_for_draft_extend",))
        raise _Stop

    monkeypatch.setattr(ew2, "prepare_for_draft_extend", prepare)
    result = SimpleNamespace(
        prepared_draft_extend_inputs=None, accept_lens=torch.tensor([1, 2], dtype=torch.int32),
        next_token_ids=torch.arange(2 * DRAFT_TOKENS), logits_output=SimpleNamespace(hidden_states=None),
    )
    with pytest.raises(_Stop):
        w._draft_extend_for_decode(SimpleNamespace(seq_lens=torch.tensor([3, 4])), result)


def check_plan_stream_waits_before_prepare(monkeypatch) -> None:
    log = []
    _run_until_prepare(monkeypatch, log)
    names = [e[0] for e in log]
    assert "prepare_for_draft_extend" in names, f"draft-extend preparation never ran: {log}"
    assert "plan.wait" in names, "plan stream never waits on the current stream before draft-extend preparation"
    wait, enter, prep = names.index("plan.wait"), names.index("plan.enter"), names.index("prepare_for_draft_extend")
    assert wait < enter < prep, f"order must be wait -> enter plan stream -> prepare, got {names}"
    assert log[wait][1] == "Stream", f"the plan stream must wait on the device's current stream, got {log[wait]}"


def test_installed_plan_stream_waits_before_prepare(monkeypatch):
    check_plan_stream_waits_before_prepare(monkeypatch)


def test_check_detects_missing_wait(monkeypatch):
    # The 0.5.20 shape: enter plan_stream_ctx straight away.
    rm.check_catches_mutant(
        monkeypatch, EagleDraftWorker, "_draft_extend_for_decode",
        rm.DropIfBlocks("self.plan_stream"),
        check_plan_stream_waits_before_prepare, monkeypatch,
    )


@pytest.mark.gpu(reason=(
    "proves with real CUDA streams that work queued on the plan stream by _draft_extend_for_decode starts only "
    "after prior current-stream work (a long kernel writing the token ids) finished; not run here: no GPU node with "
    "SGLang exists for this project"
))
def test_gpu_plan_stream_orders_after_compute(monkeypatch):
    plan = torch.cuda.Stream()
    w = EagleDraftWorker.__new__(EagleDraftWorker)
    w.device = "cuda"
    w.speculative_num_draft_tokens = DRAFT_TOKENS
    w.plan_stream = plan
    w.plan_stream_ctx = torch.cuda.stream(plan)
    w.draft_runner = SimpleNamespace(canary_manager=None)
    w.cuda_graph_runner_for_draft_extend = None
    seen = {}

    def prepare(draft_extend_input, batch, next_token_ids, *args, **kwargs):
        seen["ids"] = next_token_ids.clone()  # enqueued on the plan stream
        raise _Stop

    monkeypatch.setattr(ew2, "prepare_for_draft_extend", prepare)
    ids = torch.zeros(2 * DRAFT_TOKENS, dtype=torch.int64, device="cuda")
    torch.cuda._sleep(200_000_000)  # keep the compute stream busy, then write the ids on it
    ids.fill_(7)
    result = SimpleNamespace(
        prepared_draft_extend_inputs=(torch.zeros(2, device="cuda"), torch.zeros(2, device="cuda"), ids),
        accept_lens=torch.tensor([1, 2], device="cuda"), next_token_ids=ids,
        logits_output=SimpleNamespace(hidden_states=None),
    )
    with pytest.raises(_Stop):
        w._draft_extend_for_decode(SimpleNamespace(seq_lens=torch.tensor([3, 4], device="cuda")), result)
    torch.cuda.synchronize()
    assert seen["ids"].tolist() == [7] * (2 * DRAFT_TOKENS), "plan stream read the ids before compute wrote them"
