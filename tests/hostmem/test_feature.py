"""hostmem's two feature rows: host_register and hugepages, each with its own env var, patches and availability."""

from sglang_glm_ext.hostmem import feature, patches
from sglang_glm_ext.patching.ledger import Ledger, PatchStatus, State
from sglang_glm_ext.plugin import features, registry


def test_both_rows_are_registered_always_on_with_their_own_env_var_and_patches():
    rows = {f.name: (f, ps) for f, ps in registry.ROWS}
    assert rows["host_register"] == (feature.FEATURE, patches.PATCHES)
    assert rows["hugepages"] == (feature.HUGEPAGES, patches.HUGEPAGES_PATCHES)
    assert feature.FEATURE.always_on and feature.HUGEPAGES.always_on
    assert feature.FEATURE.env == (feature.HOST_REGISTER_MAX_GB,)
    assert feature.HUGEPAGES.env == (feature.HUGEPAGE_FALLBACK,)
    assert registry.feature_of(feature.HUGEPAGE_FALLBACK) is feature.HUGEPAGES  # the flag table's owner column
    assert [p.id for p in patches.HUGEPAGES_PATCHES] == [
        "hugepages.launch_check", "hugepages.ram_check", "hugepages.alloc_check", "hugepages.no_fallback"]


def test_a_hugepage_patch_that_did_not_land_leaves_the_ceiling_check_available(monkeypatch):
    ledger = Ledger(registry.PATCHES)
    for p in registry.PATCHES:
        ledger.status[p.id] = PatchStatus(p, State.APPLIED)
    bad = patches.HUGEPAGES_PATCHES[2]
    ledger.status[bad.id] = PatchStatus(bad, State.FAILED, "target moved")
    monkeypatch.setattr(features, "ledger_state", lambda: ledger)
    assert features.why_unavailable(feature.FEATURE) == ""
    assert features.why_unavailable(feature.HUGEPAGES) == "patch hugepages.alloc_check failed: target moved"
