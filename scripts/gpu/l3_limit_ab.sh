#!/usr/bin/env bash
# Issue 28's proof on the GPU machine's disk, in one device command (< 9 minutes at the defaults):
#   1. fio's sweep (iodepth x numjobs) of O_DIRECT sequential write and random read at the slot sizes of GLM-5's
#      3,274,752 B page and a 1 MiB page, on the bench's directory: the disk's limit (fio_sweep.json / .txt);
#   2. the checksum's own cost: xxh3 GB/s on one core vs that core's memory bandwidth (checksum_cost.json / .txt);
#   3. layer-first checksums holding the GIL (xxhash update()) vs a GIL-free ctypes path (gil_*.json / .txt);
#   4. before / after A/B (benchmark/l3_ab.py, >= 3 interleaved rounds): the L3 bench against the engine of commit
#      e3c98ce (.ab/before) and this tree's, GLM-5 and 1 MiB pages, page-first and layer-first, each store pass
#      paired with fio's best point, the store at fio's best number of I/Os in flight (--reload-threads fio)
#      (ab/ab.txt: the table, rewritten after every run; ab/*.json: every run).
#
# Needs python3 >= 3.11 and nothing installed beyond it: no SGLang, no torch (the L3 engine imports neither). Carried
# (gitignored, name them in `carry`): .devcarry/ with the lmdb, numpy and xxhash (>= 4.1.0) wheels for this python
# (cp312 manylinux x86_64) and .devcarry/fio_carry/fio (a static fio; docs_internal/l3_design.md, issue 28, says how
# to rebuild it); .ab/before/sglang_glm_ext = `git archive e3c98ce sglang_glm_ext`. Without fio the bench says so and
# keeps its own references. Everything lands under $OUT/l3limit.
#
#   bash scripts/gpu/l3_limit_ab.sh [size_gb] [rounds] [fio_seconds]     (defaults: 1 GB per page size, 3 rounds, 2 s)
#   env: L3_BENCH_DIR (default /tmp/l3_bench), FIO (default .devcarry/fio_carry/fio), L3_FIO_GRID (default small),
#        L3_RELOAD_THREADS (default fio), L3_IO_THREADS (default 4; fio = fio's best writes in flight),
#        L3_SKIP_COSTS=1 (skip steps 2 and 3), L3_DEADLINE_S (default 540: the A/B is cut there, its table kept),
#        L3_AB_BEFORE (default .ab/before: the "before" engine, e.g. `git archive HEAD` of the last commit),
#        L3_ALT_MODES=1 (also time the engine's other layer-first read mode: vectored vs single transfer)
set -u
t0=$(date +%s)
size=${1:-1}
rounds=${2:-3}
fio_s=${3:-2}
out=${OUT:-/tmp/l3limit_out}/l3limit
dir=${L3_BENCH_DIR:-/tmp/l3_bench}
fio=${FIO:-.devcarry/fio_carry/fio}
grid=${L3_FIO_GRID:-small}
threads=${L3_RELOAD_THREADS:-fio}
io_threads=${L3_IO_THREADS:-4}
deadline=${L3_DEADLINE_S:-540}
alt=--skip-alt-modes
[ "${L3_ALT_MODES:-0}" = 1 ] && alt=
site=/tmp/l3site
mkdir -p "$out"
rm -rf "$site" "$dir"
mkdir -p "$dir"
left() { echo $(( deadline - ($(date +%s) - t0) )); }

