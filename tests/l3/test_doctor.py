"""L3's doctor part: each configured path probed (O_DIRECT, free space against budget), config errors reported."""

import errno
import os

from sglang_glm_ext.declare import DoctorInput
from sglang_glm_ext.l3 import doctor
from sglang_glm_ext.l3.config import example_config
from sglang_glm_ext.l3.disk.slab import DiskSlab


def test_no_config_no_rows():
    part = doctor.report(DoctorInput({"cp_l3_config": None}, (), {}))
    assert part.hardware == {"l3_paths": []} and part.problems == ()


def test_each_configured_disk_is_probed(tmp_path):
    cfg = tmp_path / "l3.toml"
    cfg.write_text(example_config(str(tmp_path / "disk")))
    part = doctor.report(DoctorInput({"cp_l3_config": str(cfg)}, (), {}))
    (row,) = part.hardware["l3_paths"]
    assert row["path"].startswith(str(tmp_path))
    assert row["free_bytes"] > 0 and part.problems == ()
    # What doctor says of O_DIRECT there is what a slab opened there does (the store's own probe, slab.py).
    slab = DiskSlab.open(tmp_path / "disk" / "probe.slab", slot_bytes=4096, num_slots=1)
    try:
        assert row["o_direct"] is (slab.io_mode == "o_direct"), (row, slab.io_mode, slab.fallback_reason)
    finally:
        slab.close()


def test_a_path_that_refuses_o_direct_is_reported_so_with_the_fallback(tmp_path, monkeypatch):
    real_open = os.open

    def refusing(path, flags, *a, **kw):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", refusing)
    cfg = tmp_path / "l3.toml"
    cfg.write_text(example_config(str(tmp_path / "disk")))
    (row,) = doctor.report(DoctorInput({"cp_l3_config": str(cfg)}, (), {})).hardware["l3_paths"]
    assert row["o_direct"] is False and "buffered + fdatasync fallback" in row["o_direct_detail"]


def test_a_config_that_does_not_load_is_a_problem_not_a_crash(tmp_path):
    cfg = tmp_path / "l3.toml"
    cfg.write_text("not toml = =")
    part = doctor.report(DoctorInput({"cp_l3_config": str(cfg)}, (), {}))
    assert part.hardware == {"l3_paths": []}
    assert len(part.problems) == 1 and part.problems[0].startswith(f"--cp-l3-config {cfg}")
