"""The ledger applies our hooks with SGLang's wrapping and proves each one is live, or says it failed."""

import sys
import types

import pytest

from sglang_glm_ext.patching import ledger as L


def hook_double(original, *args, **kwargs):
    return 2 * original(*args, **kwargs)


def hook_after_add(result, *args, **kwargs):
    return result + 100


def hook_after_times(result, *args, **kwargs):
    return result * 10


def not_a_hook(*a, **k):
    return None


@pytest.fixture
def fake(monkeypatch):
    mod = types.ModuleType("glm_ext_fake_mod")
    exec(
        "class Runner:\n"
        "    def capture(self, x):\n        return x\n"
        "    @classmethod\n    def build(cls, x):\n        return x\n"
        "    @staticmethod\n    def helper(x):\n        return x\n",
        mod.__dict__,
    )
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    this = sys.modules[__name__]
    monkeypatch.setitem(sys.modules, "glm_ext_test_hooks", this)
    return mod


def P(target, hook, hook_type="around", tier=L.Tier.FEATURE, id=None, after=()):
    return L.Patch(id=id or target, target=target, hook_type=hook_type, hook=f"glm_ext_test_hooks:{hook}",
                   feature="fake", tier=tier, reason="r", seed_lines="-", sglang_versions=("0",),
                   remove_when="-", signature=(), after=after)


def test_apply_verifies_hook_is_live(fake):
    st = L.apply_one(P("glm_ext_fake_mod.Runner.capture", "hook_double"), None)
    assert st.state is L.State.APPLIED
    assert fake.Runner().capture(3) == 6
    assert L.hook_in_chain("glm_ext_fake_mod.Runner.capture", hook_double)


def test_apply_is_idempotent(fake):
    p = P("glm_ext_fake_mod.Runner.capture", "hook_double")
    L.apply_one(p, None)
    st = L.apply_one(p, None)
    assert st.state is L.State.APPLIED and st.detail == "already applied"
    assert fake.Runner().capture(3) == 6  # not wrapped twice


def test_classmethod_and_staticmethod_stay_what_they_were(fake):
    assert L.apply_one(P("glm_ext_fake_mod.Runner.build", "hook_after_add", "after"), None).state is L.State.APPLIED
    assert L.apply_one(P("glm_ext_fake_mod.Runner.helper", "hook_double"), None).state is L.State.APPLIED
    assert isinstance(fake.Runner.__dict__["build"], classmethod)
    assert isinstance(fake.Runner.__dict__["helper"], staticmethod)
    assert fake.Runner.build(1) == 101 and fake.Runner.helper(4) == 8


def test_missing_target_is_a_failure_not_silence(fake):
    st = L.apply_one(P("glm_ext_fake_mod.Runner.gone", "hook_double"), None)
    assert st.state is L.State.FAILED and "gone" in st.detail


def test_missing_hook_is_a_failure(fake):
    st = L.apply_one(P("glm_ext_fake_mod.Runner.capture", "no_such_hook"), None)
    assert st.state is L.State.FAILED and "no_such_hook" in st.detail


def test_hook_that_did_not_land_is_detected(fake, monkeypatch):
    # A target whose setattr is swallowed (e.g. a read-only proxy) resolves fine but never runs our hook.
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.setattr(HookRegistry, "_apply_target", classmethod(lambda cls, target, hooks: None))
    st = L.apply_one(P("glm_ext_fake_mod.Runner.capture", "hook_double"), None)
    assert st.state is L.State.FAILED and "not in its live wrapper chain" in st.detail


def test_feature_patches_skipped_when_not_allowed(fake):
    led = L.Ledger((P("glm_ext_fake_mod.Runner.capture", "hook_double"),
                    P("glm_ext_fake_mod.Runner.helper", "hook_double", tier=L.Tier.GUARD)))
    L.apply_all(led, installed="9.9")
    assert led.status["glm_ext_fake_mod.Runner.capture"].state is L.State.SKIPPED
    assert "9.9" in led.status["glm_ext_fake_mod.Runner.capture"].detail
    assert led.status["glm_ext_fake_mod.Runner.helper"].state is L.State.APPLIED
    assert fake.Runner().capture(3) == 3


def test_feature_patch_outside_its_own_versions_is_skipped_with_that_reason(fake):
    # The ledger enforces each patch's own sglang_versions, not just the plugin's supported range.
    led = L.Ledger((P("glm_ext_fake_mod.Runner.capture", "hook_double"),))
    L.apply_all(led, installed="0.1")
    st = led.status["glm_ext_fake_mod.Runner.capture"]
    assert st.state is L.State.SKIPPED
    assert "0.1" in st.detail and "outside this patch's SGLang versions (0)" in st.detail
    assert fake.Runner().capture(3) == 3


