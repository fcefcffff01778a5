"""The fio sweep of `l3 bench` (l3/tools/fio.py): where fio is found, what a sweep returns and how fio's JSON is read,
what happens without fio. A fake fio (a script answering with fio's JSON shape) stands in where no fio is installed;
the real one runs too where it is (PATH, $SGLANG_GLM_EXT_FIO)."""

import json
import os

import pytest

from sglang_glm_ext.l3.tools import fio

def calls(log):
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_the_best_point_is_the_fastest_and_each_point_is_one_fio_run(fake_fio, tmp_path):
    path, log = fake_fio
    res, why = fio.sweep("read", 1052672, str(tmp_path / "d"), 64 * 1052672, 0.5, grid="small", fio=str(path))
    assert why == "" and res["engine"] == "io_uring" and res["fio"] == "fio-3.33-fake"
    assert [(r["iodepth"], r["numjobs"]) for r in res["table"]] == fio.GRIDS["small"]
    # the fake gives 0.25 GB/s per I/O in flight up to 8: (1, 1) 0.25, (4, 1) 1.0, (1, 8) 2.0 first among the 2.0s
    assert res["gbps"] == pytest.approx(2.0) and (res["iodepth"], res["numjobs"]) == (16, 1)
    assert res["table"][0]["gbps"] == pytest.approx(0.25) and res["table"][0]["clat_ms"] == pytest.approx(1.5)
    runs = [c for c in calls(log) if c["name"] == "read"]
    assert len(runs) == 10 and all(c["direct"] == "1" and c["bs"] == "1052672" and c["rw"] == "randread"
                                   for c in runs)
    assert {c["ioengine"] for c in runs} == {"io_uring"}
    assert not os.path.exists(res["path"])  # the file is removed unless kept


def test_a_write_sweep_writes_each_jobs_own_region_durably(fake_fio, tmp_path):
    path, log = fake_fio
    res, _ = fio.sweep("write", 4096 * 8, str(tmp_path / "d"), 10**6, 0.2, grid=[(1, 4)], fio=str(path),
                       keep_file=True)
    (w,) = [c for c in calls(log) if c["name"] == "write"]
    assert w["rw"] == "write" and w["end_fsync"] == "1" and w["offset_increment"] == w["size"]
    assert int(w["size"]) * 4 <= res["file_bytes"] and int(w["size"]) % (4096 * 8) == 0
    assert os.path.exists(res["path"])


def test_a_refused_engine_falls_back_and_says_so(fake_fio, tmp_path, monkeypatch):
    path, _ = fake_fio
    monkeypatch.setenv("FAKE_FIO_REFUSE", "io_uring")
    res, _ = fio.sweep("read", 8192, str(tmp_path / "d"), 10**6, 0.2, grid="tiny", fio=str(path))
    assert res["engine"] == "libaio" and "io_uring: fio exited 1" in res["engine_notes"]
    monkeypatch.setenv("FAKE_FIO_REFUSE", "io_uring,libaio")
    res, _ = fio.sweep("read", 8192, str(tmp_path / "d"), 10**6, 0.2, grid="tiny", fio=str(path), keep_file=True)
    assert res["engine"] == "psync"  # depth capped at 1: the grid collapses to its job counts
    assert sorted({(r["iodepth"], r["numjobs"]) for r in res["table"]}) == [(1, 1), (1, 4)]
    monkeypatch.setenv("FAKE_FIO_REFUSE", "io_uring,libaio,psync")  # the file is there: only the engines fail
    res, why = fio.sweep("read", 8192, str(tmp_path / "d"), 10**6, 0.2, grid="tiny", fio=str(path))
    assert res is None and why.startswith("no fio engine does O_DIRECT") and "psync: fio exited 1" in why


def test_where_fio_is_found(fake_fio, tmp_path, monkeypatch):
    path, _ = fake_fio
    monkeypatch.setenv("PATH", "/nonexistent")
    got, why = fio.find_fio()
    assert got is None and "fio not found" in why and "apt-get install fio" in why
    monkeypatch.setenv("PATH", str(path.parent))
    assert fio.find_fio() == (str(path), "fio-3.33-fake")
    monkeypatch.setenv(fio.ENV, str(tmp_path / "nope"))  # the env var names one: that one, or a reason
    got, why = fio.find_fio()
    assert got is None and f"{fio.ENV} {tmp_path / 'nope'}: not an executable file" in why
    monkeypatch.setenv(fio.ENV, str(path))
    assert fio.find_fio()[0] == str(path)
    got, why = fio.find_fio(str(tmp_path / "nope"))  # --fio wins, and is not silently replaced
    assert got is None and why.startswith("fio unusable: --fio")


def test_no_fio_means_none_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv(fio.ENV, raising=False)
    res, why = fio.sweep("write", 8192, str(tmp_path), 10**6, 0.2)
    assert res is None and "fio not found" in why


def test_parse_point_reads_fios_json_shape():
    data = {"jobs": [{"error": 0, "read": {"bw_bytes": 2_000_000_000, "iops": 1900.0, "io_bytes": 6_000_000_000,
                                           "clat_ns": {"mean": 2_500_000.0}},
                      "write": {"bw_bytes": 0, "iops": 0, "io_bytes": 0, "clat_ns": {"mean": 0}}}]}
    assert fio.parse_point(data, "read") == {"gbps": 2.0, "iops": 1900.0, "io_gb": 6.0, "clat_ms": 2.5}
    data["jobs"][0]["error"] = 5
    assert fio.parse_point(data, "read")["error"] == "fio job error 5"


def test_the_cli_writes_sweeps_the_bench_can_reuse(fake_fio, tmp_path, capsys):
    path, _ = fake_fio
    out = tmp_path / "s.json"
    assert fio.main(["--dir", str(tmp_path / "d"), "--size-gb", "0.001", "--seconds", "0.2", "--grid", "tiny",
                     "--bs", "8192", "--fio", str(path), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "fio write bs=8192 io_uring" in text and "best 2.00 GB/s at iodepth=16 x numjobs=1" in text
    got = fio.load_sweeps(str(out))
    assert [(r["kind"], r["block_bytes"]) for r in got] == [("write", 8192), ("read", 8192)]
    assert not os.listdir(tmp_path / "d")  # the read sweep reused the written file, then removed it


@pytest.mark.skipif(fio.find_fio()[0] is None, reason="no fio on this machine (PATH, $SGLANG_GLM_EXT_FIO)")
def test_a_real_fio_sweep_on_this_disk(tmp_path):
    res, why = fio.sweep("read", 1052672, str(tmp_path), 32 * 1052672, 0.3, grid="tiny")
    assert res is not None, why
    assert res["gbps"] > 0 and res["engine"] in fio.ENGINES and all(r.get("cpu_s_per_gb") for r in res["table"])



def test_a_fresh_point_is_a_write(tmp_path):
    """``fresh`` means a first fill of a new file: asked of a read, it is refused before fio runs or a file is made."""
    with pytest.raises(ValueError, match="writes only"):
        fio.point("/nonexistent/fio", "read", 4096, str(tmp_path / "f"), 1 << 20, 1.0, "psync", 1, 1, fresh=True)
    assert not (tmp_path / "f").exists()
