#!/usr/bin/env bash
# The GPU bring-up tier on a lent GPU machine, in ONE command (each call there is capped at 10 minutes):
#
#   bash scripts/gpu/served.sh [--standins] [--gpu-tests] [--bench ARGS] [TARGET ...]
#       TARGET = arch:layout[:io_backend], e.g. glm5:page_first glm4_moe:layer_first glm5:layer_first:direct
#
# run from the repo root with carry [".gpucarry", ".gpucache"] (.gpucarry: `python3 scripts/gpu/build_carry.py` here;
# .gpucache: the previous call's cache.tgz, copied back from its $OUT, or absent). In order, each step bounded so
# that what finished is kept in $OUT when the deadline (DEADLINE seconds after the start, default 550) comes:
#   --standins   tests/gpu_bringup/test_gpu.py: every stand-in against its reference on this GPU (alongside the runs)
#   TARGET ...   `sglang-glm-ext gpu-bringup run` per target, all at once (a few seconds apart): SGLang's real
#                server with pinned HiCache pools, SGLang's copy kernels, L3, restart, CUDA-graph phase, negative
#                control, fsck; $OUT/run_<target>.log each, summaries and server logs in $OUT/results.tgz
#   --bench ARGS benchmark/cpu_server_bench.py --gpu ARGS (quoted as one word); $OUT/bench.log
#   --gpu-tests  the suite's GPU-marked tests (pytest -m gpu -v: a deadline keeps each finished test's line), the
#                stand-ins active in the test process and in every server it starts; $OUT/pytest_gpu.log;
#                GPU_TESTS_PATHS (default: tests) narrows them to some files when the device time is short
# SGLang's run-time-compiled kernels and Triton's cache go back in $OUT/cache.tgz (at most 12 MiB: with .gpucarry and the tree it must fit the 64 MiB a call carries) for the next call,
# which reports the server ready times with them.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu_out}
DEADLINE=${DEADLINE:-550}
mkdir -p "$OUT"
T0=$SECONDS
left() { echo $(( DEADLINE - (SECONDS - T0) )); }

source scripts/gpu/install_carry.sh || exit 1
# What SGLang 0.5.23 needs on a GPU without sgl-kernel (gpu_bringup/feature.py says why), and the tier itself.
export SGLANG_GLM_EXT_GPU_BRINGUP=1 SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python \
    SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1 PYTHONUNBUFFERED=1
export SGLANG_CACHE_DIR=/tmp/sglang_cache TVM_FFI_CACHE_DIR=/tmp/sglang_cache/tvm-ffi \
    TRITON_CACHE_DIR=/tmp/sglang_cache/triton
mkdir -p "$SGLANG_CACHE_DIR"
if [ -f .gpucache/cache.tgz ]; then
    tar xzf .gpucache/cache.tgz -C /tmp && echo "served.sh: caches restored ($(du -sh "$SGLANG_CACHE_DIR" | cut -f1))"
else
    echo "served.sh: no carried cache: every kernel compiles in this call"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

STANDINS=0; GPU_TESTS=0; BENCH=""; TARGETS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --standins) STANDINS=1 ;;
        --gpu-tests) GPU_TESTS=1 ;;
        --bench) BENCH="$2"; shift ;;
        *) TARGETS+=("$1") ;;
    esac
    shift
done
# The stand-in on sys.path of pytest's own process (its SGLang imports run before any plugin code could put it there).
SHADOW=$PWD/sglang_glm_ext/gpu_bringup/_shadow

if [ "$STANDINS" = 1 ]; then  # alongside the served runs: a GPU and 16 cores hold both
    (PYTHONPATH=$SHADOW:$PYTHONPATH timeout "$(left)" python3 -m pytest -q -p no:cacheprovider \
        tests/gpu_bringup -m "not slow" >"$OUT/pytest_standins.log" 2>&1
     echo "served.sh: stand-in checks exit $? ($(tail -n 1 "$OUT/pytest_standins.log"))") &
    STANDINS_PID=$!
fi

pids=()
for t in ${TARGETS[@]+"${TARGETS[@]}"}; do
    IFS=: read -r arch layout io <<<"$t"
    name="${arch}_${layout}${io:+_$io}"
    timeout "$(( $(left) - 20 ))" python3 -m sglang_glm_ext.cli gpu-bringup run --dir "/tmp/work/$name" --arch "$arch" \
        --layout "$layout" --io-backend "${io:-kernel}" >"$OUT/run_$name.log" 2>&1 &
    pids+=("$!:$name")
    sleep 8  # first compiles of a kernel by several servers at once would race for its cache entry
done
for p in ${pids[@]+"${pids[@]}"}; do
    wait "${p%%:*}"; echo "served.sh: ${p#*:} exit $? ($(grep -E '^(OK|FAIL)' "$OUT/run_${p#*:}.log" | head -3 | tr '\n' ' '))"
done
[ -n "${STANDINS_PID:-}" ] && wait "$STANDINS_PID"
if [ ${#TARGETS[@]} -gt 0 ]; then
    (cd /tmp/work && tar czf "$OUT/results.tgz" --exclude='model*' --exclude='l3' ./*/summary.json ./*/*.log 2>/dev/null)
fi

if [ -n "$BENCH" ] && [ "$(left)" -gt 60 ]; then
    # with --gpu-tests, GPU_TESTS_S seconds (default 150) are kept for them
    # shellcheck disable=SC2086
    timeout "$(( $(left) - 15 - (GPU_TESTS ? ${GPU_TESTS_S:-150} : 0) ))" python3 benchmark/cpu_server_bench.py --gpu \
        --dir /tmp/bench $BENCH \
        >"$OUT/bench.log" 2>&1
    echo "served.sh: bench exit $?"; tail -n 8 "$OUT/bench.log"
fi

if [ "$GPU_TESTS" = 1 ] && [ "$(left)" -gt 60 ]; then
    # SIGINT at the deadline: pytest stops there and still prints its summary with every failure so far
    PYTHONPATH=$SHADOW:$PYTHONPATH timeout -s INT -k 20 "$(( $(left) - 35 ))" python3 -m pytest -m gpu -rA -v \
        -p no:cacheprovider ${GPU_TESTS_PATHS:-tests} >"$OUT/pytest_gpu.log" 2>&1
    echo "served.sh: GPU-marked tests exit $? ($(tail -n 1 "$OUT/pytest_gpu.log"))"
fi

# Caches back for the next call (bounded: what comes back is at most 16 MiB a file).
(cd /tmp && tar czf "$OUT/cache.tgz" sglang_cache 2>/dev/null)
if [ "$(stat -c %s "$OUT/cache.tgz" 2>/dev/null || echo 0)" -gt $((12 << 20)) ]; then
    (cd /tmp && tar czf "$OUT/cache.tgz" --exclude='sglang_cache/inductor' --exclude='sglang_cache/nv' sglang_cache)
fi
if [ "$(stat -c %s "$OUT/cache.tgz" 2>/dev/null || echo 0)" -gt $((12 << 20)) ]; then  # Triton's last
    (cd /tmp && tar czf "$OUT/cache.tgz" --exclude='sglang_cache/inductor' --exclude='sglang_cache/nv' \
        --exclude='sglang_cache/triton' sglang_cache)
fi
echo "served.sh: cache.tgz $(du -h "$OUT/cache.tgz" | cut -f1); $((SECONDS - T0)) s"
