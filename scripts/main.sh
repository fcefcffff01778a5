#!/usr/bin/env bash
# The main job on a fresh machine: set up, show what the plugin does here (doctor), then the served run: SGLang's
# real HTTP server on this CPU (sglang_glm_ext/cpu_serve/run.py) serving a tiny GLM-5 with HiCache + L3; a client
# workload over HTTP; stop; restart with cold_start = "load"; replay; outputs compared with the same server without
# HiCache; a negative control (reloaded KV perturbed on purpose must fail the comparison); fsck of the L3 disk.
# Exit non-zero on any mismatch or on zero L3 hits after the restart. Then the fast check: `sglang-glm-ext demo`
# (SGLang's HiCache pieces with L3, byte-checked, without a server). L3_BENCH_GB=N also runs the engine bench.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"  # as scripts/setup_env.sh
export VENV
t0=$SECONDS
bash scripts/setup_env.sh
echo "set-up: $((SECONDS - t0)) s"
# SGLang's native page hash is a JIT C++ extension: build it inside the checkout, not in ~/.cache.
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}"
"$VENV/bin/sglang-glm-ext" doctor
work="$(mktemp -d "${TMPDIR:-/var/tmp}/glm_ext_main.XXXXXX")"
trap 'rm -rf "$work"' EXIT
t1=$SECONDS
# The served run stops every server it started on every exit path (Ctrl-C included): each runs in its own
# process group, and run.py's finally / signal handler stops that group.
"$VENV/bin/sglang-glm-ext" cpu-serve run --dir "$work/served"
echo "served run: $((SECONDS - t1)) s"
"$VENV/bin/sglang-glm-ext" demo --dir "$work/demo" --keep
"$VENV/bin/sglang-glm-ext" l3 fsck "$work/demo/l3.toml"
if [ -n "${L3_BENCH_GB:-}" ]; then
  "$VENV/bin/sglang-glm-ext" l3 bench --dir "$work/bench" --size-gb "$L3_BENCH_GB" --repeats 3
fi
