"""host_dedup/hooks.py: what a rank that does not run deduplicated says at attach."""

import logging
from types import SimpleNamespace

import pytest

from sglang_glm_ext.host_dedup import hooks
from sglang_glm_ext.host_dedup.plan import DedupPlan

WHY = "MHA KV: each TP rank holds its own heads, nothing is replicated"


@pytest.mark.parametrize("mode, level", [("on", logging.WARNING), ("auto", logging.INFO)])
def test_a_rank_left_with_its_own_host_copy_says_why_at_attach(monkeypatch, caplog, mode, level):
    monkeypatch.setattr(hooks, "_device_plan", lambda dev: DedupPlan(mode, False, WHY))
    controller = SimpleNamespace(mem_pool_device=None)
    with caplog.at_level(logging.INFO, logger=hooks.logger.name):
        assert hooks.hook_controller_init("made", controller) == "made"
    said = [r for r in caplog.records if r.name == hooks.logger.name]
    assert len(said) == 1 and said[0].levelno == level
    assert f"--hicache-host-dedup {mode}" in said[0].getMessage() and WHY in said[0].getMessage()
    assert not hasattr(controller, hooks.RUN_ATTR)  # nothing of the dedup run is hung on the controller


def test_off_is_silent(monkeypatch, caplog):
    monkeypatch.setattr(hooks, "_device_plan", lambda dev: DedupPlan("off", False, "switched off"))
    with caplog.at_level(logging.DEBUG, logger=hooks.logger.name):
        hooks.hook_controller_init(None, SimpleNamespace(mem_pool_device=None))
    assert not [r for r in caplog.records if r.name == hooks.logger.name]
