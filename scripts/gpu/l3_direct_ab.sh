#!/usr/bin/env bash
# Issue 13's proof on the GPU machine's disk: the L3 bench before (main's engine, carried as .ab/before) vs after
# (this tree), alternated in one run by benchmark/l3_ab.py: reload throughput vs raw O_DIRECT, reload CPU s/GB vs a
# raw read + xxh3, spill, vectored vs single-transfer layer-first reads, and cold_start=load in s per million pages.
#
# Needs python3 >= 3.11 and nothing installed beyond it: no SGLang, no torch (the L3 engine imports neither). The
# wheels the engine needs (lmdb, numpy, xxhash; cp312 manylinux x86_64) come from .devcarry/ and go to a private
# target directory; .ab/before/sglang_glm_ext is `git archive <main> sglang_glm_ext`. Both paths are gitignored:
# carry them. Writes ab.txt (the table, rewritten after every run) and each run's JSON under $OUT/ab.
#
#   bash scripts/gpu/l3_direct_ab.sh [size_gb] [rounds]        (defaults: 1 GB per page size, 2 rounds: ~5 min)
set -u
size=${1:-1}
rounds=${2:-2}
out=${OUT:-/tmp/l3ab_out}/ab
dir=${L3_BENCH_DIR:-/tmp/l3_bench}
site=/tmp/l3site
mkdir -p "$out"
rm -rf "$site"
if ! python3 -m pip install -q --no-index --no-deps --target "$site" .devcarry/*.whl 2>"$out/pip.txt"; then
  # No pip: a wheel is a zip whose root is the site directory.
  python3 -c "import glob, sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in glob.glob('.devcarry/*.whl')]" "$site" || exit 3
fi
export PYTHONPATH="$site"
python3 - <<'PY' || exit 4
import sys
sys.path.insert(0, ".")
import sglang_glm_ext.l3.engine.store, sglang_glm_ext.l3.tools.bench  # noqa: E401,F401
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"sglang", "torch"})
assert not loaded, f"the L3 engine imported {loaded}"
print("L3 engine imports without SGLang or torch; python", sys.version.split()[0])
PY
{ df -hT "$(dirname "$dir")" | tail -1; nproc; uname -r; } | tee "$out/machine.txt"
rm -rf "$dir"
timeout -k 15 540 python3 benchmark/l3_ab.py --before .ab/before --after . --rounds "$rounds" --out "$out" -- \
  --dir "$dir" --size-gb "$size" --repeats 3 --skip-hicachefile --load-pages 120000
rc=$?
rm -rf "$dir"
exit $rc
