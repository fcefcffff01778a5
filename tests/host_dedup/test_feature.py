"""host_dedup/feature.py: the flag's values are checked at launch, in plugin words."""

import pytest

from sglang_glm_ext.declare import PluginFlagError
from sglang_glm_ext.host_dedup.feature import FEATURE, HICACHE_HOST_DEDUP


def test_the_flag_accepts_auto_on_off_and_unset_and_refuses_anything_else():
    assert HICACHE_HOST_DEDUP.cli == "--hicache-host-dedup" and HICACHE_HOST_DEDUP.default is None
    for value in (None, "auto", "on", "OFF"):
        FEATURE.validate({HICACHE_HOST_DEDUP.name: value})
    with pytest.raises(PluginFlagError, match="--hicache-host-dedup maybe: expected one of auto, on, off"):
        FEATURE.validate({HICACHE_HOST_DEDUP.name: "maybe"})


def test_the_cli_offers_the_choices_and_refuses_another_before_serving(capsys):
    """A choice flag on SGLang's parser: its help names the values, argparse refuses another (exit 2), and the
    plugin's own check refuses it from Engine(...) keywords too."""
    import argparse

    from sglang_glm_ext.plugin import flags

    parser = argparse.ArgumentParser(prog="launch_server")
    flags.add_arguments(parser)
    assert "--hicache-host-dedup {auto,on,off}" in parser.format_help()
    assert flags.values_from_namespace(parser.parse_args(["--hicache-host-dedup", "on"]))["hicache_host_dedup"] == "on"
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--hicache-host-dedup", "maybe"])
    assert exited.value.code == 2 and "invalid choice: 'maybe'" in capsys.readouterr().err
    with pytest.raises(PluginFlagError, match="--hicache-host-dedup maybe: expected one of auto, on, off"):
        flags.validate({"hicache_host_dedup": "maybe"})


def test_on_and_only_on_switches_the_feature_on_for_doctor_and_the_launch_check():
    from sglang_glm_ext.host_dedup.feature import FEATURE

    assert FEATURE.switched_on({"hicache_host_dedup": "on"}) and FEATURE.switched_on({"hicache_host_dedup": " ON "})
    for value in (None, "auto", "off"):
        assert not FEATURE.switched_on({"hicache_host_dedup": value} if value else {})
