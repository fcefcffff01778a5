"""The L3 feature's declaration: its switch, and the config check that stops a launch before serving."""

import pytest

from sglang_glm_ext.declare import PluginFlagError
from sglang_glm_ext.l3 import feature
from sglang_glm_ext.l3.config import example_config


def values(**kw):
    return {"enable_cp_l3": False, "cp_l3_config": None, **kw}


def test_enable_cp_l3_is_the_switch_and_the_config_is_not():
    assert feature.FEATURE.switched_on(values(enable_cp_l3=True))
    assert not feature.FEATURE.switched_on(values(cp_l3_config="l3.toml"))


@pytest.mark.parametrize("given, needle", [
    (values(cp_l3_config="x.toml"), "--cp-l3-config was given without --enable-cp-l3"),
    (values(enable_cp_l3=True), "--enable-cp-l3 needs --cp-l3-config PATH"),
    (values(enable_cp_l3=True, cp_l3_config="/nonexistent/l3.toml"), "no such file"),
])
def test_bad_values_are_refused(given, needle):
    with pytest.raises(PluginFlagError, match=needle):
        feature.validate(given)


def test_a_config_that_does_not_load_is_refused_and_a_good_one_passes(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("this is not = = toml")
    with pytest.raises(PluginFlagError, match="--cp-l3-config"):
        feature.validate(values(enable_cp_l3=True, cp_l3_config=str(bad)))
    good = tmp_path / "l3.toml"
    good.write_text(example_config(str(tmp_path / "disk")))
    feature.validate(values(enable_cp_l3=True, cp_l3_config=str(good)))
    feature.validate(values())  # off and unconfigured: nothing to check


def test_a_disk_path_the_engine_cannot_create_is_refused_at_validation(tmp_path):
    """The flag check runs at server-args time, before the model loads: the disk path is proven there."""
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    cfg = tmp_path / "l3.toml"
    cfg.write_text(example_config(str(tmp_path)).replace(f'"{tmp_path}/disk0"', f'"{blocker}/disk0"'))
    assert f'"{blocker}/disk0"' in cfg.read_text()
    with pytest.raises(PluginFlagError, match=r"disks\[0\]\.path .*afile is not a directory; point disks\[0\]"):
        feature.validate(values(enable_cp_l3=True, cp_l3_config=str(cfg)))
