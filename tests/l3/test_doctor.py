"""L3's doctor part: each configured path probed (O_DIRECT, free space against budget), config errors reported."""

import errno
import os

from sglang_glm_ext.declare import DoctorInput
from sglang_glm_ext.l3 import doctor
from sglang_glm_ext.l3.config import example_config
from sglang_glm_ext.l3.disk.slab import DiskSlab


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
    assert part.hardware["l3_paths"] == []
    assert len(part.problems) == 1 and part.problems[0].startswith(f"--cp-l3-config {cfg}")
