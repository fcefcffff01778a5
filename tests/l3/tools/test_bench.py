"""`sglang-glm-ext l3 bench` runs end to end on a tiny data set and prints every ratio row (numbers are not
asserted here: speed targets live in the benchmark's own output, measured side by side), and the A/B driver
runs the same bench file against two engines."""

import json
import os
import subprocess
import sys

import pytest

def calls(log):
    return [json.loads(line) for line in log.read_text().splitlines()]


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _bench(tmp_path, *extra, env=None):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_glm_ext.cli", "l3", "bench", "--dir", str(tmp_path / "b"), "--size-gb",
         "0.02", "--page-bytes", "1048576", "--skip-hicachefile", "--json", str(out), *extra],
        capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode in (0, 3), proc.stderr[-3000:]  # 3: a target missed (tiny data, a shared machine)
    return proc.stdout, json.loads(out.read_text())


def test_bench_smoke(tmp_path, fake_fio):
    fio, log = fake_fio
    stdout, data = _bench(tmp_path, "--repeats", "2", "--load-pages", "300", "--fio", str(fio), "--fio-grid",
                          "tiny", "--fio-seconds", "0.2")
    for row in ("spill (first fill)->durable vs raw O_DIRECT write", "reload page-first vs raw read",
                "reload layer-first vs raw read", "reload layer-first single vs raw read",
                "CPU: vs raw read + xxh3 in place", "batched exists", "peak staging vs cap",
                "cold_start=load, 300 live pages", "fio best seq write (16x1 io_uring)",
                "same, into the layer-first chunks", "vs raw read into the same chunks",
                "spill->durable vs fio best write", "first fill vs fio, one pass, new file",
                "fio best rand read (16x1 io_uring)", "vs fio best rand read",
                "checksum: xxhash ", "store threads: io_threads=4 (writes in flight), reload_threads=4 (reads in "
                "flight), checksums on the reading threads",  # 4 readers: each hashes its own (reload.HAND_OFF_BELOW)
                "fio best: write 16x1 = 16 in flight", "layer-first default read: vectored ([queues] layer_first_reads"):
        assert row in stdout, row
    assert "fio absent" not in stdout
    (r,) = data["results"]
    # Each side timed once per repeat (the layer-first reference once per read mode), next to what it is the
    # reference for; CPU beside every wall time; a paired ratio per repeat.
    for name, times in (("raw_write", 2), ("spill_first", 2), ("spill", 2), ("raw_read", 2),
                        ("raw_read_layer_first", 2), ("raw_read_xxh3_page_first", 2),
                        ("raw_read_xxh3_layer_first", 4), ("reload_page_first", 2), ("reload_layer_first", 2),
                        ("reload_layer_first_single", 2)):
        assert len(r[f"{name}_s"]) == len(r[f"{name}_cpu_s"]) == times, name
        assert r[f"{name}_cpu_s_per_gb"] > 0
    for name in ("page_first", "layer_first", "layer_first_single"):
        (a, b) = r[f"reload_{name}_paired"]
        # layer-first passes also pair with the bare transfer into the same chunks (their own ceiling)
        assert set(a) == {"cpu_vs_raw_xxh3", "gbps_vs_raw", "gbps_vs_raw_xxh3", "gbps"} | (
            {"gbps_vs_raw_in_place"} if name.startswith("layer") else set()) and a["cpu_vs_raw_xxh3"] > 0
        assert len(r[f"reload_{name}_vs_fio"]) == 2  # each reload pass over the fio read point of its repeat
    assert len(r["spill_vs_fio"]) == 2 and r["fio_write_gbps"] == r["fio_read_gbps"] == 2.0  # the fake's best
    assert len(r["spill_first_vs_fio"]) == 2 and r["fio_write_fresh_gbps"] == 2.0
    assert r["fio"]["write"]["iodepth"] == 16 and r["fio"]["read"]["engine"] == "io_uring"
    # the sweep (3 points per kind), then fio's best point once per repeat beside the store's passes: the write point
    # for a time over the kept file (steady state) and as one pass over a new preallocated file (the first fill),
    # in the order of the repeat (flipped every other repeat)
    runs = [c for c in calls(log) if c["name"] in ("read", "write")]
    point = [(c["name"], c["iodepth"], c["numjobs"], c.get("fallocate") == "none") for c in runs[6:]]
    assert point == [("write", "16", "1", False), ("write", "16", "1", True), ("read", "16", "1", False),
                     ("write", "16", "1", True), ("write", "16", "1", False), ("read", "16", "1", False)]
    fresh = [c for c in runs[6:] if c.get("fallocate") == "none"]
    assert all(not c["time_based"] and c["_allocated"] >= int(c["size"]) for c in fresh)  # one pass, preallocated
    assert r["staging_peak_bytes"] <= r["staging_cap_bytes"] and r["layers"] == 64
    assert r["layer_first_default"] == "vectored"
    assert data["load"]["pages"] == 300 and len(data["load"]["open_load_s"]) == 2
    assert [x["kind"] for x in data["fio_sweeps"]] == ["write", "read"]  # reusable with --fio-sweep


