#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite on a CPU-only machine. Extra args go to pytest.
# The order is shuffled (pytest-random-order: modules in a random order, the tests of each module in a random order,
# so a module's fixtures are still set up once) from a seed printed first, so any failure replays in the same order:
#   SGLANG_GLM_EXT_TEST_SEED=<n> bash scripts/test.sh     that seed (CI runs the fixed default below)
#   SGLANG_GLM_EXT_TEST_SEED=random bash scripts/test.sh  a new seed, printed
#   SGLANG_GLM_EXT_TEST_SEED=off bash scripts/test.sh     file order
set -euo pipefail
cd "$(dirname "$0")/.."
SEED="${SGLANG_GLM_EXT_TEST_SEED:-39}"
case "$SEED" in
  off) ORDER=() ;;
  random) SEED=$(( (RANDOM << 15) | RANDOM )); ORDER=(--random-order-bucket=module "--random-order-seed=$SEED") ;;
  ''|*[!0-9]*) echo "SGLANG_GLM_EXT_TEST_SEED must be a number, 'random' or 'off' (got '$SEED')" >&2; exit 2 ;;
  *) ORDER=(--random-order-bucket=module "--random-order-seed=$SEED") ;;
esac
bash scripts/setup_env.sh
# SGLang's native page hash is a JIT C++ extension: build it inside the checkout, not in ~/.cache.
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}"
if [ "$SEED" = off ]; then
  echo "test order: file order (SGLANG_GLM_EXT_TEST_SEED=off)"
else
  echo "test order: shuffled by modules, seed $SEED (replay: SGLANG_GLM_EXT_TEST_SEED=$SEED bash scripts/test.sh ...)"
fi
exec .venv/bin/python -m pytest ${ORDER[@]+"${ORDER[@]}"} "$@"
