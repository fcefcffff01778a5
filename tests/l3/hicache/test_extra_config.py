"""The extra config SGLang's dynamic factory gets, and its checks at attach. (One store per (config, rank) per
process and pages visible between spill and durability are the store's now: tests/l3/engine/test_store_sharing.py,
tests/l3/engine/test_staging.py, and through the backend in test_backend.py.)"""

import json

import pytest

from sglang_glm_ext.l3.hicache import extra_config


def test_extra_config_names_the_backend_and_selects_zero_copy(l3_config):
    extra = extra_config.build(l3_config, {"prefetch_threshold": 64})
    assert extra["backend_name"] == extra_config.BACKEND_NAME and extra["interface_v1"] == 1
    assert extra["module_path"] == "sglang_glm_ext.l3.hicache.backend" and extra["class_name"] == "L3HiCacheStorage"
    assert extra["prefetch_threshold"] == 64 and extra["l3_config"] == l3_config
    assert extra_config.parse(json.loads(json.dumps(extra))) == extra
    with pytest.raises(ValueError, match="cannot be combined"):
        extra_config.build(l3_config, {"file_storage_path": "/tmp"})


def test_a_config_edited_after_launch_is_refused_at_attach(l3_config):
    extra = extra_config.build(l3_config)
    with open(l3_config, "a") as f:
        f.write("\n# edited\n")
    with pytest.raises(extra_config.AttachError, match="changed after launch"):
        extra_config.parse(extra)
    with pytest.raises(extra_config.AttachError, match="without the plugin's extra config"):
        extra_config.parse({"backend_name": "x"})
