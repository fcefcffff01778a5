"""ReasonerGrammarObject tracks current_token on the wrapper itself.

Guards seed lines 42-51 (first half: "ReasonerGrammarObject wraps an inner grammar, but disaggregated prebuilt
replay checks the wrapper current_token to avoid accepting an already accepted token twice"; upstream PR #29102;
0.5.23 constrained/reasoner_grammar_backend.py `accept_token` and `copy`).

The consumer is PD-decode `process_prebuilt` (disaggregation/decode_schedule_batch_mixin.py), which accepts the
last token only `if req.grammar.current_token is None`. If the wrapper never sets it, a retracted request
re-accepts its token -> "Tokens not accepted" -> FINISH_ABORT.
"""

from __future__ import annotations

import inspect

import regression_mutants as rm

from sglang.srt.constrained.base_grammar_backend import BaseGrammarObject
from sglang.srt.constrained.reasoner_grammar_backend import ReasonerGrammarObject
from sglang.srt.disaggregation.decode_schedule_batch_mixin import ScheduleBatchDisaggregationDecodeMixin

THINK_END = 99


class _InnerGrammar(BaseGrammarObject):
    """Counts accepts: the replay must not feed the same token twice."""

    def __init__(self, accepted=None):
        super().__init__()
        self.accepted = list(accepted or [])

    def accept_token(self, token: int) -> None:
        self.accepted.append(token)
        self.current_token = token

    def copy(self):
        return _InnerGrammar(self.accepted)


def _replay_last_token(grammar, token):
    # The guard process_prebuilt applies (checked against its source below).
    if grammar.current_token is None:
        grammar.accept_token(token)


def check_wrapper_tracks_current_token() -> None:
    inner = _InnerGrammar()
    g = ReasonerGrammarObject(inner, think_end_ids=[THINK_END])
    g.maybe_init_reasoning(True)
    assert g.current_token is None, "a fresh grammar has accepted nothing"
    for tok in (5, 6, THINK_END, 42):  # reasoning, end of reasoning, then grammar-constrained output
        g.accept_token(tok)
        assert g.current_token == tok, f"wrapper current_token must follow accept_token({tok}), got {g.current_token}"
    assert inner.accepted == [42], "only the post-reasoning token reaches the inner grammar"
    assert g.copy().current_token == 42, "copy() must carry current_token (retract/replay copies the grammar)"

    # A retracted request replayed through process_prebuilt must not re-accept its last token.
    before = list(inner.accepted)
    _replay_last_token(g, 42)
    assert inner.accepted == before, "token accepted twice on prebuilt replay"


def check_consumer_still_guards_on_current_token() -> None:
    # If process_prebuilt stops consulting current_token, the wrapper contract above no longer protects anything.
    src = inspect.getsource(ScheduleBatchDisaggregationDecodeMixin.process_prebuilt)
    assert "grammar.current_token is None" in src, "process_prebuilt no longer guards replay on current_token"


def test_installed_wrapper_tracks_current_token():
    check_wrapper_tracks_current_token()
    check_consumer_still_guards_on_current_token()


def test_check_detects_wrapper_not_tracking(monkeypatch):
    rm.check_catches_mutant(
        monkeypatch, ReasonerGrammarObject, "accept_token",
        rm.DropStatements("self.current_token = token"),
        check_wrapper_tracks_current_token,
    )


def test_check_detects_copy_dropping_current_token(monkeypatch):
    rm.check_catches_mutant(
        monkeypatch, ReasonerGrammarObject, "copy",
        rm.DropStatements("new_obj.current_token"),
        check_wrapper_tracks_current_token,
    )