def test_feature_patch_inside_its_versions_is_applied(fake):
    led = L.Ledger((P("glm_ext_fake_mod.Runner.capture", "hook_double"),))
    L.apply_all(led, installed="0")
    assert led.status["glm_ext_fake_mod.Runner.capture"].state is L.State.APPLIED
    assert fake.Runner().capture(3) == 6


def test_force_applies_a_feature_patch_outside_its_versions(fake):
    led = L.Ledger((P("glm_ext_fake_mod.Runner.capture", "hook_double"),))
    L.apply_all(led, installed="9.9", forced=True)
    assert led.status["glm_ext_fake_mod.Runner.capture"].state is L.State.APPLIED
    assert fake.Runner().capture(3) == 6


def test_skip_reason_is_the_one_version_rule():
    feature = P("glm_ext_fake_mod.Runner.capture", "hook_double")
    guard = P("glm_ext_fake_mod.Runner.helper", "hook_double", tier=L.Tier.GUARD)
    assert L.skip_reason(guard, "9.9") == "" and L.skip_reason(guard, None) == ""
    assert L.skip_reason(feature, "0") == ""
    assert L.skip_reason(feature, "9.9", forced=True) == ""
    assert "9.9" in L.skip_reason(feature, "9.9")
    # Forcing needs an SGLang to patch: with none installed a feature patch is still skipped.
    assert "absent" in L.skip_reason(feature, None, forced=True)


def test_on_an_unsupported_sglang_the_plugin_wide_reason_is_given(fake):
    led = L.Ledger((P("glm_ext_fake_mod.Runner.capture", "hook_double"),
                    P("glm_ext_fake_mod.Runner.helper", "hook_double", tier=L.Tier.GUARD)))
    L.apply_all(led, installed="9.9", unsupported="sglang 9.9 (NOT supported); supported: 0")
    assert led.status["glm_ext_fake_mod.Runner.capture"].detail == "sglang 9.9 (NOT supported); supported: 0"
    assert led.status["glm_ext_fake_mod.Runner.helper"].state is L.State.APPLIED  # guards still go in


# ---- `after`: an AFTER hook that reads what another AFTER hook on its target did ----

CAPTURE = "glm_ext_fake_mod.Runner.capture"
ADD = P(CAPTURE, "hook_after_add", "after", id="add")
TIMES = P(CAPTURE, "hook_after_times", "after", id="times", after=("add",))


def test_a_declared_order_is_applied_so_the_named_hook_runs_first(fake):
    led = L.Ledger((ADD, TIMES))
    L.apply_all(led, installed="0")
    assert {s.state for s in led.status.values()} == {L.State.APPLIED}
    assert fake.Runner().capture(1) == (1 + 100) * 10  # add's hook, then times'
    assert L.chain_depth(CAPTURE, hook_after_times) < L.chain_depth(CAPTURE, hook_after_add)
    assert L.order_problems((ADD, TIMES)) == {}


def test_a_ledger_that_lists_the_named_patch_later_fails_the_dependent_patch(fake):
    led = L.Ledger((TIMES, ADD))
    L.apply_all(led, installed="0")
    st = led.status["times"]
    assert st.state is L.State.FAILED and "runs after add, which the ledger lists later" in st.detail
    assert led.status["add"].state is L.State.APPLIED
    assert fake.Runner().capture(1) == 101  # never applied out of order


@pytest.mark.parametrize("other, needle", [
    (P("glm_ext_fake_mod.Runner.helper", "hook_after_add", "after", id="add"), "a patch of another target"),
    (P(CAPTURE, "hook_double", "around", id="add"), "an order between AFTER hooks only"),
])
def test_an_order_the_ledger_cannot_honour_is_named(other, needle):
    assert needle in L.order_problems((other, TIMES))["times"]
    assert "not in the ledger" in L.order_problems((TIMES,))["times"]


def test_the_live_chain_is_checked_where_the_dependent_hook_went_in_first(fake):
    assert L.apply_one(TIMES, None).state is L.State.APPLIED  # outside the ledger: add then wraps outside it
    led = L.Ledger((ADD, TIMES))
    L.apply_all(led, installed="0")
    st = led.status["times"]
    assert st.state is L.State.FAILED and "its hook would run before add's" in st.detail
