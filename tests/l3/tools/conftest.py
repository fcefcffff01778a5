"""Fixtures of the L3 tool tests. ``fake_fio``: a stand-in for fio (a script answering with fio's JSON shape) where no
fio is installed, so the bench's fio sweep and its paired points run everywhere; it logs every call it gets."""

import stat
import sys

import pytest

from sglang_glm_ext.l3.tools import fio

FAKE = r'''#!{python}
"""A stand-in for fio: prints a note on stdout (as fio does), writes fio's JSON shape to --output. Throughput is
0.25 GB/s per I/O in flight up to 8 (so the best point is known); engines in $FAKE_FIO_REFUSE fail."""
import json, os, sys
if sys.argv[1:] == ["--version"]:
    print("fio-3.33-fake"); sys.exit(0)
a = dict(x[2:].split("=", 1) for x in sys.argv[1:] if x.startswith("--") and "=" in x)
a["time_based"] = "--time_based" in sys.argv
a["_allocated"] = os.stat(a["filename"]).st_blocks * 512 if os.path.exists(a["filename"]) else 0  # as fio found it
with open(os.environ["FAKE_FIO_LOG"], "a") as log:
    log.write(json.dumps(a) + "\n")
if a["ioengine"] in os.environ.get("FAKE_FIO_REFUSE", "").split(","):
    print("fio: engine not loadable", file=sys.stderr); sys.exit(1)
size = int(a["size"]) * (int(a.get("numjobs", 1)) if "offset_increment" in a else 1)
if a["rw"] == "write" and (not os.path.exists(a["filename"]) or os.path.getsize(a["filename"]) < size):
    with open(a["filename"], "ab") as f:
        f.truncate(size)
inflight = int(a.get("iodepth", 1)) * int(a.get("numjobs", 1))
bw = int(0.25e9 * min(inflight, 8))
side = {{"bw_bytes": bw, "iops": bw / int(a["bs"]), "io_bytes": bw * 2, "clat_ns": {{"mean": 1.5e6}}}}
none = {{"bw_bytes": 0, "iops": 0, "io_bytes": 0, "clat_ns": {{"mean": 0}}}}
job = {{"jobname": a["name"], "error": 0, "usr_cpu": 1.0, "sys_cpu": 2.0,
       "read": side if "read" in a["rw"] else none, "write": side if a["rw"] == "write" else none}}
print("note: both iodepth >= 1 and synchronous I/O engine are selected, queue depth will be capped at 1")
with open(a["output"], "w") as f:
    json.dump({{"fio version": "fio-3.33-fake", "jobs": [job]}}, f)
'''


@pytest.fixture
def fake_fio(tmp_path, monkeypatch):
    path = tmp_path / "bin" / "fio"
    path.parent.mkdir()
    path.write_text(FAKE.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "fio_calls.jsonl"
    monkeypatch.setenv("FAKE_FIO_LOG", str(log))
    monkeypatch.delenv(fio.ENV, raising=False)
    return path, log


