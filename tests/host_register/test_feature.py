"""host_register's feature row: always on, with its own env var and patch."""

from sglang_glm_ext.host_register import feature, patches
from sglang_glm_ext.plugin import registry


def test_the_row_is_registered_always_on_with_its_own_env_var_and_patch():
    rows = {f.name: (f, ps) for f, ps in registry.ROWS}
    assert rows["host_register"] == (feature.FEATURE, patches.PATCHES)
    assert feature.FEATURE.always_on
    assert feature.FEATURE.env == (feature.HOST_REGISTER_MAX_GB,)
    assert registry.feature_of(feature.HOST_REGISTER_MAX_GB) is feature.FEATURE  # the flag table's owner column
    assert [p.id for p in patches.PATCHES] == ["host_register.ceiling"]
