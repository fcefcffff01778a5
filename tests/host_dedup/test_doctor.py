"""host_dedup/doctor.py: for a launch line, which pools run deduplicated and what a node holds and reads."""

from sglang_glm_ext.declare import DoctorInput
from sglang_glm_ext.host_dedup.doctor import REPORTER


def _section(values, launch):
    part = REPORTER.report(DoctorInput(values=values, gpus=(), versions={}, launch=launch))
    return part.sections["host_dedup"]


def test_on_for_a_tp8_cp8_node_one_copy_instead_of_eight():
    d = _section({"hicache_host_dedup": "on", "enable_cp_l3": True}, {"tp_size": 8, "attn_cp_size": 8})
    assert d["on"] and d["pools"] == {"kv": "deduplicated", "indexer": "deduplicated"}
    assert d["replicas_per_node"] == 8 and d["host_copies_per_node"] == 1 and d["disk_reads_per_hit"] == 1
    assert "on for kv, indexer" in REPORTER.render({}, {"host_dedup": d})[0]


def test_off_says_why_and_counts_every_replica():
    d = _section({"hicache_host_dedup": "on"}, {"tp_size": 8, "attn_cp_size": 8, "speculative_algorithm": "NEXTN"})
    assert not d["on"] and "draft" in d["why_not"] and d["host_copies_per_node"] == 8
    d = _section({}, {"tp_size": 8, "attn_cp_size": 8})
    assert d["mode"] == "auto" and not d["on"] and "auto" in REPORTER.render({}, {"host_dedup": d})[0]
