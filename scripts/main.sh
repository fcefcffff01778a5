#!/usr/bin/env bash
# The main job on a fresh machine: set up, show what the plugin does here (doctor), then run L3 under SGLang's real
# HiCache on this CPU (sglang-glm-ext demo: write-back, L2 eviction, prefetch from L3, restart; bytes checked) and
# fsck the disk it wrote. L3_BENCH_GB=N also runs the engine bench (raw O_DIRECT vs L3) on N GB.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
# SGLang's native page hash is a JIT C++ extension: build it inside the checkout, not in ~/.cache.
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}"
.venv/bin/sglang-glm-ext doctor
work="$(mktemp -d "${TMPDIR:-/var/tmp}/glm_ext_demo.XXXXXX")"
trap 'rm -rf "$work"' EXIT
.venv/bin/sglang-glm-ext demo --dir "$work/demo" --keep
.venv/bin/sglang-glm-ext l3 fsck "$work/demo/l3.toml"
if [ -n "${L3_BENCH_GB:-}" ]; then
  .venv/bin/sglang-glm-ext l3 bench --dir "$work/bench" --size-gb "$L3_BENCH_GB" --repeats 3
fi
