"""Spec-v2 EAGLE MTP index reuse: only when the model allows it and topk == 1; cleared after every draft forward.

Guards seed lines 72-81 (fork commit "EAGLE V2 draft MTP can avoid recomputing NSA/DSA indexer topk across internal
draft iterations ... enable reuse only for topk=1, and clear the transient state after draft_forward"; upstream PRs
#28192, #29654, #28609; 0.5.23 speculative/eagle_worker_v2.py `EagleDraftWorker._init_dsa_index_share_state`,
`draft_forward`, layers/attention/index_topk_share.py `IndexTopKShareState.mtp_iteration`).

Why topk == 1: select_top_k_tokens reorders hidden rows when topk > 1, so carried indexer top-k would no longer
line up with the hidden states. Why the cleanup: a stale `dsa_topk_indices` / `reuse_dsa_topk_indices` left on the
batch would make the next forward (verify, draft-extend) reuse indices computed for other tokens.

Runs the installed draft_forward on CPU with a fake draft model that plays the DSA indexer (it publishes top-k
indices on step 0 and records whether later steps were told to reuse them). The real reuse inside DSA attention
needs the DSA kernels and GLM-5 weights (docs_internal/regression_map.md).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import regression_mutants as rm
import torch

import sglang.srt.speculative.eagle_worker_v2 as ew2
from sglang.srt.layers.attention.index_topk_share import IndexTopKShareState
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

VOCAB, HIDDEN, BS, STEPS = 32, 4, 2, 3


def _worker(flag, topk):
    w = EagleDraftWorker.__new__(EagleDraftWorker)
    w.topk = topk
    cfg = SimpleNamespace(architectures=["GlmMoeDsaForCausalLMNextN"], index_topk=None)
    if flag is not None:
        cfg.index_share_for_mtp_iteration = flag
    w.draft_runner = SimpleNamespace(model_config=SimpleNamespace(hf_config=cfg, model_is_mrope=False),
                                     canary_manager=None)
    return w


def check_reuse_gating() -> None:
    cases = {(True, 1): True, (True, 2): False, (True, 4): False, (False, 1): False, (None, 1): False}
    for (flag, topk), expected in cases.items():
        w = _worker(flag, topk)
        w._init_dsa_index_share_state()
        assert bool(w.index_share_for_mtp_iteration) is expected, (
            f"index_share_for_mtp_iteration={flag}, topk={topk}: reuse must be {expected}"
        )


class _FakeIndexerModel:
    """Plays the draft model: step 0 computes (publishes) top-k indices; later steps should be told to reuse."""

    def __init__(self):
        self.seen = []  # (step, reuse flag, carried indices present) per forward

    def forward(self, fb):
        spec = fb.spec_info
        self.seen.append((len(self.seen), bool(fb.reuse_dsa_topk_indices), spec.dsa_topk_indices is not None))
        if fb.reuse_dsa_topk_indices and spec.dsa_topk_indices is None:
            spec.dsa_topk_indices = torch.zeros(BS, 8, dtype=torch.int32)  # what DSA's indexer publishes
        logits = torch.zeros(BS, VOCAB)
        logits[:, 5] = 1.0
        out = SimpleNamespace(next_token_logits=logits, hidden_states=torch.zeros(BS, HIDDEN))
        return SimpleNamespace(logits_output=out)


def _draft_forward_once(monkeypatch):
    w = _worker(True, 1)
    w._init_dsa_index_share_state()
    w.speculative_num_steps = STEPS
    w.speculative_num_draft_tokens = STEPS + 1
    w.hot_token_id = None
    model = _FakeIndexerModel()
    w.draft_runner.forward = model.forward
    w.draft_attn_backend = SimpleNamespace(attn_backends=[object()] * STEPS)
    w._topk1_parents_prealloc = torch.zeros(BS, STEPS, dtype=torch.int64)
    w._topk1_score_indices_prealloc = torch.zeros(BS, STEPS + 1, dtype=torch.int64)
    monkeypatch.setattr(ew2, "get_spec", lambda: SimpleNamespace(speculative_use_rejection_sampling=False))
    stale = torch.ones(BS, 8, dtype=torch.int32)  # left over from an earlier forward
    spec = SimpleNamespace(topk_p=torch.ones(BS, 1), topk_index=torch.zeros(BS, 1, dtype=torch.int64),
                           hidden_states=torch.zeros(BS, HIDDEN), dsa_topk_indices=stale)
    fb = SimpleNamespace(
        forward_mode=ForwardMode.DECODE, spec_info=spec, batch_size=BS,
        out_cache_loc=torch.arange(BS * STEPS, dtype=torch.int64), positions=torch.zeros(BS, dtype=torch.int64),
        sampling_info=SimpleNamespace(is_all_greedy=True), reuse_dsa_topk_indices=False, input_ids=None,
        moe_num_token_non_padded=None,
    )
    w.draft_forward(fb)
    return fb, model


def check_reuse_cleared_after_draft_forward(monkeypatch) -> None:
    fb, model = _draft_forward_once(monkeypatch)
    steps = model.seen
    assert len(steps) == STEPS - 1, f"expected {STEPS - 1} draft model forwards, saw {len(steps)}"
    assert all(reuse for _, reuse, _ in steps), "with reuse enabled every draft step must be told to reuse"
    assert steps[0][2] is False, "step 0 must recompute, not reuse indices left over from an earlier forward"
    assert all(carried for _, _, carried in steps[1:]), "steps after 0 must see step 0's indices"
    assert fb.spec_info.dsa_topk_indices is None, "carried top-k indices must be cleared after draft_forward"
    assert fb.reuse_dsa_topk_indices is False, "reuse flag must be cleared after draft_forward"


def check_cleared_on_error() -> None:
    # The cleanup is a `finally`: a failing draft step must not leave reuse switched on for the next forward.
    fb = SimpleNamespace(spec_info=SimpleNamespace(dsa_topk_indices=None), reuse_dsa_topk_indices=False)
    with pytest.raises(RuntimeError):
        with IndexTopKShareState.mtp_iteration(fb, enabled=True):
            fb.spec_info.dsa_topk_indices = torch.zeros(1)
            raise RuntimeError("draft step failed")
    assert fb.spec_info.dsa_topk_indices is None and fb.reuse_dsa_topk_indices is False, (
        "mtp_iteration must clear the carried indices and the reuse flag even when a step raises"
    )


def test_installed_reuse_gating():
    check_reuse_gating()


def test_installed_reuse_cleared_after_draft_forward(monkeypatch):
    check_reuse_cleared_after_draft_forward(monkeypatch)
    check_cleared_on_error()


def test_check_detects_missing_topk_guard(monkeypatch):
    rm.check_catches_mutant(
        monkeypatch, EagleDraftWorker, "_init_dsa_index_share_state",
        rm.DropConjunct("self.topk == 1"),
        check_reuse_gating,
    )


def test_check_detects_missing_config_gate(monkeypatch):
    rm.check_catches_mutant(
        monkeypatch, EagleDraftWorker, "_init_dsa_index_share_state",
        rm.DropConjunct("getattr(hf_config"),
        check_reuse_gating,
    )


def test_check_detects_missing_cleanup(monkeypatch):
    rm.check_catches_mutant(
        monkeypatch, IndexTopKShareState, "mtp_iteration",
        rm.DropFinally(),
        check_reuse_cleared_after_draft_forward, monkeypatch,
    )

