#!/usr/bin/env bash
# The main job on a fresh machine: set up, then show what the plugin does here (doctor) and run the L3 engine
# end to end on a scratch directory (example config -> bench -> fsck).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
.venv/bin/sglang-glm-ext doctor
work="$(mktemp -d "${TMPDIR:-/var/tmp}/glm_ext_demo.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cfg="$(.venv/bin/sglang-glm-ext l3 example-config --dir "$work/l3")"
echo "example L3 config: $cfg"; cat "$cfg"
.venv/bin/sglang-glm-ext l3 bench --dir "$work/bench" --size-gb "${L3_DEMO_GB:-2}" --repeats 3
.venv/bin/sglang-glm-ext l3 fsck "$cfg"
