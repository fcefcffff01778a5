#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite on a CPU-only machine. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
# SGLang's native page hash is a JIT C++ extension: build it inside the checkout, not in ~/.cache.
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}"
exec .venv/bin/python -m pytest "$@"
