"""The registry: one row per feature, and everything plugin-wide derived from the rows."""

import pytest

from sglang_glm_ext.declare import DoctorPart, DoctorReporter, Feature
from sglang_glm_ext.plugin import envs, registry


def test_the_ledger_is_the_rows_declarations_concatenated_in_order():
    assert registry.PATCHES == tuple(p for _, patches in registry.ROWS for p in patches)
    for feature, patches in registry.ROWS:
        assert isinstance(feature, Feature)
        assert all(p.feature is feature for p in patches), feature.name  # a patch points at its own row


def test_every_declared_hook_order_holds_in_the_ledger():
    from sglang_glm_ext.patching.ledger import order_problems

    assert order_problems(registry.PATCHES) == {}
    by_id = {p.id: p for p in registry.PATCHES}
    # The L3 command-line translation reads the flag values the plugin's flag hook attaches to the record.
    assert by_id["l3.translate_flags_cli"].after == ("flags.from_cli",)


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


def test_every_doctor_part_is_a_folders_reporter_and_no_two_claim_a_key():
    hardware, sections = [], []
    for part in registry.DOCTOR_PARTS:
        assert isinstance(part, DoctorReporter), part
        assert part.report.__name__ == "report" and part.report.__module__.endswith(".doctor"), part
        assert part.render.__module__ == part.report.__module__, part  # a folder renders its own keys
        assert part.source == part.report.__module__.split(".")[1]
        hardware += part.hardware
        sections += part.sections
    assert len(hardware) == len(set(hardware)) and len(sections) == len(set(sections)), (hardware, sections)


def test_doctor_refuses_a_part_that_fills_keys_it_does_not_declare():
    from sglang_glm_ext.plugin.doctor import _check_part_keys

    part = next(p for p in registry.DOCTOR_PARTS if p.sections)  # l3: hardware l3_paths and l3_checksum, section l3
    assert "l3_paths" in part.hardware and part.sections == ("l3",)
    hw = {k: [] for k in part.hardware}
    _check_part_keys(part, DoctorPart(dict(hw), sections={"l3": {}}))
    for stray in (DoctorPart({**hw, "extra": 1}, sections={"l3": {}}), DoctorPart({}, sections={"l3": {}}),
                  DoctorPart({"l3_paths": []}, sections={"l3": {}}), DoctorPart(dict(hw)),
                  DoctorPart(dict(hw), sections={"l3": {}, "other": {}})):
        with pytest.raises(RuntimeError, match="doctor part l3 filled"):
            _check_part_keys(part, stray)


def test_sglang_args_are_the_features_own_in_row_order_without_repeats():
    want = [a for f in registry.FEATURES for a in f.sglang_args]
    assert list(registry.SGLANG_ARGS) == list(dict.fromkeys(want))
    assert "moe_a2a_backend" in registry.SGLANG_ARGS  # megamoe's switch
    for f in registry.FEATURES:
        assert bool(f.sglang_args) == (f.active_when is not None), f.name  # doctor can pass what it reads
