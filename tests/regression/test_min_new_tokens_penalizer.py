"""min_new_tokens penalizer: stop tokens masked to -inf without boolean-mask indexing.

Guards seed lines 31-41 (fork commit "min_new_tokens penalizer without boolean-mask indexing"; upstream PR #28397,
0.5.23 sampling/penaltylib/min_new_tokens.py `_apply`). The fork replaced `logits[mask] += penalties[mask]` with an
elementwise `torch.where` + in-place add: boolean-mask indexing is data-dependent (a nonzero/device->host sync every
decode step), and multiplying by a 0/1 mask would turn -inf into NaN.

The check runs the installed BatchedMinNewTokensPenalizer on CPU and records the aten ops of the apply step with a
TorchDispatchMode, so it looks at what runs, not at the source text.
"""

from __future__ import annotations

import weakref
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sglang.srt.sampling.penaltylib.min_new_tokens import BatchedMinNewTokensPenalizer
from sglang.srt.sampling.penaltylib.orchestrator import BatchedPenalizerOrchestrator

VOCAB = 16
EOS = 3
STOP = 7

# aten ops whose output size depends on tensor *values*: each one forces a device->host sync on CUDA.
_DATA_DEPENDENT = {"nonzero", "masked_select", "masked_scatter", "argwhere", "nonzero_static"}


class _Batch:
    """The orchestrator keeps a weakref to its batch and reads .reqs/.device; nothing else."""

    def __init__(self, reqs):
        self.reqs = reqs
        self.device = "cpu"


def _req(min_new_tokens: int):
    return SimpleNamespace(
        sampling_params=SimpleNamespace(min_new_tokens=min_new_tokens, stop_token_ids={STOP}),
        eos_token_ids={EOS},
        tokenizer=SimpleNamespace(additional_stop_token_ids=None, eos_token_id=EOS),
    )


class _OpRecorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((func.overloadpacket.__name__, args))
        return func(*args, **(kwargs or {}))


def _bool_index_ops(ops) -> list[str]:
    bad = []
    for name, args in ops:
        if name in _DATA_DEPENDENT:
            bad.append(name)
        elif name in ("index", "index_put", "index_put_", "_index_put_impl_"):
            # aten.index(self, indices) with a bool/uint8 mask is boolean-mask indexing; integer indices are fine.
            indices = args[1] if len(args) > 1 else ()
            if any(isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8) for t in indices or ()):
                bad.append(f"{name}(bool mask)")
    return bad


def check_min_new_tokens_apply() -> None:
    """Raises AssertionError when the installed penalizer regresses on any part of seed 31-41."""
    # Row 0 still needs tokens (min 3); row 1 has no minimum; row 2 reaches its minimum (1) after one step.
    batch = _Batch([_req(3), _req(0), _req(1)])
    orch = BatchedPenalizerOrchestrator(vocab_size=VOCAB, batch=batch, penalizers={BatchedMinNewTokensPenalizer})
    assert orch.is_required, "min_new_tokens > 0 must make the penalizer required"
    pen = orch.penalizers[BatchedMinNewTokensPenalizer]

    logits = torch.zeros(3, VOCAB)
    rec = _OpRecorder()
    with rec:
        orch.apply(logits)
    bad = _bool_index_ops(rec.ops)
    assert not bad, f"apply step runs data-dependent boolean-mask ops {bad} (sync on the decode hot path)"
    assert not torch.isnan(logits).any(), "apply produced NaN (a -inf penalty multiplied by a 0 mask?)"
    for row in (0, 2):
        assert logits[row, EOS] == float("-inf") and logits[row, STOP] == float("-inf"), (
            f"row {row} is under its min_new_tokens: EOS and stop tokens must be -inf, got {logits[row].tolist()}"
        )
    assert torch.isfinite(logits[1]).all(), "a request without min_new_tokens must not be penalized"
    others = [t for t in range(VOCAB) if t not in (EOS, STOP)]
    assert (logits[:, others] == 0).all(), "non-stop tokens must be left untouched"

    # One output token later row 2 has met its minimum; row 0 (min 3) has not.
    orch.cumulate_output_tokens(torch.zeros(3, dtype=torch.int64))
    logits = torch.zeros(3, VOCAB)
    orch.apply(logits)
    assert not torch.isnan(logits).any()
    assert logits[0, EOS] == float("-inf"), "row 0 is still under its minimum after 1 token"
    assert torch.isfinite(logits[2]).all(), "row 2 met min_new_tokens=1: its stop tokens must be allowed again"
    assert pen.len_output_tokens.tolist() == [[1], [1], [1]]


def test_installed_penalizer_has_the_fix():
    check_min_new_tokens_apply()


def _apply_boolean_mask(self, logits):
    # The pre-fix shape of the code (seed 31-41 "Rejected"): expand the row mask and write through logits[mask].
    mask = (self.len_output_tokens < self.min_new_tokens).expand_as(logits)
    logits[mask] += self.stop_token_penalties[mask]


def _apply_multiply_mask(self, logits):
    # A tempting "sync-free" variant the fork's commit rules out: -inf * 0 is NaN for rows past their minimum.
    mask = (self.len_output_tokens < self.min_new_tokens).to(logits.dtype)
    logits.add_(self.stop_token_penalties * mask)


@pytest.mark.parametrize("broken", [_apply_boolean_mask, _apply_multiply_mask], ids=["bool-mask", "mask-multiply"])
def test_check_detects_broken_penalizer(monkeypatch, broken):
    monkeypatch.setattr(BatchedMinNewTokensPenalizer, "_apply", broken)
    with pytest.raises(AssertionError):
        check_min_new_tokens_apply()
