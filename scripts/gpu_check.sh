#!/usr/bin/env bash
# Everything tbmem checks on a real GPU, in one run (issue 32; results in docs/gpu-validation.md).
#
#   bash scripts/gpu_check.sh [OUT_DIR]        # OUT_DIR defaults to $OUT, else ./gpu-check-out
#
# Meant for a lent machine with CUDA, torch and no network: the Python packages torch's image lacks
# travel as wheels in .whl/ (see DEVELOPERS.md, "On a lent GPU") and are installed into /tmp/site;
# tbmem itself runs from this checkout (PYTHONPATH), its C heap pass compiled in place. Each step
# is time-boxed (a step over its limit is killed and reported, the next one runs) and appends to
# OUT_DIR/gpu_check.log; each check's JSON and the real CUDA snapshots captured go to OUT_DIR as soon
# as they exist (a run cut short still leaves what it reached):
#   1. pytest -m gpu                       (pytest.txt)
#   2. SyntheticTrainer on CUDA, snapshot stats vs torch's memory_stats(), census unattributed
#   3. a real out-of-memory error inside monitored_step
#   4. the peak-memory forecast at held-out batch sizes
#   5. the trainer-overhead benchmark on CUDA (defaults, census every 50, the A/A control)
#   6. the per-hook profile of a monitored step and the cost of each CUDA read
# The exit status is the number of steps that failed.
set -u
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-gpu-check-out}}
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_check.log"
: > "$LOG"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
DEVICE=${GPU_CHECK_DEVICE:-cuda}  # cpu: a rehearsal of the same steps on a machine without a GPU
failed=0

step() {  # step NAME SECONDS COMMAND...: run it time-boxed, its output into the log
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    echo "=== $name (limit ${limit}s): $*" | tee -a "$LOG"
    timeout --kill-after=10 "$limit" "$@" >> "$LOG" 2>&1
    rc=$?
    echo "=== $name: exit $rc after $(( $(date +%s) - start ))s" | tee -a "$LOG"
    [ "$rc" -eq 0 ] || failed=$((failed + 1))
    return 0
}

keep() {  # keep NAME GLOB: the smallest file matching GLOB, gzipped as OUT_DIR/NAME (real CUDA test data)
    local f
    f=$(ls -S $2 2>/dev/null | tail -n 1)
    [ -n "$f" ] && gzip -c "$f" > "$OUT_DIR/$1"
    return 0
}
{
    echo "date: $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
    "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)'
} 2>&1 | tee -a "$LOG"

if ls .whl/*.whl >/dev/null 2>&1; then
    step wheels 60 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
step build 60 "$PY" setup.py -q build_ext --inplace
step recorder 90 "$PY" -m tbmem snapshot build-recorder

# 1. every test marked gpu (only the files that hold one: the others may import what this image lacks)
mapfile -t GPU_TESTS < <(grep -rl "mark.gpu" tests --include='test_*.py' | sort)
step pytest 150 "$PY" -m pytest -m gpu -p no:cacheprovider -q -rA "${GPU_TESTS[@]}"
# 2-4. the checks that need more than a test (scripts/gpu_check.py)
step trainer 120 "$PY" scripts/gpu_check.py trainer "$OUT_DIR" --device "$DEVICE"
keep trainer_cuda_snapshot.pickle.gz "$OUT_DIR/trainer_run/run/plugins/tbmem/snapshot_rank0_step*.pickle"
step oom 60 "$PY" scripts/gpu_check.py oom "$OUT_DIR" --device "$DEVICE"
keep oom_cuda_snapshot.pickle.gz "$OUT_DIR/oom_run/plugins/tbmem/oom_rank0_step*.pickle"
step forecast 90 "$PY" scripts/gpu_check.py forecast "$OUT_DIR" --device "$DEVICE"
keep forecast_cuda_snapshot.pickle.gz "$OUT_DIR/forecast_2048_snapshot.pickle" && rm -f "$OUT_DIR/forecast_2048_snapshot.pickle"
# 5. the overhead benchmark, shortened to fit the lease (default: 2 sessions of 4 timed epochs, ~80 s)
read -r -a BENCH_ARGS <<< "${GPU_CHECK_BENCH_ARGS:---sessions 2 --epochs 4}"
[ -n "${GPU_CHECK_SKIP_BENCH:-}" ] || step bench "${GPU_CHECK_BENCH_LIMIT:-180}" "$PY" \
    benchmarks/bench_trainer_overhead.py --device "$DEVICE" "${BENCH_ARGS[@]}"

# 6. where a monitored step's time goes, hook by hook, and what each CUDA read costs
step hooks 90 "$PY" benchmarks/profile_trainer_hooks.py --device "$DEVICE" --epochs 4

# The run folders, less the pickles (kept above) and the simulation cache, as one file.
runs=()
for d in trainer_run oom_run; do [ -d "$OUT_DIR/$d" ] && runs+=("$d"); done
[ ${#runs[@]} -eq 0 ] || { tar -czf "$OUT_DIR/runs.tar.gz" --exclude='*.pickle' --exclude='*.pt' \
    --exclude='cache' -C "$OUT_DIR" "${runs[@]}" && (cd "$OUT_DIR" && rm -rf "${runs[@]}"); }
echo "=== steps failed: $failed" | tee -a "$LOG"
exit "$failed"
