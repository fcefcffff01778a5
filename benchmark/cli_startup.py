"""Start-up time of `sglang-glm-ext` commands that need neither torch nor SGLang, each in a fresh interpreter,
against `python -c "import torch"` (what every command paid before the CLI stopped importing it).

    python benchmark/cli_startup.py [--runs 7] [--json PATH]

Prints the median wall time per command over --runs fresh interpreters and its ratio to the torch import. `l3 ls`
runs on a config this script writes (`l3 example-config` into a temporary directory: an index never opened).
Results with their date go in docs_internal/, not here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _time(argv: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return took


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=7, help="fresh interpreters per command; the median is shown")
    ap.add_argument("--json", metavar="PATH", help="also write the medians as JSON")
    args = ap.parse_args(argv)
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cli = [sys.executable, "-m", "sglang_glm_ext.cli"]
    with tempfile.TemporaryDirectory(prefix="cli_startup_") as d:
        subprocess.run([*cli, "l3", "example-config", "--dir", d], check=True, stdout=subprocess.DEVNULL, env=env)
        commands = {
            'python -c "import torch"': [sys.executable, "-c", "import torch"],
            "--version": [*cli, "--version"],
            "--help": [*cli, "--help"],
            "flags": [*cli, "flags"],
            "l3 ls": [*cli, "l3", "ls", os.path.join(d, "l3.toml")],
        }
        medians = {}
        for name, command in commands.items():
            _time(command, env)  # one unmeasured run: the page cache holds the modules for the timed ones
            medians[name] = statistics.median(_time(command, env) for _ in range(args.runs))
    torch_s = medians['python -c "import torch"']
    print(f"{'command':<28} {'median':>9} {'/ import torch':>15}   ({args.runs} fresh interpreters each)")
    for name, s in medians.items():
        print(f"{name:<28} {s * 1000:>7.0f}ms {s / torch_s:>14.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": args.runs, "median_s": medians, "python": sys.version.split()[0]}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
