"""Before / after, one run: the L3 bench (sglang_glm_ext/l3/tools/bench.py of the AFTER tree) run alternately
against two engines -- the BEFORE tree's ``sglang_glm_ext`` and the AFTER tree's -- so both sides see the same
disk in the same minutes, measured by the same code. Prints every metric as median (min-max) per side and the
after/before ratio; writes each run's JSON and the table (rewritten after every run) under ``--out``.

    python benchmark/l3_ab.py --before .ab/before --after . --rounds 2 --out /tmp/ab -- \\
        --dir /tmp/l3_bench --size-gb 2 --skip-hicachefile --load-pages 120000

Rounds alternate the order (B A, A B, ...): a virtual disk whose speed drifts biases neither side. The bench file
uses only store APIs both sides have (what it reads beyond them goes through tools/bench_engine.py: the store's
``diagnostics()``, or an older engine's own attributes); rows a side cannot measure (the single-transfer
layer-first read of an engine that has only one mode) are left out of its column. Needs numpy, lmdb, xxhash; never torch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# (label, json key, unit, higher is better)
_METRICS = [("spill GB/s", "spill_gbps", "GB/s", True), ("raw write GB/s", "raw_write_gbps", "GB/s", True),
            ("fio best write GB/s (paired points)", "fio_write_gbps", "GB/s", True),
            ("  spill / fio best write (target >= 0.9x)", "spill_vs_fio", "x", True),
            ("spill, first fill of a new slab GB/s", "spill_first_gbps", "GB/s", True),
            ("fio best write point, one pass, new file GB/s", "fio_write_fresh_gbps", "GB/s", True),
            ("  first fill / fio one pass new file (>= 0.9x)", "spill_first_vs_fio", "x", True),
            ("spill CPU s/GB", "spill_cpu_s_per_gb", "s/GB", False),
            ("fio write CPU s/GB", "fio_write_cpu_s_per_gb", "s/GB", False),
            ("raw read GB/s", "raw_read_gbps", "GB/s", True),
            ("raw read into the layer-first chunks GB/s", "raw_read_layer_first_gbps", "GB/s", True),
            ("fio best rand read GB/s (paired points)", "fio_read_gbps", "GB/s", True),
            ("fio read CPU s/GB", "fio_read_cpu_s_per_gb", "s/GB", False),
            ("reload_threads (reads in flight)", "reload_threads", "", True),
            ("raw read+xxh3 in place CPU s/GB (page-first)", "raw_read_xxh3_page_first_cpu_s_per_gb", "s/GB", False),
            ("raw read+xxh3 in place CPU s/GB (layer-first)", "raw_read_xxh3_layer_first_cpu_s_per_gb", "s/GB",
             False)]
# layout is implied by the name; "layer_first" is the engine's default layer-first read
_RELOADS = ["page_first", "layer_first", "layer_first_single", "layer_first_vectored"]  # layer_first: the default


def _fmt(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def _rows(runs: dict[str, list[dict]]) -> list[str]:
    pages = sorted({r["page_bytes"] for side in runs.values() for run in side for r in run["results"]})
    out = [f"{'page':>9} | {'metric':<48} | {'before: median (min-max)':>26} | {'after: median (min-max)':>26} | "
           f"after/before", "-" * 132]

    def vals(side, page, key):
        """Every run's value (a list, e.g. one paired ratio per repeat, counts each of its items)."""
        out = []
        for run in runs[side]:
            for r in run["results"]:
                if r["page_bytes"] == page and r.get(key) is not None:
                    out.extend(r[key] if isinstance(r[key], list) else [r[key]])
        return out

    def paired(side, page, name, what):
        """Each repeat's ratio within its adjacent pair (bench.py), over every run of the side."""
        return [x[what] for run in runs[side] for r in run["results"] if r["page_bytes"] == page
                for x in r.get(f"reload_{name}_paired", [])]

    def line(page, label, b, a):
        q = f"{statistics.median(a) / statistics.median(b):.2f}x" if a and b else "-"
        out.append(f"{page:>9} | {label:<48} | {_fmt(b):>26} | {_fmt(a):>26} | {q}")

    for page in pages:
        for label, key, _, _ in _METRICS:
            line(page, label, vals("before", page, key), vals("after", page, key))
        for name in _RELOADS:
            g, c = f"reload_{name}_gbps", f"reload_{name}_cpu_s_per_gb"
            if not (vals("before", page, g) or vals("after", page, g)):
                continue
            tag = name.replace("_", "-", 1).replace("_", " ")
            line(page, f"reload {tag} GB/s", vals("before", page, g), vals("after", page, g))
            line(page, "  / raw read (target >= 0.95x)", paired("before", page, name, "gbps_vs_raw"),
                 paired("after", page, name, "gbps_vs_raw"))
            line(page, "  / raw read+xxh3 in place", paired("before", page, name, "gbps_vs_raw_xxh3"),
                 paired("after", page, name, "gbps_vs_raw_xxh3"))
            if name.startswith("layer_first"):
                line(page, "  / raw read into the same chunks", paired("before", page, name, "gbps_vs_raw_in_place"),
                     paired("after", page, name, "gbps_vs_raw_in_place"))
            line(page, "  / fio best rand read (target >= 0.9x)", vals("before", page, f"reload_{name}_vs_fio"),
                 vals("after", page, f"reload_{name}_vs_fio"))
            line(page, f"reload {tag} CPU s/GB", vals("before", page, c), vals("after", page, c))
            line(page, "  / raw read+xxh3 in place (target <= 1.2x)", paired("before", page, name, "cpu_vs_raw_xxh3"),
                 paired("after", page, name, "cpu_vs_raw_xxh3"))
    loads = {side: [run["load"] for run in runs[side] if run.get("load")] for side in runs}
    if any(loads.values()):
        lp = next(x for v in loads.values() for x in v)
        for label, key in (("s per million pages", "s_per_million"),):
            line(lp["page_bytes"], f"cold_start=load, {lp['pages']} pages: {label}",
                 [x[key] for x in loads["before"]], [x[key] for x in loads["after"]])
        line(lp["page_bytes"], "  open with an empty index, s",
             [statistics.median(x["open_empty_s"]) for x in loads["before"]],
             [statistics.median(x["open_empty_s"]) for x in loads["after"]])
    return out


