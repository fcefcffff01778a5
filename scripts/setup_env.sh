#!/usr/bin/env bash
# Build the project's environment on a fresh clone, CPU-only machine included.
#   bash scripts/setup_env.sh            -> .venv with torch, sglang 0.5.23 (no deps), its CPU deps, what its HTTP
#                                           server imports on a CPU, this package
# Idempotent: re-running only installs what is missing. VENV=path overrides the location.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
# This machine's pip config lists local indexes that lack most names; pip warns once per name. Drop that noise.
pip_i() { "$VPY" -m pip install --disable-pip-version-check --no-warn-conflicts -q "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }

# 1. torch first, pinned to the pair SGLang 0.5.23 was built against (torchvision is imported by sglang at load).
"$VPY" -c "import torch, torchvision; assert torch.__version__.startswith('2.14.1')" 2>/dev/null \
  || pip_i "torch==2.14.1" "torchvision==0.29.1"
# 2. SGLang without its dependency tree (its full tree needs CUDA-only sdists).
"$VPY" -c "import importlib.metadata as m; assert m.version('sglang')=='0.5.23'" 2>/dev/null \
  || pip_i --no-deps "sglang==0.5.23"
# 3. The pure-Python dependencies of the SGLang modules we import, then this package with its test extra.
#    (--no-warn-conflicts: sglang is installed without its CUDA-only requirements on purpose.)
pip_i -r requirements/sglang-cpu-deps.txt
# 4. What SGLang's real HTTP server imports on this CPU (the CPU serving mode, the main job, `-m server` tests).
pip_i -r requirements/sglang-server-deps.txt
pip_i -e ".[test]"
"$VPY" -m sglang_glm_ext.cli doctor --brief || true
echo "environment ready: $VENV"
