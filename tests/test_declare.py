"""The vocabulary: a flag's value with its env var folded in, a feature's activity derived from its own flags, and a
patches.py's shared declaration fields given once."""

from types import SimpleNamespace

import pytest

from sglang_glm_ext.declare import CARRIER_ATTR, EnvVar, Feature, Flag, Patch, Tier, carried_values, patch_for

SWITCH_ENV = EnvVar("GLM_EXT_TEST_SWITCH", "0", "test switch")
SWITCH = Flag("test_switch", "switches the test feature on", "bool", False, env=SWITCH_ENV, switch=True)
OPTION = Flag("test_option", "a bool option that is no switch", "bool", False)
PATH = Flag("test_path", "a path", "path", None)
FEATURE = Feature("test", "a test feature", "-", flags=(SWITCH, OPTION, PATH), env=(SWITCH_ENV,))


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(SWITCH_ENV.name, raising=False)


def test_cli_spelling_is_derived_from_the_name():
    assert SWITCH.cli == "--test-switch" and PATH.cli == "--test-path"


def test_value_in_uses_the_default_and_the_env_var_turns_a_bool_flag_on(monkeypatch):
    assert SWITCH.value_in({}) is False and PATH.value_in({}) is None
    assert PATH.value_in({"test_path": "/x"}) == "/x"
    monkeypatch.setenv(SWITCH_ENV.name, "1")
    assert SWITCH.value_in({}) is True and SWITCH.value_in({"test_switch": False}) is True
    monkeypatch.setenv(SWITCH_ENV.name, "bogus")
    with pytest.raises(ValueError, match=SWITCH_ENV.name):
        SWITCH.value_in({})


def test_only_switch_flags_switch_a_feature_on(monkeypatch):
    assert not FEATURE.switched_on({})
    assert not FEATURE.switched_on({"test_option": True, "test_path": "/x"})
    assert FEATURE.switched_on({"test_switch": True})
    monkeypatch.setenv(SWITCH_ENV.name, "1")  # the switch's env var alone is enough
    assert FEATURE.switched_on({})


def test_always_on_feature_is_on_whatever_the_values():
    assert Feature("check", "a safety check", "-", always_on=True).switched_on({})


def test_is_active_reads_the_values_carried_on_the_record():
    on = SimpleNamespace(**{CARRIER_ATTR: {"test_switch": True}})
    off = SimpleNamespace(**{CARRIER_ATTR: {"test_switch": False}})
    bare = SimpleNamespace()  # a record the plugin never attached to: defaults
    assert FEATURE.is_active(on) and not FEATURE.is_active(off) and not FEATURE.is_active(bare)


def test_without_a_record_the_published_one_is_read_and_none_means_defaults(monkeypatch):
    import sglang.srt.runtime_context as rc

    published = SimpleNamespace(**{CARRIER_ATTR: {"test_switch": True}})
    monkeypatch.setattr(rc, "get_server_args", lambda: published)
    assert FEATURE.is_active()

    def unpublished():
        raise RuntimeError("no server args published in this process")

    monkeypatch.setattr(rc, "get_server_args", unpublished)
    assert carried_values() == {} and not FEATURE.is_active()


BY_SGLANG = Feature("by_sglang", "switched on by SGLang's own argument", "-", flags=(SWITCH,),
                    active_when=lambda sa: getattr(sa, "some_backend", None) == "x", sglang_args=("some_backend",))


def test_active_when_reads_sglangs_own_arguments_only_when_they_are_given():
    assert not BY_SGLANG.switched_on({})  # SGLang's arguments not given: not asked
    assert BY_SGLANG.switched_on({}, SimpleNamespace(some_backend="x"))
    assert not BY_SGLANG.switched_on({}, SimpleNamespace(some_backend="y"))
    assert not BY_SGLANG.switched_on({}, SimpleNamespace())  # a record without the attribute
    assert BY_SGLANG.switched_on({"test_switch": True}, SimpleNamespace(some_backend="y"))  # its flag still works
    assert not FEATURE.switched_on({}, SimpleNamespace(some_backend="x"))  # no predicate: arguments ignored


def test_is_active_hands_active_when_the_record_given_or_published(monkeypatch):
    import sglang.srt.runtime_context as rc

    assert BY_SGLANG.is_active(SimpleNamespace(some_backend="x"))
    assert BY_SGLANG.is_active(SimpleNamespace(some_backend="y", **{CARRIER_ATTR: {"test_switch": True}}))
    monkeypatch.setattr(rc, "get_server_args", lambda: SimpleNamespace(some_backend="x"))
    assert BY_SGLANG.is_active() and not FEATURE.is_active()


def test_patch_for_fills_the_shared_fields_and_a_declaration_may_give_its_own():
    patch = patch_for(FEATURE, tier=Tier.CPU_SERVE, sglang_versions=("0.5.23",), seed_lines="-")
    own = dict(id="t.x", target="m.f", hook_type="after", hook="m:h", reason="r", remove_when="w", signature=("a",))
    p = patch(**own)
    assert p == Patch(**own, feature=FEATURE, tier=Tier.CPU_SERVE, sglang_versions=("0.5.23",), seed_lines="-")
    q = patch(**own, tier=Tier.FEATURE, seed_lines="1-9")  # a launch check among CPU stand-ins
    assert (q.tier, q.seed_lines, q.feature, q.sglang_versions) == (Tier.FEATURE, "1-9", FEATURE, ("0.5.23",))
    with pytest.raises(TypeError):  # what is particular to a declaration is still required
        patch(**{k: v for k, v in own.items() if k != "reason"})