def test_bench_without_fio_says_so_and_keeps_its_own_references(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_GLM_EXT_FIO"}
    env["PATH"] = os.path.dirname(sys.executable)  # no fio there
    stdout, data = _bench(tmp_path, "--repeats", "1", env=env)
    assert "fio absent: fio not found" in stdout and "ratios are to the bench's own raw reference only" in stdout
    assert "vs fio" not in stdout and "reload page-first vs raw read" in stdout
    (r,) = data["results"]
    assert "fio_read_gbps" not in r and r["fio"]["points"] == {"write": [None], "write_fresh": [None], "read": [None]}
    assert len(r["spill_first_s"]) == len(r["spill_s"]) == 1  # both spill states, also without fio


def test_a_reused_sweep_and_threads_from_fio(tmp_path, fake_fio):
    """--fio-sweep: no sweep again, only the best point per repeat; --reload-threads fio: the store keeps as many
    reads in flight as fio's best point had (the fake's best read: 16 x 1)."""
    fio, log = fake_fio
    _, first = _bench(tmp_path, "--repeats", "1", "--fio", str(fio), "--fio-grid", "tiny", "--fio-seconds", "0.2",
                      "--skip-alt-modes")
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"fio_sweeps": first["fio_sweeps"]}))
    log.write_text("")
    stdout, data = _bench(tmp_path, "--repeats", "1", "--fio", str(fio), "--fio-sweep", str(sweep),
                          "--reload-threads", "fio", "--fio-seconds", "0.2", "--skip-alt-modes")
    (r,) = data["results"]
    assert r["reload_threads"] == 16 and r["io_threads"] == 4 and r["hash_helpers"] == 4
    assert "reload_layer_first_single_s" not in r  # --skip-alt-modes
    runs = [(c["name"], c["iodepth"]) for c in calls(log) if c["name"] in ("read", "write")]
    assert runs == [("write", "16"), ("write", "16"), ("read", "16")]  # steady state, first fill, read


def test_raw_read_xxh3_reads_into_the_host_pages_and_says_when_it_cannot(tmp_path):
    """The CPU reference for reload: each slot read straight into the host page's own bytes (page-first and
    layer-first), hashed there; a host page O_DIRECT refuses falls back to a ring buffer, named in the result."""
    import numpy as np

    from sglang_glm_ext.l3.disk.aligned import AlignedBuffer
    from sglang_glm_ext.l3.disk.format import slot_bytes_for
    from sglang_glm_ext.l3.tools import bench

    page, n = 64 * 16384, 130  # one full 128-page batch and 2 more
    slot = slot_bytes_for(page)
    path = str(tmp_path / "raw.bin")
    data = np.random.default_rng(1).integers(0, 256, n * slot, dtype=np.uint8)
    data.tofile(path)
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        pytest.skip("no O_DIRECT on this file system")
    host = AlignedBuffer(bench.BATCH * page + 4096)
    arr = np.frombuffer(host.view, np.uint8)
    try:
        # raw_read_in_place: the same transfer without the checksum (the layer-first reload's own ceiling)
        for layout, read in [(lay, fn) for lay in ("page_first", "layer_first")
                             for fn in (bench.raw_read_xxh3, bench.raw_read_in_place)]:
            arr[:] = 0
            views = bench.page_views(arr[:bench.BATCH * page], page, 64, layout)
            t, mode = read(path, n, slot, 2, page, views)
            assert mode == "in place" and t.wall > 0 and t.cpu >= 0
            for i in (n - 1, n - 3, 5):  # the last batch's pages, and one the last batch did not reach
                got = b"".join(bytes(v) for v in views[i % bench.BATCH])
                assert got == data[i * slot:i * slot + page].tobytes(), (layout, i)
        odd = bench.page_views(arr[1:bench.BATCH * page + 1], page, 64, "page_first")  # 1 B off: refused
        for read in (bench.raw_read_xxh3, bench.raw_read_in_place):
            _, mode = read(path, n, slot, 2, page, odd)
            assert mode == "ring buffer (in-place read refused)"
    finally:
        del arr, views, odd
        host.close()


