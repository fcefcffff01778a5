"""The per-batch MegaMoE decision: capture-time and token-cap gating, never STOCK under megamoe, rank-consistent."""

import itertools
import random

import pytest

from sglang_glm_ext.megamoe.select import (NOT_READY, OVER_CAP, Decision, GateInputs, MegaMoEMissError, Path, decide,
                                           miss_message, reason_text, tokens_per_rank)


def inp(**kw):
    base = dict(megamoe=True, weights_ready=True, capture=False, global_num_tokens=None, local_rows=8, cap=64)
    base.update(kw)
    return GateInputs(**base)


def test_not_megamoe_is_stock_whatever_else():
    assert decide(inp(megamoe=False, weights_ready=False, local_rows=10**6)).path is Path.STOCK


def test_capture_takes_the_kernel_even_above_the_cap():
    d = decide(inp(capture=True, local_rows=1000))
    assert d.mega and d.tokens_per_rank == 1000


def test_token_cap_gating_is_inclusive():
    assert decide(inp(local_rows=64)).mega
    d = decide(inp(local_rows=65))
    assert d.path is Path.REFUSE and d.reason == OVER_CAP
    assert "65 tokens per rank exceed" in reason_text(d, 64) and "=64" in reason_text(d, 64)


def test_a_layer_that_keeps_a_fallback_misses_instead_of_refusing():
    d = decide(inp(local_rows=65, fallback=True))
    assert d.path is Path.MISS and d.reason == OVER_CAP and d.tokens_per_rank == 65
    assert decide(inp(local_rows=64, fallback=True)).mega
    d = decide(inp(weights_ready=False, fallback=True, local_rows=3))
    assert d.path is Path.MISS and d.reason == NOT_READY  # every batch of a layer MegaMoE cannot read
    # capture takes the kernel when the layer has one; a layer without MegaMoE weights captures its miss path
    assert decide(inp(capture=True, local_rows=1000, fallback=True)).mega
    assert decide(inp(capture=True, weights_ready=False, fallback=True)).path is Path.MISS


def test_weights_not_ready_refuses_even_in_capture():
    d = decide(inp(weights_ready=False, capture=True))
    assert d.path is Path.REFUSE and d.reason == NOT_READY and "no MegaMoE weights" in reason_text(d, 64)


def test_global_counts_win_over_local_rows_except_under_dsa_prefill_cp():
    assert tokens_per_rank(inp(global_num_tokens=[3, 70, 5], local_rows=3)) == 70
    assert tokens_per_rank(inp(global_num_tokens=[3, 70, 5], local_rows=3, use_global_num_tokens=False)) == 3
    assert tokens_per_rank(inp(global_num_tokens=[], local_rows=9)) == 9


def test_rank_consistent_under_dp_attention():
    # Two DP ranks with different local rows see one all-gathered list: they decide alike, refuse alike.
    for counts in ([10, 3000], [64, 64], [0, 65], [65, 0], [0, 0]):
        decisions = {decide(inp(global_num_tokens=counts, local_rows=rows)) for rows in counts}
        assert len(decisions) == 1, (counts, decisions)


def test_decision_is_a_function_of_rank_identical_inputs_only():
    # Property: the decision never depends on local_rows when a global list exists, and is never STOCK under
    # megamoe; random sweep over every input.
    rng = random.Random(0)
    for _ in range(2000):
        counts = [rng.randrange(0, 200) for _ in range(rng.randrange(1, 5))]
        common = dict(weights_ready=rng.random() < 0.8, capture=rng.random() < 0.3, global_num_tokens=counts,
                      cap=rng.choice([1, 64, 128, 8192]), fallback=rng.random() < 0.5)
        results = {decide(inp(local_rows=rng.randrange(0, 300), **common)) for _ in range(3)}
        assert len(results) == 1
        assert next(iter(results)).path is not Path.STOCK


def test_miss_message_names_layer_cause_and_fix():
    msg = miss_message("GLM-4 MoE layer 7", Decision(Path.REFUSE, 70, OVER_CAP), 64)
    assert "layer 7" in msg and "70 tokens" in msg and "wrong tokens" in msg and "--moe-a2a-backend" in msg
    assert issubclass(MegaMoEMissError, RuntimeError)
