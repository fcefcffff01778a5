"""megamoe/miss.py's Prometheus side: the build-info gauge it sets beside its miss counters, shared with L3's metrics
in one process whichever feature registers first."""

import json
import subprocess
import sys
from importlib import metadata

import pytest

from sglang_glm_ext.megamoe import miss

VERSIONS = {"version": metadata.version("sglang-glm-ext"), "sglang_version": metadata.version("sglang")}


def test_attaching_the_miss_counters_sets_the_build_info():
    from prometheus_client import REGISTRY

    assert miss.MissCounters().attach_prometheus()
    assert REGISTRY.get_sample_value("sglang:glm_ext_build_info", VERSIONS) == 1


_CHILD = """
import json, sys
from prometheus_client import REGISTRY
from sglang_glm_ext.l3.hicache import metrics
from sglang_glm_ext.megamoe import miss

class S:
    def stats(self):
        return {"spilled": 1}
def l3():
    s = S()
    reg = metrics.register(object(), {k: "0" for k in metrics.BASE_LABELS}, s.stats, s)
    return reg is not None and REGISTRY.get_sample_value("sglang:cp_l3_spill_pages_total",
                                                         {k: "0" for k in metrics.BASE_LABELS}) == 1
def megamoe():
    return miss.MissCounters().attach_prometheus()
first, second = (l3, megamoe) if sys.argv[1] == "l3" else (megamoe, l3)
ok = [first(), second()]
print(json.dumps([ok, REGISTRY.get_sample_value("sglang:glm_ext_build_info", json.loads(sys.argv[2]))]))
"""


@pytest.mark.parametrize("first", ["l3", "megamoe"])
def test_l3_and_megamoe_share_the_build_info_whichever_registers_first(first):
    out = subprocess.run([sys.executable, "-c", _CHILD, first, json.dumps(VERSIONS)], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [[True, True], 1.0]
