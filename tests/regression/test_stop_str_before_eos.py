"""Speculative step that accepts a stop string and EOS together; invalid token ids sanitised before decoding.

Guards seed lines 42-51 (second half of that commit: "Check stop strings before token-based EOS after sanitizing
invalid token ids, and set finished_len at the matched stop position so trailing accepted tokens do not leak";
upstream PRs #28802, #33758; 0.5.23 managers/schedule_batch.py `Req.update_finish_state`).

Drives the installed `Req.update_finish_state` with a fake tokenizer on CPU.
"""

from __future__ import annotations

from array import array

import regression_mutants as rm

from sglang.srt.managers.schedule_batch import FINISH_MATCHED_STR, Req
from sglang.srt.sampling.sampling_params import SamplingParams

STOP_ID, EOS_ID, VOCAB = 1, 2, 1000
TEXT = {STOP_ID: "STOP", EOS_ID: "", **{i: chr(ord("a") + i % 26) for i in range(10, 40)}}


class _Tokenizer:
    eos_token_id = -1
    additional_stop_token_ids = None

    def decode(self, ids):
        # A real tokenizer fails (or returns garbage) on an id outside the vocabulary: make that loud here, so
        # decoding before sanitising shows up as an error.
        return "".join(TEXT[int(i)] for i in ids)


class _CharTokenizer:
    def encode(self, s, add_special_tokens=False):
        return list(range(len(s)))


def _req(output_ids, stop=None):
    sp = SamplingParams(max_new_tokens=100, stop=stop)
    sp.normalize(tokenizer=_CharTokenizer())
    req = Req(
        rid="r", origin_input_text="", origin_input_ids=array("q", [0]), sampling_params=sp,
        eos_token_ids={EOS_ID}, vocab_size=VOCAB,
    )
    req.tokenizer = _Tokenizer()
    req.output_ids = array("q", output_ids)
    return req


def check_stop_str_wins_over_eos() -> None:
    # One speculative step accepted 5 tokens: "a b STOP <eos> c". The stop string must win, finished_len must end
    # right after STOP, and neither EOS nor the trailing "c" may be emitted.
    req = _req([10, 11, STOP_ID, EOS_ID, 12], stop=["STOP"])
    req.update_finish_state(new_accepted_len=5)
    assert req.finished(), "a step containing a stop string and EOS must finish the request"
    assert isinstance(req.finished_reason, FINISH_MATCHED_STR) and req.finished_reason.matched == "STOP", (
        f"stop string must win over EOS in the same step, got {req.finished_reason!r}"
    )
    assert req.finished_len == 3, f"finished_len must end at the stop string (3), got {req.finished_len}"
    assert list(req.output_ids[: req.finished_len]) == [10, 11, STOP_ID], "trailing accepted tokens leak"


def check_invalid_token_ids_sanitised() -> None:
    # A NaN-sampled / out-of-vocabulary id (here VOCAB + 5 and -1) must be replaced before any string decode: the
    # request finishes at that position instead of decoding the id (which raises KeyError in this tokenizer).
    for bad in (VOCAB + 5, -1):
        req = _req([10, 11, bad, 12], stop=["STOP"])
        try:
            req.update_finish_state(new_accepted_len=3)
        except KeyError as exc:
            raise AssertionError(f"token id {bad} reached the tokenizer before it was sanitised") from exc
        assert req.finished(), f"an invalid token id {bad} must finish the request"
        assert req.finished_len == 3, f"finished at the invalid id (3), got {req.finished_len}"
        assert req.output_ids[2] == EOS_ID, f"invalid id {bad} must be replaced by EOS, got {req.output_ids[2]}"


def test_installed_stop_str_wins_over_eos():
    check_stop_str_wins_over_eos()


def test_installed_sanitises_invalid_token_ids():
    check_invalid_token_ids_sanitised()


def test_check_detects_eos_before_stop(monkeypatch):
    # The pre-fix order: the token-based (EOS) check runs before the string check in update_finish_state.
    rm.check_catches_mutant(
        monkeypatch, Req, "update_finish_state",
        rm.SwapIfBlocks("_check_str_based_finish", "_check_token_based_finish"),
        check_stop_str_wins_over_eos,
    )


def test_check_detects_missing_finished_len_at_stop(monkeypatch):
    # The fork's other half: finished_len located at the stop. Without it the whole step (EOS and "c") is emitted.
    rm.check_catches_mutant(
        monkeypatch, Req, "_check_str_based_finish",
        rm.DropStatements("_locate_str_stop_finished_len"),
        check_stop_str_wins_over_eos,
    )


def test_check_detects_unsanitised_decode(monkeypatch):
    rm.check_catches_mutant(
        monkeypatch, Req, "update_finish_state",
        rm.DropIfBlocks("_check_vocab_boundary_finish"),
        check_invalid_token_ids_sanitised,
    )