@pytest.mark.slow
def test_ab_driver_runs_the_bench_file_against_both_trees(tmp_path):
    out = tmp_path / "ab"
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmark", "l3_ab.py"), "--before", REPO, "--after", REPO,
         "--rounds", "1", "--out", str(out), "--", "--dir", str(tmp_path / "b"), "--size-gb", "0.01",
         "--repeats", "1", "--page-bytes", "1048576", "--skip-hicachefile"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "before0.json").exists() and (out / "after0.json").exists()
    table = (out / "ab.txt").read_text()
    assert "reload page-first CPU s/GB" in table and "/ raw read+xxh3 in place (target <= 1.2x)" in table


def test_the_engine_and_its_bench_import_without_torch_or_sglang():
    """scripts/gpu/l3_direct_ab.sh runs the bench on the GPU machine, which has torch but no SGLang (and may run it
    without either): the engine, the bench and fsck import neither."""
    code = ("import json, sys\n"
            "import sglang_glm_ext.l3.engine.store, sglang_glm_ext.l3.tools.bench, sglang_glm_ext.l3.tools.fsck\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'sglang'})))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == []


def test_the_first_fill_pass_starts_from_punched_slots(tmp_path):
    """The bench's first fill: after a clear, every slot of the slab is punched (its written blocks go back to the
    file system) and preallocated again, as a new slab is (so the next writes fill unwritten extents); the store
    still takes and serves pages."""
    import argparse

    import numpy as np

    from sglang_glm_ext.l3.tools import bench

    page = 1 << 20
    slot = bench.slot_bytes_for(page)
    args = bench.add_arguments(argparse.ArgumentParser()).parse_args(["--dir", str(tmp_path)])
    cfg = bench.store_config(str(tmp_path), 8, slot, args)
    store = bench.L3Store.open(cfg, rank=0, namespace=bench.Namespace("b", "bf16", "page_first", 64, 0, 78, "b"),
                               page_bytes={bench.KIND: page})
    try:
        src = [np.full(page, i, np.uint8) for i in range(8)]
        keys = bench._keys(8, "t")
        bench.spill_all(store, keys, src)
        (st,) = store.diagnostics().slabs(bench.KIND)
        if st.slab.held_bytes() < 8 * slot:
            pytest.skip("the file system did not allocate the slab's blocks (no fallocate here)")
        store.clear()
        punched = []
        real = st.slab.punch
        st.slab.punch = lambda slots: punched.append(sorted(slots)) or real(punched[-1])
        if not bench.unwritten_again(store):
            pytest.skip("the file system cannot punch holes")
        assert punched == [list(range(st.num_slots))] and st.slab.held_bytes() >= 8 * slot  # preallocated again
        with open(st.slab.path, "rb") as f:
            assert not any(f.read(slot))  # the old bytes are gone: the slot reads as zeros
        bench.spill_all(store, keys, src)
        assert store.exists(bench.KIND, keys) == 8
    finally:
        store.close()


def test_the_bench_passes_gil_pause_to_the_store_and_leaves_the_engines_default_otherwise(tmp_path):
    """`--gil-pause page|off|SIZE` is [queues] layer_first_gil_pause for the store under test (the run 13 trade-off:
    the scheduler thread's wait against the reload's CPU, measured against the bench's CPU target on one's own
    disk); without it the engine's default, and a bad value is the config's clear error."""
    import argparse

    from sglang_glm_ext.l3.config import GIL_PAUSE_PAGE, L3ConfigError
    from sglang_glm_ext.l3.tools import bench

    slot = bench.slot_bytes_for(1 << 20)

    def cfg(*extra):
        args = bench.add_arguments(argparse.ArgumentParser()).parse_args(["--dir", str(tmp_path), *extra])
        return bench.store_config(str(tmp_path), 8, slot, args)

    assert cfg().layer_first_gil_pause_bytes == 0
    assert cfg("--gil-pause", "page").layer_first_gil_pause_bytes == GIL_PAUSE_PAGE
    assert cfg("--gil-pause", "1MiB").layer_first_gil_pause_bytes == 1 << 20
    assert cfg("--gil-pause", "off").layer_first_gil_pause_bytes == 0
    with pytest.raises(L3ConfigError, match="layer_first_gil_pause"):
        cfg("--gil-pause", "sometimes")
