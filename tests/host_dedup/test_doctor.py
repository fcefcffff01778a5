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


def test_sizing_for_a_launch_line_host_bytes_and_hit_reads_on_and_off():
    d = _section({"hicache_host_dedup": "on", "enable_cp_l3": True},
                 {"tp_size": 8, "attn_cp_size": 8, "hicache_size": 40})
    s = d["sizing"]
    assert s["ranks_on_node"] == 8 and s["sized_by"] == "hicache_size"
    assert s["off"]["host_bytes"] == 8 * s["on"]["host_bytes"]
    assert s["off"]["hit_disk_bytes"] == 8 * s["on"]["hit_disk_bytes"]
    lines = REPORTER.render({}, {"host_dedup": d})
    assert "--hicache-size 40 GB per rank pins 384.4 GB dedup off, 48.1 GB on" in lines[1]
    assert "1,000-token prefix hit reads 503.5 MB from disk per node dedup off, 62.9 MB on" in lines[2]


def test_sizing_shows_what_on_would_give_while_auto_is_off_and_nothing_where_excluded():
    auto = _section({"enable_cp_l3": True}, {"tp_size": 8, "attn_cp_size": 8, "hicache_size": 40})["sizing"]
    assert auto["on"]["host_pools"] == 1 and auto["off"]["host_pools"] == 8
    spec = _section({"hicache_host_dedup": "on"}, {"tp_size": 8, "attn_cp_size": 8, "hicache_size": 40,
                                                   "speculative_algorithm": "NEXTN"})["sizing"]
    assert spec["on"] == spec["off"]
    assert _section({}, {"tp_size": 8, "enable_hierarchical_cache": False})["sizing"] is None
    assert _section({}, {"tp_size": 8, "kv_cache_dtype": "fp4_e2m1"})["sizing"] is None


def test_doctor_says_what_this_hosts_ram_admits_dedup_on_and_off(monkeypatch, tmp_path):
    from sglang_glm_ext.host_dedup import doctor

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       2113929216 kB\nMemAvailable:   1953125000 kB\n")  # 2.0 TB available
    real = doctor.available_bytes
    monkeypatch.setattr(doctor, "available_bytes", lambda: real(str(meminfo)))
    d = _section({"hicache_host_dedup": "on", "enable_cp_l3": True},
                 {"tp_size": 8, "attn_cp_size": 8, "hicache_size": 40})
    s = d["sizing"]
    assert s["available_bytes"] == 1953125000 * 1024
    assert s["on"]["largest_hicache_size_gb"] > 7.9 * s["off"]["largest_hicache_size_gb"] > 0
    line = REPORTER.render({}, {"host_dedup": d})[3]
    assert "this host (2,000.0 GB available now) admits --hicache-size up to" in line
    assert f"{s['off']['largest_hicache_size_gb']:g} GB dedup off, {s['on']['largest_hicache_size_gb']:g} GB on" in line


def test_meminfo_without_a_reading_leaves_the_line_out(tmp_path):
    from sglang_glm_ext.host_dedup.doctor import available_bytes

    assert available_bytes(str(tmp_path / "absent")) is None
    (tmp_path / "m").write_text("MemTotal: 1 kB\n")
    assert available_bytes(str(tmp_path / "m")) is None
