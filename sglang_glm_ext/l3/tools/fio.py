"""The disk's best O_DIRECT throughput, measured with fio: the limit ``l3 bench`` reports the store against.

A small sweep of (iodepth x numjobs) points at one block size, each one fio process, the best GB/s taken:

* ``kind="write"``: sequential O_DIRECT write, each job its own contiguous region of the file
  (``--offset_increment``), ``--end_fsync=1`` (the number means durable, like a spill) -- the reference for spill.
  A sweep point runs for a time over a file it keeps, so it measures writes over blocks already written; ``point(...,
  fresh=True)`` is the same point as ONE pass over a file just preallocated (``posix_fallocate``; the store's slabs
  use fallocate(2) mode 0, the same unwritten extents on ext4 / xfs): on ext4 every such write also converts an
  unwritten extent, which costs 25-35 % here;
* ``kind="read"``: random O_DIRECT read of whole blocks over the file, shared by all jobs (a reload reads scattered
  slots) -- the reference for reload.

The block is the store's transfer, a slot (``slot_bytes_for(page)``: payload + pad + header, a 4 KiB multiple), and
the file lies in the directory under test, so fio and the store see the same file system in the same run. GB/s is
fio's ``bw_bytes`` of the group (1e9 B per GB); CPU is the fio process's user + sys (``RUSAGE_CHILDREN`` around
it) per GB it moved. fio's JSON goes to a file (``--output``): fio prints notes such as "queue depth will be capped
at 1" on stdout ahead of the JSON.

Where fio comes from, first found: ``--fio PATH`` (``fio=``), ``$SGLANG_GLM_EXT_FIO``, ``fio`` on PATH. Absent or
unusable, every entry point returns None with the reason (``sweep``'s second value): the bench then says so and
reports against its own raw reference. Standard library only: it runs on a machine that has nothing else (the GPU
machine with a carried static fio: scripts/gpu/l3_limit_ab.sh).

    python -m sglang_glm_ext.l3.tools.fio --dir /nvme0/b --bs 3276800 1052672 --seconds 3 --json sweep.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

__all__ = ["ENV", "GRIDS", "ENGINES", "find_fio", "pick_engine", "sweep", "point", "parse_point", "render",
           "load_sweeps", "lay_out", "file_bytes_for"]

# Where fio is, when --fio does not say (declared as l3's FIO_ENV in feature.py, the README's table). This module
# imports nothing of the package: the bench loads it from beside itself, also against another tree's engine.
ENV = "SGLANG_GLM_EXT_FIO"

# (iodepth, numjobs) points. "full" is the 4 x 4; "small" keeps the informative edges (depth alone, jobs
# alone, products up to 64 in flight) in 10 points: 2 kinds x 2 block sizes x 10 x (3 s + ~0.5 s) ~ 2.5 minutes.
GRIDS = {
    "full": [(d, j) for j in (1, 2, 4, 8) for d in (1, 4, 16, 32)],
    "small": [(1, 1), (4, 1), (16, 1), (32, 1), (1, 4), (1, 8), (4, 4), (8, 4), (16, 4), (4, 8)],
    "tiny": [(1, 1), (16, 1), (4, 4)],
}
ENGINES = ("io_uring", "libaio", "psync")  # preference; psync caps iodepth at 1 (numjobs still sweeps)


def find_fio(explicit: "str | None" = None) -> "tuple[str | None, str]":
    """(path, fio's version line) or (None, why not). An explicit path that does not run is not replaced by
    another fio: the caller asked for that one, so the reason names it."""
    if explicit:
        cands = [("--fio", explicit)]
    else:
        cands = [(ENV, os.environ.get("SGLANG_GLM_EXT_FIO") or None), ("PATH", shutil.which("fio"))]
        if cands[0][1]:
            cands = cands[:1]
    tried = []
    for how, c in cands:
        if not c:
            continue
        why = _runs(c)
        if why.startswith("fio"):
            return c, why
        tried.append(f"{how} {c}: {why}")
    if not tried:
        return None, (f"fio not found (not given with --fio, ${ENV} unset, none on PATH); install it "
                      "(apt-get install fio) or carry a static build (scripts/gpu/l3_limit_ab.sh)")
    return None, "fio unusable: " + "; ".join(tried)


def _runs(path: str) -> str:
    """fio's version line, or why ``path`` is no working fio."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return "not an executable file"
    try:
        p = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{type(e).__name__}: {e}"
    out = p.stdout.strip()
    return out if p.returncode == 0 and out.startswith("fio") else f"--version said {out[:80]!r} (exit {p.returncode})"


def _run_fio(fio: str, args: list, timeout: float) -> "tuple[dict | None, str, float]":
    """One fio run, its JSON read from a file. (json, '', cpu seconds) or (None, why, cpu seconds)."""
    fd, out = tempfile.mkstemp(prefix="fio.", suffix=".json")
    os.close(fd)
    c0 = _child_cpu()
    try:
        p = subprocess.run([fio, "--output-format=json", f"--output={out}", *args], capture_output=True, text=True,
                           timeout=timeout)
        with open(out) as f:
            text = f.read()
        if p.returncode != 0 or not text.strip():
            return None, f"fio exited {p.returncode}: {(p.stderr or p.stdout).strip()[-300:]}", _child_cpu() - c0
        return json.loads(text[text.index("{"):]), "", _child_cpu() - c0
    except subprocess.TimeoutExpired:
        return None, f"fio ran past {timeout:.0f} s", _child_cpu() - c0
    except (OSError, ValueError) as e:
        return None, f"fio output unreadable: {e}", _child_cpu() - c0
    finally:
        try:
            os.unlink(out)
        except OSError:
            pass


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _common(path: str, bs: int, engine: str) -> list:
    return [f"--filename={path}", f"--bs={bs}", "--direct=1", f"--ioengine={engine}", "--group_reporting",
            "--randrepeat=0", "--norandommap", "--invalidate=0", "--allow_file_create=1"]


def pick_engine(fio: str, path: str, bs: int) -> "tuple[str | None, str]":
    """The first of ENGINES that does a short O_DIRECT read of the file without error (io_uring may be built in
    and still refused by the kernel or a seccomp profile). (engine, notes on the ones refused) or (None, why)."""
    notes = []
    for eng in ENGINES:
        d, why, _ = _run_fio(fio, ["--name=probe", *_common(path, bs, eng), "--rw=randread", "--iodepth=2",
                                   "--runtime=0.3", "--time_based", f"--size={os.path.getsize(path) // bs * bs}"],
                             60)
        if d is not None:
            try:
                j = d["jobs"][0]
                if not j.get("error") and j["read"]["io_bytes"] > 0:
                    return eng, "; ".join(notes)
                why = f"error {j.get('error')}, {j['read']['io_bytes']} B read"
            except (KeyError, IndexError, TypeError) as e:
                why = f"unexpected JSON ({type(e).__name__}: {e})"
        notes.append(f"{eng}: {why}")
    return None, "; ".join(notes)


def parse_point(data: dict, kind: str) -> dict:
    """One fio JSON result (``--group_reporting``: one job entry) -> gbps, iops, io_gb, clat_ms, error."""
    j = data["jobs"][0]
    side = j["write" if kind == "write" else "read"]
    clat = side.get("clat_ns") or side.get("lat_ns") or {}
    row = {"gbps": side["bw_bytes"] / 1e9, "iops": side.get("iops"), "io_gb": side["io_bytes"] / 1e9,
           "clat_ms": (clat.get("mean") or 0.0) / 1e6}
    if j.get("error"):
        row["error"] = f"fio job error {j['error']}"
    return row


def point(fio: str, kind: str, block_bytes: int, path: str, file_bytes: int, seconds: float, engine: str,
          iodepth: int, numjobs: int, *, fresh: bool = False) -> dict:
    """One (iodepth, numjobs) measurement on ``path``: the row of a sweep, also run alone beside a store pass (the
    bench pairs each spill and reload with fio's best point, so a disk whose speed drifts biases neither).
    ``fresh`` (writes): ``path`` is replaced by a file of ``file_bytes`` just preallocated, written once (no time
    limit), then removed: a first fill, like a new slab's (module docstring)."""
    if fresh and kind != "write":
        raise ValueError("fresh=True is a first fill: writes only")
    args = [f"--name={kind}", *_common(path, block_bytes, engine), f"--iodepth={iodepth}", f"--numjobs={numjobs}"]
    if not fresh:
        args += [f"--runtime={seconds}", "--time_based"]
    if kind == "write":
        region = file_bytes // numjobs // block_bytes * block_bytes
        args += ["--rw=write", f"--size={region}", f"--offset_increment={region}", "--end_fsync=1"]
        if fresh:
            try:
                if os.path.exists(path):
                    os.unlink(path)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    os.posix_fallocate(fd, 0, region * numjobs)
                finally:
                    os.close(fd)
            except OSError as e:
                return {"iodepth": iodepth, "numjobs": numjobs, "gbps": None, "error": f"preallocating {path}: {e}"}
            args.append("--fallocate=none")
    else:
        args += ["--rw=randread", f"--size={file_bytes // block_bytes * block_bytes}"]
    t0 = time.perf_counter()
    try:
        d, why, cpu = _run_fio(fio, args, seconds * 4 + 120 if not fresh else max(120.0, file_bytes / 50e6))
    finally:
        if fresh and os.path.exists(path):
            os.unlink(path)
    row = {"iodepth": iodepth, "numjobs": numjobs, "gbps": None, "wall_s": time.perf_counter() - t0, "cpu_s": cpu}
    if d is None:
        row["error"] = why
        return row
    try:
        row.update(parse_point(d, kind))
    except (KeyError, IndexError, TypeError) as e:
        row["error"] = f"unexpected fio JSON ({type(e).__name__}: {e})"
        return row
    row["cpu_s_per_gb"] = cpu / row["io_gb"] if row["io_gb"] else None
    return row


def lay_out(fio: str, path: str, size: int) -> str:
    """Write the file once (sequential O_DIRECT, psync) so a read-only sweep reads allocated blocks. '' or why not."""
    if os.path.exists(path) and os.path.getsize(path) >= size:
        return ""
    d, why, _ = _run_fio(fio, ["--name=layout", *_common(path, 1 << 20, "psync"), "--rw=write", f"--size={size}",
                               "--end_fsync=1"], max(120, size / 50e6))
    return why if d is None else ""


def file_bytes_for(block_bytes: int, size_bytes: int, points) -> int:
    """The sweep file: ``size_bytes`` (the data the store moves), and at least 8 x the most bytes in flight so the
    deepest point does not cycle over a few blocks."""
    return max(size_bytes // block_bytes, 8 * max(d * j for d, j in points)) * block_bytes


def sweep(kind: str, block_bytes: int, dir: str, size_bytes: int, seconds: float, *, grid="small",
          engine: "str | None" = None, fio: "str | None" = None, keep_file: bool = False) -> "tuple[dict | None, str]":
    """(result, '') or (None, why). result: the best point's gbps / iodepth / numjobs / cpu_s_per_gb, the engine,
    fio's version, the file, and every point (``table``)."""
    if kind not in ("read", "write"):
        raise ValueError(f"kind must be 'read' or 'write', got {kind!r}")
    if block_bytes <= 0 or block_bytes % 4096:
        raise ValueError(f"block_bytes {block_bytes} is not a positive multiple of 4 KiB (O_DIRECT)")
    path_fio, ver = find_fio(fio)
    if path_fio is None:
        return None, ver
    points = GRIDS[grid] if isinstance(grid, str) else [tuple(p) for p in grid]
    os.makedirs(dir, exist_ok=True)
    size = file_bytes_for(block_bytes, size_bytes, points)
    path = os.path.join(dir, f"fio.{block_bytes}.dat")
    rows: list = []
    notes = ""
    try:
        why = lay_out(path_fio, path, size)
        if why:
            return None, f"fio could not lay out {path}: {why}"
        if engine is None:
            engine, notes = pick_engine(path_fio, path, block_bytes)
            if engine is None:
                return None, f"no fio engine does O_DIRECT in {dir}: {notes}"
        if engine == "psync":
            points = sorted({(1, j) for _, j in points})  # a synchronous engine caps the depth at 1
        for depth, jobs in points:
            rows.append(point(path_fio, kind, block_bytes, path, size, seconds, engine, depth, jobs))
    finally:
        if not keep_file:
            try:
                os.unlink(path)
            except OSError:
                pass
    ok = [r for r in rows if r["gbps"] and not r.get("error")]
    if not ok:
        return None, "every fio point failed: " + "; ".join(str(r.get("error")) for r in rows[:3])
    top = max(ok, key=lambda r: r["gbps"])
    return {"kind": kind, "block_bytes": block_bytes, "dir": dir, "path": path, "file_bytes": size,
            "seconds": seconds, "engine": engine, "engine_notes": notes, "fio": ver, "fio_path": path_fio,
            "gbps": top["gbps"], "iodepth": top["iodepth"], "numjobs": top["numjobs"],
            "cpu_s_per_gb": top.get("cpu_s_per_gb"), "table": rows}, ""


def load_sweeps(path: str) -> list:
    """Sweep results written by ``--json`` (this module's CLI or the bench's), to reuse instead of sweeping again."""
    with open(path) as f:
        data = json.load(f)
    items = data.get("fio_sweeps", data) if isinstance(data, dict) else data
    return [r for r in items if isinstance(r, dict) and "gbps" in r and "kind" in r and "block_bytes" in r]


def render(res: dict) -> str:
    lines = [f"fio {res['kind']} bs={res['block_bytes']} {res['engine']} file={res['file_bytes'] / 1e9:.2f} GB "
             f"{res['seconds']} s/point ({res['fio']}): best {res['gbps']:.2f} GB/s at iodepth={res['iodepth']} x "
             f"numjobs={res['numjobs']}" + (f" (refused: {res['engine_notes']})" if res.get("engine_notes") else ""),
             f"  {'iodepth':>7} {'numjobs':>7} {'GB/s':>7} {'CPU s/GB':>9} {'clat ms':>8}"]
    for r in res["table"]:
        if r["gbps"] is None:
            lines.append(f"  {r['iodepth']:>7} {r['numjobs']:>7}  error: {r.get('error')}")
        else:
            c = r.get("cpu_s_per_gb")
            lines.append(f"  {r['iodepth']:>7} {r['numjobs']:>7} {r['gbps']:>7.3f} "
                         f"{'-' if c is None else f'{c:.3f}':>9} {r['clat_ms']:>8.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, help="directory on the disk under test")
    ap.add_argument("--size-gb", type=float, default=2.0, help="file size per block size (GB)")
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds per point")
    ap.add_argument("--kind", nargs="+", default=["write", "read"], choices=["write", "read"])
    ap.add_argument("--bs", type=int, nargs="+", default=[3276800, 1052672],
                    help="block sizes (default: the slots of GLM-5's 3,274,752 B page and of a 1 MiB page)")
    ap.add_argument("--grid", default="small", choices=sorted(GRIDS))
    ap.add_argument("--engine", default=None, choices=ENGINES)
    ap.add_argument("--fio", default=None, help=f"fio binary (default: ${ENV}, then PATH)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    out = []
    for bs in a.bs:
        for kind in a.kind:
            r, why = sweep(kind, bs, a.dir, int(a.size_gb * 1e9), a.seconds, grid=a.grid, engine=a.engine,
                           fio=a.fio, keep_file=kind != a.kind[-1])  # the read sweep reuses the written file
            if r is None:
                print(f"fio {kind} bs={bs}: skipped: {why}", flush=True)
                out.append({"kind": kind, "block_bytes": bs, "skipped": why})
                continue
            print(render(r), flush=True)
            out.append(r)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"fio_sweeps": out}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