# The wheels for this python: pip where there is one, else unzip (a wheel is a zip whose root is the site dir).
tag=$(python3 -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
if ! python3 -m pip install -q --no-index --no-deps --find-links .devcarry --target "$site" lmdb numpy xxhash \
    >"$out/pip.txt" 2>&1; then
  python3 - "$site" "$tag" <<'PY' || exit 3
import glob, sys, zipfile
site, tag = sys.argv[1:]
for name in ("lmdb", "numpy", "xxhash"):
    whl = sorted(glob.glob(f".devcarry/{name}-*-{tag}-*.whl"))
    if not whl:
        sys.exit(f"no {name} wheel for {tag} in .devcarry/")
    zipfile.ZipFile(whl[-1]).extractall(site)
print("wheels unzipped (no pip)")
PY
fi
export PYTHONPATH="$site:."
python3 - <<'PY' 2>&1 | tee "$out/env.txt" || exit 4
import sys
import sglang_glm_ext.l3.engine.store, sglang_glm_ext.l3.tools.bench  # noqa: E401,F401
from sglang_glm_ext.l3.disk.format import checksum_build
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"sglang", "torch"})
assert not loaded, f"the L3 engine imported {loaded}"
print("L3 engine imports without SGLang or torch; python", sys.version.split()[0])
print("checksum build:", checksum_build())
PY
{ df -hT "$dir" | tail -1; nproc; uname -r; grep -m1 "model name" /proc/cpuinfo; free -g | head -2; } \
  | tee "$out/machine.txt"

# 1. fio's sweep (reused by every bench run below; each repeat runs its best point again beside the store).
sweep_args=()
if [ -x "$fio" ] && "$fio" --version >"$out/fio_version.txt" 2>&1; then
  echo "[$(( $(date +%s) - t0 ))s] fio sweep ($(cat "$out/fio_version.txt"), grid $grid, $fio_s s/point)"
  timeout -k 10 300 python3 -m sglang_glm_ext.l3.tools.fio --dir "$dir" --bs 3276800 1052672 --seconds "$fio_s" \
    --grid "$grid" --size-gb "$size" --fio "$fio" --json "$out/fio_sweep.json" 2>&1 | tee "$out/fio_sweep.txt"
  if grep -q '"gbps"' "$out/fio_sweep.json" 2>/dev/null; then
    sweep_args=(--fio "$fio" --fio-sweep "$out/fio_sweep.json" --fio-seconds "$fio_s")
  else
    echo "fio's sweep gave no result (fio_sweep.txt says why): the bench reports its own references only"
    threads=4
    io_threads=4
  fi
else
  echo "fio absent or not runnable at $fio: the bench reports its own references only" | tee "$out/fio_sweep.txt"
  threads=4
  io_threads=4
fi
rm -f "$dir"/fio.*.dat

# 2. the checksum's cost on one core vs memory bandwidth.
if [ "${L3_SKIP_COSTS:-0}" != 1 ]; then
echo "[$(( $(date +%s) - t0 ))s] checksum cost"
timeout -k 10 120 python3 benchmark/l3_checksum_cost.py --cold-gib 2 --seconds 0.3 --json "$out/checksum_cost.json" \
  2>&1 | tee "$out/checksum_cost.txt"

# 3. layer-first checksums: GIL held per chunk (update()) vs released (ctypes), on this tree's reload path.
for page in 1048576 3274752; do
  echo "[$(( $(date +%s) - t0 ))s] layer-first GIL, page $page"
  timeout -k 10 90 python3 benchmark/l3_layer_first_gil.py --dir "$dir/gil" --gb "$size" --page "$page" \
    --threads 4 --rounds 3 --json "$out/gil_$page.json" 2>&1 | tee "$out/gil_$page.txt"
done
fi

# 4. the A/B, cut at the deadline (ab.txt holds every run finished by then).
echo "[$(( $(date +%s) - t0 ))s] A/B: $rounds rounds, $(left) s left"
timeout -k 15 "$(left)" python3 benchmark/l3_ab.py --before "${L3_AB_BEFORE:-.ab/before}" --after . --rounds "$rounds" \
  --out "$out/ab" -- --dir "$dir" --size-gb "$size" --repeats 1 --skip-hicachefile $alt \
  --reload-threads "$threads" --io-threads "$io_threads" ${sweep_args[@]+"${sweep_args[@]}"}
rc=$?
echo "[$(( $(date +%s) - t0 ))s] done (A/B exit $rc)"
rm -rf "$dir"
exit $rc
