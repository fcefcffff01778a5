"""`--moe-a2a-backend megamoe`: accepted on the CLI, ep_size forced to tp_size, MoE layers bypass DeepEP.

Guards seed line 30 (fork commit "Add the MegaMoE A2A backend name to server argument choices and MoE backend enums,
wire the startup handling that forces ep_size to tp_size ... Treat MegaMoE as a dispatcher bypass so it does not
enter DeepEP dispatcher logic"). 0.5.23: arg_groups/fields/exec_.py (choice), arg_groups/overrides.py
`_a2a_ep_size` (post-process pass), layers/moe/fused_moe_triton/layer.py `create_moe_dispatcher` (megamoe ->
StandardDispatcher). The fork-era env flags are gone upstream (deep_gemm now refuses DG_USE_FP4_ACTS), so none is
checked here; research/megamoe.md has the details.
"""

from __future__ import annotations

import argparse
import ast
from types import SimpleNamespace

import pytest
import regression_mutants as rm

import sglang.srt.arg_groups.overrides as overrides
import sglang.srt.layers.moe.fused_moe_triton.layer as moe_layer
import sglang.srt.layers.moe.token_dispatcher.standard as standard
from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatcher
from sglang.srt.layers.moe.utils import MoeA2ABackend
from sglang.srt.server_args import ServerArgs


def check_cli_accepts_megamoe() -> None:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    try:
        args = parser.parse_args(["--model-path", "m", "--moe-a2a-backend", "megamoe", "--tp-size", "8"])
    except SystemExit as exc:  # argparse rejects an unknown choice by exiting
        raise AssertionError("--moe-a2a-backend megamoe is not an accepted choice") from exc
    assert args.moe_a2a_backend == "megamoe"
    assert MoeA2ABackend("megamoe").is_megamoe()


def check_ep_size_follows_tp_size() -> None:
    assert overrides._a2a_ep_size in overrides.POST_PROCESS_PASSES, "the ep_size pass is no longer registered"
    for tp, ep in ((8, 1), (4, 2), (16, 16)):
        view = SimpleNamespace(moe_a2a_backend="megamoe", ep_size=ep, tp_size=tp)
        assert overrides._a2a_ep_size(view) == {"ep_size": tp}, f"megamoe with tp={tp}, ep={ep} must force ep_size={tp}"
    # Control: without an EP-spanning backend the pass leaves ep_size alone (so the check above is not vacuous).
    assert overrides._a2a_ep_size(SimpleNamespace(moe_a2a_backend="none", ep_size=1, tp_size=8)) == {}


def check_megamoe_dispatcher_is_standard(monkeypatch) -> None:
    monkeypatch.setattr(moe_layer, "get_moe_a2a_backend", lambda: MoeA2ABackend.MEGAMOE)
    monkeypatch.setattr(standard, "get_parallel", lambda: SimpleNamespace(moe_ep_size=8, moe_ep_rank=0))
    config = SimpleNamespace(runner_backend=None, top_k=8, num_experts=256, num_local_experts=32, hidden_size=64,
                             num_fused_shared_experts=0,
                             params_dtype=None)
    try:
        dispatcher = moe_layer.create_moe_dispatcher(config, quant_method=None)
    except Exception as exc:
        raise AssertionError(f"megamoe no longer takes the dispatcher bypass: {type(exc).__name__}: {exc}") from exc
    assert type(dispatcher) is StandardDispatcher, (
        f"megamoe must bypass DeepEP with a StandardDispatcher, got {type(dispatcher).__name__}"
    )


def test_installed_cli_accepts_megamoe():
    check_cli_accepts_megamoe()


def test_installed_ep_size_follows_tp_size():
    check_ep_size_follows_tp_size()


def test_installed_megamoe_bypasses_deepep(monkeypatch):
    check_megamoe_dispatcher_is_standard(monkeypatch)


def test_check_detects_missing_cli_choice(monkeypatch):
    original = ServerArgs.add_cli_args

    def add_cli_args_without_megamoe(parser):
        original(parser)
        for action in parser._actions:
            if "--moe-a2a-backend" in action.option_strings:
                action.choices = [c for c in action.choices if c != "megamoe"]

    monkeypatch.setattr(ServerArgs, "add_cli_args", staticmethod(add_cli_args_without_megamoe))
    with pytest.raises(AssertionError):
        check_cli_accepts_megamoe()


def test_check_detects_ep_size_not_forced(monkeypatch):
    monkeypatch.setattr(overrides, "_A2A_EP_SPANNING_BACKENDS", overrides._A2A_EP_SPANNING_BACKENDS - {"megamoe"})
    with pytest.raises(AssertionError):
        check_ep_size_follows_tp_size()


def test_check_detects_dispatcher_without_bypass(monkeypatch):
    rm.check_catches_mutant(
        monkeypatch, moe_layer, "create_moe_dispatcher",
        rm.DropConjunct("is_megamoe", op=ast.Or),
        check_megamoe_dispatcher_is_standard, monkeypatch,
    )
