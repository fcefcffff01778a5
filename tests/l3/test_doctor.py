"""L3's doctor part: each configured path probed (O_DIRECT, free space against budget), config errors reported."""

from sglang_glm_ext.declare import DoctorInput
from sglang_glm_ext.l3 import doctor
from sglang_glm_ext.l3.config import example_config


def test_no_config_no_rows():
    part = doctor.report(DoctorInput({"cp_l3_config": None}, (), {}))
    assert part.hardware == {"l3_paths": []} and part.problems == ()


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
    assert part.hardware == {"l3_paths": []}
    assert len(part.problems) == 1 and part.problems[0].startswith(f"--cp-l3-config {cfg}")
