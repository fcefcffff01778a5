"""Spec-v2 draft extend: token ids int64; padded seq_lens_sum restored after draft CUDA-graph replay.

Guards seed lines 106-115 (fork commit "Spec-v2 draft extend can receive token ids from producers whose dtype is
not already int64 ... EAGLE draft CUDA graph replay also pads raw batches to a captured batch size, so the
metadata/replay path must see seq_lens_sum consistent with the padded seq_lens and then restore the caller-visible
raw value"; upstream PR #26880; 0.5.23 speculative/eagle_worker_v2.py `EagleDraftWorker._draft_extend_for_decode`,
speculative/eagle_draft_cuda_graph_runner.py `EAGLEDraftCudaGraphRunner.execute`).

CPU: `_draft_extend_for_decode` runs up to `prepare_for_draft_extend` (replaced by a probe); `execute` runs on a
runner built with __new__ whose graph replay is a probe, as upstream's test_eagle_draft_cuda_graph_runner.py does.
On CUDA the int64 ids come from the Triton kernel `prepare_draft_extend_inputs`: GPU-marked test below.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import regression_mutants as rm
import torch

import sglang.srt.speculative.eagle_worker_v2 as ew2
from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

DRAFT_TOKENS = 3


class _Stop(Exception):
    """Ends _draft_extend_for_decode once it has handed its inputs over."""


def _draft_worker():
    w = EagleDraftWorker.__new__(EagleDraftWorker)
    w.device = "cpu"
    w.speculative_num_draft_tokens = DRAFT_TOKENS
    w.plan_stream = None
    w.plan_stream_ctx = contextlib.nullcontext()
    w.draft_runner = SimpleNamespace(canary_manager=None)
    w.cuda_graph_runner_for_draft_extend = None
    return w


def _batch_result(ids_dtype):
    return SimpleNamespace(
        prepared_draft_extend_inputs=None,
        accept_lens=torch.tensor([2, 1], dtype=torch.int32),
        next_token_ids=torch.arange(2 * DRAFT_TOKENS, dtype=ids_dtype),
        logits_output=SimpleNamespace(hidden_states=torch.zeros(2 * DRAFT_TOKENS, 4)),
    )


def check_draft_extend_ids_int64(monkeypatch) -> None:
    for dtype in (torch.int32, torch.int64):
        seen = {}

        def probe(draft_extend_input, batch, next_token_ids, *args, **kwargs):
            seen["ids"] = next_token_ids
            raise _Stop

        monkeypatch.setattr(ew2, "prepare_for_draft_extend", probe)
        with pytest.raises(_Stop):
            _draft_worker()._draft_extend_for_decode(SimpleNamespace(seq_lens=torch.tensor([5, 6])),
                                                     _batch_result(dtype))
        ids = seen["ids"]
        assert ids.dtype == torch.int64, f"draft-extend token ids from a {dtype} producer arrive as {ids.dtype}"
        assert ids.tolist() == list(range(2 * DRAFT_TOKENS)), "the cast must not change the ids"


CAPTURE_BS, FILL, STEPS = 4, 1, 3


def _graph_runner(observations):
    r = EAGLEDraftCudaGraphRunner.__new__(EAGLEDraftCudaGraphRunner)
    r.buffers = SimpleNamespace(
        seq_lens=torch.empty(CAPTURE_BS, dtype=torch.int32),
        out_cache_loc=torch.empty(CAPTURE_BS * STEPS, dtype=torch.int64),
        positions=torch.empty(CAPTURE_BS, dtype=torch.int64), rids_int=None, bootstrap_room_ids_int=None,
        topk_p=torch.empty(CAPTURE_BS, 1), topk_index=torch.empty(CAPTURE_BS, 1, dtype=torch.int64),
        draft_probs=None, hidden_states=torch.empty(CAPTURE_BS, 2),
        req_pool_indices=torch.empty(CAPTURE_BS, dtype=torch.int32),
        seq_lens_cpu=torch.empty(CAPTURE_BS, dtype=torch.int32), dsa_seed_topk=None, mrope_positions=None,
    )
    r.deepep_adapter = SimpleNamespace(replay=lambda: None)
    r.capture_bs = [1, CAPTURE_BS]
    r.captured_req_width = 1
    r.speculative_num_steps = STEPS
    r.seq_len_fill_value = FILL
    r.require_mlp_tp_gather = False
    r.require_gathered_buffer = False
    r.model_runner = SimpleNamespace(model_config=SimpleNamespace(vocab_size=8, model_is_mrope=False),
                                     device_timer=None)

    def observe(phase, fb):
        observations.append((phase, fb.batch_size, fb.seq_lens_sum, int(fb.seq_lens.sum())))

    r.draft_attn_backend = SimpleNamespace(init_forward_metadata_out_graph=lambda fb: observe("metadata", fb))
    r._replay_graph = lambda key, fb: observe("replay", fb)
    r._make_graph_key = lambda bs, variant_label=None: bs
    r._sampling_variant = lambda fb: None
    r._postprocess_output_to_raw_bs = lambda out, raw_bs: out
    return r


def check_seq_lens_sum_padded_then_restored(monkeypatch) -> None:
    import sglang.srt.speculative.eagle_draft_cuda_graph_runner as runner_mod

    monkeypatch.setattr(runner_mod, "get_spec", lambda: SimpleNamespace(speculative_use_rejection_sampling=False))
    raw = [10, 11]  # raw_bs=2 pads to the captured bs=4 with rows of length FILL
    obs = []
    fb = SimpleNamespace(
        batch_size=len(raw), seq_lens=torch.tensor(raw, dtype=torch.int32),
        seq_lens_cpu=torch.tensor(raw, dtype=torch.int32), seq_lens_sum=sum(raw),
        out_cache_loc=torch.arange(len(raw) * STEPS), positions=torch.arange(len(raw)),
        req_pool_indices=torch.arange(len(raw), dtype=torch.int32), rids_int=None, bootstrap_room_ids_int=None,
        sampling_info=None, mrope_positions=None,
        spec_info=SimpleNamespace(topk_p=torch.ones(2, 1), topk_index=torch.zeros(2, 1, dtype=torch.int64),
                                  draft_probs=None, hidden_states=torch.zeros(2, 2), dsa_topk_indices=None),
    )
    _graph_runner(obs).execute(fb)
    assert [o[0] for o in obs] == ["metadata", "replay"], f"expected metadata build then replay, got {obs}"
    padded = sum(raw) + (CAPTURE_BS - len(raw)) * FILL
    for phase, bs, seq_lens_sum, actual in obs:
        assert bs == CAPTURE_BS, f"{phase}: batch not padded to the captured size"
        assert seq_lens_sum == actual == padded, (
            f"{phase}: seq_lens_sum={seq_lens_sum} but the padded seq_lens sum to {actual} (expected {padded})"
        )
    assert fb.batch_size == len(raw) and fb.seq_lens_sum == sum(raw), (
        f"caller's seq_lens_sum must be restored after replay: got {fb.seq_lens_sum}, expected {sum(raw)}"
    )


def test_installed_draft_extend_ids_int64(monkeypatch):
    check_draft_extend_ids_int64(monkeypatch)


def test_installed_seq_lens_sum_padded_then_restored(monkeypatch):
    check_seq_lens_sum_padded_then_restored(monkeypatch)


def test_check_detects_missing_int64_cast(monkeypatch):
    rm.check_catches_mutant(
        monkeypatch, EagleDraftWorker, "_draft_extend_for_decode",
        rm.UnwrapMethodCall("to", "torch.int64"),
        check_draft_extend_ids_int64, monkeypatch,
    )


def test_check_detects_seq_lens_sum_not_padded(monkeypatch):
    rm.check_catches_mutant(
        monkeypatch, EAGLEDraftCudaGraphRunner, "execute",
        rm.DropIfBlocks("raw_seq_lens_sum is not None"),
        check_seq_lens_sum_padded_then_restored, monkeypatch,
    )


def test_check_detects_seq_lens_sum_not_restored(monkeypatch):
    rm.check_catches_mutant(
        monkeypatch, EAGLEDraftCudaGraphRunner, "execute",
        rm.DropStatements("forward_batch.seq_lens_sum = raw_seq_lens_sum", exact=True),
        check_seq_lens_sum_padded_then_restored, monkeypatch,
    )


@pytest.mark.gpu(reason=(
    "proves the CUDA path of draft extend (Triton prepare_draft_extend_inputs, used whenever accept_lens is on the "
    "GPU) also hands int64 token ids to the plan stream from an int32 producer; not run here: no GPU node with "
    "SGLang exists for this project"
))
def test_gpu_prepare_draft_extend_inputs_emits_int64():
    from sglang.kernels.ops.speculative.eagle import prepare_draft_extend_inputs

    accept = torch.tensor([2, 1], dtype=torch.int32, device="cuda")
    ids32 = torch.arange(2 * DRAFT_TOKENS, dtype=torch.int32, device="cuda")
    _, select, ids = prepare_draft_extend_inputs(accept, ids32, DRAFT_TOKENS)
    assert ids.dtype == torch.int64 and select.dtype == torch.int64
    assert ids.cpu().tolist() == ids32.cpu().tolist()
