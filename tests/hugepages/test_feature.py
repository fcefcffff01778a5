"""hugepages' feature row: always on, with its own env var, patches and availability (apart from host_register's)."""

from sglang_glm_ext.host_register import feature as host_register
from sglang_glm_ext.hugepages import feature, patches
from sglang_glm_ext.patching.ledger import Ledger, PatchStatus, State
from sglang_glm_ext.plugin import features, registry


def test_the_row_is_registered_always_on_with_its_own_env_var_and_patches():
    rows = {f.name: (f, ps) for f, ps in registry.ROWS}
    assert rows["hugepages"] == (feature.FEATURE, patches.PATCHES)
    assert feature.FEATURE.always_on
    assert feature.FEATURE.env == (feature.HUGEPAGE_FALLBACK,)
    assert registry.feature_of(feature.HUGEPAGE_FALLBACK) is feature.FEATURE  # the flag table's owner column
    assert [p.id for p in patches.PATCHES] == [
        "hugepages.launch_check", "hugepages.ram_check", "hugepages.alloc_check", "hugepages.no_fallback"]


def test_a_hugepage_patch_that_did_not_land_leaves_the_ceiling_check_available(monkeypatch):
    ledger = Ledger(registry.PATCHES)
    for p in registry.PATCHES:
        ledger.status[p.id] = PatchStatus(p, State.APPLIED)
    bad = patches.PATCHES[2]
    ledger.status[bad.id] = PatchStatus(bad, State.FAILED, "target moved")
    monkeypatch.setattr(features, "ledger_state", lambda: ledger)
    assert features.why_unavailable(host_register.FEATURE) == ""
    assert features.why_unavailable(feature.FEATURE) == "patch hugepages.alloc_check failed: target moved"