def main(argv: "list[str] | None" = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    bench_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="checkout of the engine before (e.g. a git archive of main)")
    ap.add_argument("--after", default=".", help="checkout of the engine after (its bench file is the one run)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", required=True, help="directory for each run's JSON and the table")
    args = ap.parse_args(own)
    os.makedirs(args.out, exist_ok=True)
    bench = os.path.join(os.path.abspath(args.after), "sglang_glm_ext", "l3", "tools", "bench.py")
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    t0 = time.monotonic()
    for r in range(args.rounds):
        for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
            tree = os.path.abspath(getattr(args, side))
            path = os.path.join(args.out, f"{side}{r}.json")
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([tree] + os.environ.get("PYTHONPATH", "").split(
                os.pathsep)).rstrip(os.pathsep)}
            print(f"[{time.monotonic() - t0:6.0f}s] round {r} {side}: {tree}", flush=True)
            proc = subprocess.run([sys.executable, bench, *bench_args, "--json", path], env=env, text=True,
                                  capture_output=True)
            if proc.returncode not in (0, 3):  # 3: the bench ran and a row missed its target (still a result)
                with open(os.path.join(args.out, f"{side}{r}.failed.txt"), "w") as f:
                    f.write(proc.stdout + proc.stderr)
                print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
                return proc.returncode
            with open(path) as f:
                runs[side].append(json.load(f))
            # The table so far, after every run: a run cut short by a time limit still leaves what was measured.
            table = "\n".join([f"L3 A/B: before={os.path.abspath(args.before)} after={os.path.abspath(args.after)} "
                               f"runs so far: {len(runs['before'])} before, {len(runs['after'])} after; bench args: "
                               f"{' '.join(bench_args)}", *_rows(runs)])
            with open(os.path.join(args.out, "ab.txt"), "w") as f:
                f.write(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
