"""The registry: one row per feature, and everything plugin-wide derived from the rows."""

from sglang_glm_ext.declare import Feature
from sglang_glm_ext.plugin import envs, registry


def test_the_ledger_is_the_rows_declarations_concatenated_in_order():
    assert registry.PATCHES == tuple(p for _, patches in registry.ROWS for p in patches)
    for feature, patches in registry.ROWS:
        assert isinstance(feature, Feature)
        assert all(p.feature is feature for p in patches), feature.name  # a patch points at its own row


def test_names_users_see_are_unique():
    for names in ([f.name for f in registry.FEATURES], [p.id for p in registry.PATCHES],
                  [f.name for f in registry.FLAGS], [e.name for e in registry.ENV_VARS]):
        assert len(names) == len(set(names)), names


def test_flags_and_env_vars_come_from_the_features():
    assert registry.FLAGS == tuple(flag for f in registry.FEATURES for flag in f.flags)
    assert registry.ENV_VARS == envs.PLUGIN_ENV_VARS + tuple(e for f in registry.FEATURES for e in f.env)
    for flag in registry.FLAGS:
        assert registry.feature_of(flag) is not None
        if flag.env is not None:  # a switch env var is listed by the feature whose flag it switches
            assert flag.env in registry.feature_of(flag).env
    for e in envs.PLUGIN_ENV_VARS:
        assert registry.feature_of(e) is None


def test_every_doctor_part_is_a_report_function():
    for part in registry.DOCTOR_PARTS:
        assert part.__name__ == "report" and part.__module__.endswith(".doctor"), part


def test_sglang_args_are_the_features_own_in_row_order_without_repeats():
    want = [a for f in registry.FEATURES for a in f.sglang_args]
    assert list(registry.SGLANG_ARGS) == list(dict.fromkeys(want))
    assert "moe_a2a_backend" in registry.SGLANG_ARGS  # megamoe's switch
    for f in registry.FEATURES:
        assert bool(f.sglang_args) == (f.active_when is not None), f.name  # doctor can pass what it reads
