"""Whether a feature can work in this process, and the refusal of a launch that switched on one that cannot."""

import dataclasses

import pytest

from sglang_glm_ext.declare import PluginFlagError, Tier
from sglang_glm_ext.patching.ledger import Ledger, PatchStatus, State
from sglang_glm_ext.plugin import features, register
from sglang_glm_ext.plugin.registry import FEATURE_BY_NAME, PATCHES

CG = FEATURE_BY_NAME["cg_mem"]
L3 = FEATURE_BY_NAME["l3"]
HOST = FEATURE_BY_NAME["host_register"]


def _ledger(monkeypatch, state_of=lambda p: State.APPLIED, detail=""):
    led = Ledger(PATCHES, {p.id: PatchStatus(p, state_of(p), detail) for p in PATCHES})
    monkeypatch.setattr(register, "_LEDGER", led)
    return led


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.delenv("SGLANG_LOG_CG_BUFFERS", raising=False)


def test_available_when_every_patch_of_the_feature_applied(monkeypatch):
    _ledger(monkeypatch)
    assert features.why_unavailable(CG) == "" and features.why_unavailable(HOST) == ""


def test_a_declared_unavailable_feature_says_why_whatever_the_patches(monkeypatch):
    # No feature of this build is declared unavailable any more (L3 lost its reason when its backend landed):
    # the rule is checked on a record of the same shape.
    _ledger(monkeypatch)
    assert features.why_unavailable(L3) == ""
    held_back = dataclasses.replace(L3, unavailable="its wiring into SGLang's HiCache is not in this build")
    assert "HiCache" in features.why_unavailable(held_back)


def test_demo_tier_patches_never_make_their_feature_unavailable(monkeypatch):
    # register() never applies the CPU stand-ins: their skipped state says nothing about serving L3. A skipped or
    # failed serving patch of the same feature still does.
    led = _ledger(monkeypatch, lambda p: State.SKIPPED if p.tier is Tier.DEMO else State.APPLIED, "demo/test-only")
    assert any(p.tier is Tier.DEMO and p.feature is L3 for p in led.patches)
    assert features.why_unavailable(L3) == ""
    _ledger(monkeypatch, lambda p: State.SKIPPED if p.tier is Tier.DEMO or p.id == "l3.translate_flags"
            else State.APPLIED, "gone")
    assert features.why_unavailable(L3) == "patch l3.translate_flags skipped: gone"


def test_unregistered_plugin_makes_every_feature_unavailable(monkeypatch):
    monkeypatch.setattr(register, "_LEDGER", None)
    assert "did not register" in features.why_unavailable(CG)


def test_a_patch_not_applied_names_itself_and_touches_only_its_feature(monkeypatch):
    _ledger(monkeypatch, lambda p: State.FAILED if p.id == "cg_mem.capture" else State.APPLIED, "target moved")
    assert features.why_unavailable(CG) == "patch cg_mem.capture failed: target moved"
    assert features.why_unavailable(HOST) == ""
    _ledger(monkeypatch, lambda p: State.SKIPPED if p.feature is CG else State.APPLIED, "outside its versions")
    assert "cg_mem.capture skipped: outside its versions" in features.why_unavailable(CG)


def test_switched_on_unavailable_feature_refuses_by_flag_or_env_var(monkeypatch):
    _ledger(monkeypatch, lambda p: State.FAILED if p.feature is CG else State.APPLIED, "gone")
    features.require_switched_on_available({"log_cuda_graph_buffers": False})  # off: nothing to refuse
    with pytest.raises(PluginFlagError, match="feature 'cg_mem' cannot work: patch cg_mem.capture failed: gone"):
        features.require_switched_on_available({"log_cuda_graph_buffers": True})
    monkeypatch.setenv("SGLANG_LOG_CG_BUFFERS", "1")
    with pytest.raises(PluginFlagError, match="feature 'cg_mem' cannot work"):
        features.require_switched_on_available({"log_cuda_graph_buffers": False})


def test_always_on_checks_never_refuse_a_launch(monkeypatch):
    # host_register is a safety check: even with its patch failed it is reported (doctor), not a launch refusal.
    _ledger(monkeypatch, lambda p: State.FAILED if p.feature is HOST else State.APPLIED, "gone")
    assert features.why_unavailable(HOST)
    features.require_switched_on_available({})
