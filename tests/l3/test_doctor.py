"""L3's doctor part: each configured path probed (O_DIRECT, free space against budget), config errors reported."""

from sglang_glm_ext.declare import DoctorInput
from sglang_glm_ext.l3 import doctor
from sglang_glm_ext.l3.config import example_config


def test_no_config_no_rows():
    part = doctor.report(DoctorInput({"cp_l3_config": None}, (), {}))
    assert part.hardware["l3_paths"] == [] and part.problems == ()


def test_the_checksum_build_is_reported_and_rendered(monkeypatch):
    """Issue 28: doctor names the xxhash build and the vector unit XXH3 runs on; an SSE2-only build on an AVX2 CPU
    is a warning with its fix (not a problem: the values are the same, only slower)."""
    import xxhash

    part = doctor.report(DoctorInput({"cp_l3_config": None}, (), {}))
    row = part.hardware["l3_checksum"]
    assert row["version"] == xxhash.VERSION and row["vector"] in ("scalar", "sse2", "avx2", "avx512", None)
    text = "\n".join(doctor.render_checksum(row))
    assert text.startswith(f"  L3 checksum: xxhash {xxhash.VERSION} (xxHash {xxhash.XXHASH_VERSION}), XXH3 on ")
    old = dict(row, version="4.0.2", vector="sse2", warning="xxhash 4.0.2 runs XXH3 on sse2 while this CPU has avx2: "
               "install xxhash>=4.1.0")
    assert "    warning: xxhash 4.0.2 runs XXH3 on sse2" in "\n".join(doctor.render_checksum(old))
    assert part.problems == ()


def test_each_configured_disk_is_probed(tmp_path):
    cfg = tmp_path / "l3.toml"
    cfg.write_text(example_config(str(tmp_path / "disk")))
    part = doctor.report(DoctorInput({"cp_l3_config": str(cfg)}, (), {}))
    (row,) = part.hardware["l3_paths"]
    assert row["path"].startswith(str(tmp_path)) and row["o_direct"] in (True, False, None)
    assert row["free_bytes"] > 0 and part.problems == ()


def test_a_config_that_does_not_load_is_a_problem_not_a_crash(tmp_path):
    cfg = tmp_path / "l3.toml"
    cfg.write_text("not toml = =")
    part = doctor.report(DoctorInput({"cp_l3_config": str(cfg)}, (), {}))
    assert part.hardware["l3_paths"] == []
    assert len(part.problems) == 1 and part.problems[0].startswith(f"--cp-l3-config {cfg}")
