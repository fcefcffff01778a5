#!/usr/bin/env bash
# The main job on a fresh machine: set up, then show what the plugin does here (doctor) and run the L3 engine
# end to end on a scratch directory (example config -> bench -> fsck).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
.venv/bin/sglang-glm-ext doctor
if .venv/bin/sglang-glm-ext l3 --help >/dev/null 2>&1; then
  work="$(mktemp -d "${TMPDIR:-/var/tmp}/glm_ext_demo.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  .venv/bin/sglang-glm-ext l3 example-config --dir "$work/l3" > "$work/l3.toml"
  .venv/bin/sglang-glm-ext doctor --cp-l3-config "$work/l3.toml" --brief || true
  .venv/bin/sglang-glm-ext l3 bench --dir "$work/bench" --size-gb "${L3_DEMO_GB:-1}" --repeats 3
fi
