"""Spec-v2 result D2H copies: hidden states copied to host only when requested, on copy_stream after the forward.

Guards seed lines 94-105 (fork commit "gate hidden-state D2H on return_hidden_states, run result copies on
copy_stream with pinned async D2H"; upstream PRs #29075, #28465; 0.5.23 managers/utils.py
`GenerationBatchResult.copy_to_cpu`, managers/scheduler.py `Scheduler._copy_result_to_cpu`). Copying the
[bs * draft_tokens, hidden] hidden states every decode step costs PCIe bandwidth and host memory for output that
default chat requests never read.

CPU: the installed methods run with `_async_d2h` replaced by a recorder (on CPU it is a no-op `.to("cpu")`, so
"was it copied" must be observed at the call). The overlap itself needs CUDA streams: GPU-marked test below.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import regression_mutants as rm
import torch

import sglang.srt.managers.utils as mutils
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.utils import GenerationBatchResult


class _Event:
    def record(self):
        pass


def _result():
    logits = SimpleNamespace(
        hidden_states=torch.randn(4, 8), next_token_logprobs=None, input_token_logprobs=None,
        next_token_top_logprobs_val=None, next_token_top_logprobs_idx=None,
        next_token_token_ids_logprobs_val=None, sampling_mask_output=None, auxiliary_device_output=None,
    )
    return GenerationBatchResult(logits_output=logits, next_token_ids=torch.arange(4), copy_done=_Event())


def check_hidden_states_copied_only_when_requested(monkeypatch) -> None:
    for requested in (False, True):
        copied = []
        monkeypatch.setattr(mutils, "_async_d2h", lambda t: copied.append(t) or t.clone())
        res = _result()
        hidden = res.logits_output.hidden_states
        res.copy_to_cpu(return_logprob=False, return_hidden_states=requested)
        was_copied = any(t is hidden for t in copied)
        assert was_copied is requested, (
            f"return_hidden_states={requested}: hidden states {'not ' if requested else ''}copied to host"
        )
        assert any(t.shape == (4,) for t in copied), "next_token_ids must always be copied"


class _Stream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_stream(self, other):
        self.log.append(("wait", self.name, other.name))


def check_scheduler_copies_on_copy_stream() -> None:
    for wants_hidden in (False, True):
        log = []
        s = Scheduler.__new__(Scheduler)
        s.forward_stream = _Stream("forward", log)
        s.copy_stream = _Stream("copy", log)

        @contextlib.contextmanager
        def on_copy_stream():
            log.append(("enter", "copy"))
            yield
            log.append(("exit", "copy"))

        s.copy_stream_ctx = on_copy_stream()
        s.enable_async_d2h_copy = False
        result = SimpleNamespace(copy_to_cpu=lambda **kw: log.append(("copy_to_cpu", kw)))
        batch = SimpleNamespace(return_logprob=False, return_hidden_states=wants_hidden)
        s._copy_result_to_cpu(result, batch)
        assert ("wait", "copy", "forward") in log, "copy_stream must wait on forward_stream before reading results"
        copies = [e for e in log if e[0] == "copy_to_cpu"]
        assert len(copies) == 1, f"exactly one result copy expected, got {log}"
        i_wait, i_enter, i_copy = (log.index(("wait", "copy", "forward")), log.index(("enter", "copy")),
                                   log.index(copies[0]))
        assert i_wait < i_enter < i_copy < log.index(("exit", "copy")), f"copy not issued on copy_stream: {log}"
        assert copies[0][1].get("return_hidden_states") is wants_hidden, (
            f"the batch's return_hidden_states={wants_hidden} must reach copy_to_cpu, got {copies[0][1]}"
        )


def test_installed_copy_gates_hidden_states(monkeypatch):
    check_hidden_states_copied_only_when_requested(monkeypatch)


def test_installed_scheduler_copies_on_copy_stream():
    check_scheduler_copies_on_copy_stream()


def test_check_detects_unconditional_hidden_copy(monkeypatch):
    rm.check_catches_mutant(
        monkeypatch, GenerationBatchResult, "copy_to_cpu",
        rm.DropConjunct("return_hidden_states"),
        check_hidden_states_copied_only_when_requested, monkeypatch,
    )


def test_check_detects_flag_not_forwarded(monkeypatch):
    rm.check_catches_mutant(
        monkeypatch, Scheduler, "_copy_result_to_cpu",
        rm.DropCallKeyword("return_hidden_states"),
        check_scheduler_copies_on_copy_stream,
    )


def test_check_detects_copy_without_stream_wait(monkeypatch):
    rm.check_catches_mutant(
        monkeypatch, Scheduler, "_copy_result_to_cpu",
        rm.DropStatements("wait_stream"),
        check_scheduler_copies_on_copy_stream,
    )


@pytest.mark.gpu(reason=(
    "proves on CUDA that copy_to_cpu leaves hidden states on the device unless requested and that the other "
    "results land in pinned host memory (what makes the copy_stream copy asynchronous); not run here: no GPU node "
    "with SGLang exists for this project"
))
def test_gpu_result_copy_is_pinned_and_skips_hidden_states():
    res = _result()
    res.logits_output.hidden_states = res.logits_output.hidden_states.cuda()
    res.next_token_ids = res.next_token_ids.cuda()
    res.copy_done = torch.cuda.Event()
    res.copy_to_cpu(return_logprob=False, return_hidden_states=False)
    res.copy_done.synchronize()
    assert res.logits_output.hidden_states.is_cuda
    assert res.next_token_ids.device.type == "cpu" and res.next_token_ids.is_pinned()
    assert res.next_token_ids.tolist() == [0, 1, 2, 3]
