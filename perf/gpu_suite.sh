#!/usr/bin/env bash
# The one command for a lent GPU machine: one block of 15 minutes in all (its start included, at
# most 600 s per command), so the lean default takes about 4-5 minutes on one H100 and the whole
# suite stops itself at GPU_SUITE_BUDGET_S (default 540 s), leaving room for a rerun.
#
# The device command (run from the repo root; give it timeout_s=600 and carry [".whl"]):
#
#     MLHPC_CODE_VERSION=<git rev-parse --short HEAD> bash perf/gpu_suite.sh
#
# .whl/ is ignored by git, so it travels only when the call names it; perf/gpu_wheels.sh fills it
# here (mlperf-logging, zstandard, pycocotools, setuptools: what the stock image lacks). What comes
# back, flat under $OUT (at most 6 files): gpu_suite.md (the dated record), gpu_suite.log, the mini
# run's result log and breakdown JSON (and its power log with NVML), characterize.json (its page:
# `mlhpc characterize --compare` against this CPU's). Put the record into
# perf/RESULTS.md here with `python perf/gpu_suite_report.py --merge <files_at>/gpu_suite.md`.
#
# Steps, each limited to the smaller of its own limit and the time left:
# 0. preflight: mlhpc imports from the installed copy (never the repo's mlhpc/ folder: python
#    runs with PYTHONSAFEPATH=1), a GPU is visible (else one line and exit 1), NVML probed once;
# 1. full-size CosmoFlow and DeepCAM step throughput, synthetic batches made on the device:
#    eager fp32 and bf16 for both, compiled bf16 CosmoFlow (perf/gpu_throughput.py);
#    GPU_SUITE_LONG=1 adds compiled DeepCAM and compiled fp32 (minutes of compilation);
# 2. a CosmoFlow mini run to its target through `mlhpc run` (data and --out in a temporary folder);
# 3. the loop's overhead over a bare loop in the same precision and memory format;
# 4. NCCL on a 1-GPU group (perf/nccl_check.py under torchrun);
# 5. when time is left, `mlhpc characterize cosmoflow --config mini` (every level; its JSON comes back).
# A trap writes $OUT/gpu_suite.md on any exit; the exit status is 1 when any step failed.
#
# GPU_SUITE_SMOKE=1 runs every step tiny on the CPU (no GPU preflight, no NCCL): the CI rehearsal
# (tests/perf/test_gpu_suite_rehearsal.py) runs it so, with the project installed by --target.
# GPU_SUITE_FAIL_STEP=<n> makes step n fail (that test checks the exit status with it).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
PY=${PYTHON:-python3}
smoke=${GPU_SUITE_SMOKE:-0}
budget=${GPU_SUITE_BUDGET_S:-540}
started=$SECONDS
outdir=${OUT:-perf/gpu_suite_out}
mkdir -p "$outdir" && outdir=$(cd "$outdir" && pwd) || exit 1
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_suite.XXXXXX") || exit 1
log="$outdir/gpu_suite.log"
: >"$log"
: >"$work/steps.txt"
failed=0
say() { echo "gpu_suite: $*" | tee -a "$log" >&2; }

finish() {
    local status=$?
    [ "$failed" -ne 0 ] && status=1
    $PY perf/gpu_suite_report.py --work "$work" --out "$outdir" >>"$log" 2>&1 ||
        say "the record could not be written (see the end of gpu_suite.log)"
    rm -rf "$work" # made by mktemp above: the mini dataset, --out, the installed copy
    say "done in $((SECONDS - started)) s, exit $status; record: $outdir/gpu_suite.md"
    exit "$status"
}
trap finish EXIT
trap 'exit 143' TERM INT

# step N TITLE OWN_LIMIT_S COMMAND...: runs under min(own limit, time left), records the outcome.
step() {
    local n=$1 title=$2 own=$3 left limit rc begun
    shift 3
    left=$((budget - (SECONDS - started)))
    limit=$((own < left ? own : left))
    if [ "${GPU_SUITE_FAIL_STEP:-}" = "$n" ]; then
        set -- sh -c 'echo "forced to fail (GPU_SUITE_FAIL_STEP)"; exit 3'
        limit=$own
    elif [ "$limit" -lt 15 ]; then
        say "$n/5 $title: skipped, ${left} s left of the ${budget}-s budget"
        echo "$n|$title|0|0|skipped (no time left)" >>"$work/steps.txt"
        failed=1
        return
    fi
    say "$n/5 $title (limit $limit s)"
    begun=$SECONDS
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$log" | tail -n 40 >&2
    rc=${PIPESTATUS[0]}
    local outcome=ok
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && outcome="stopped at its $limit-s limit"
    [ "$rc" -ne 0 ] && [ "$outcome" = ok ] && outcome="failed (exit $rc)"
    [ "$rc" -ne 0 ] && failed=1
    echo "$n|$title|$limit|$((SECONDS - begun))|$outcome" >>"$work/steps.txt"
    say "$n/5 $title: $outcome in $((SECONDS - begun)) s"
}

install_project() {
    # The stock image has no mlhpc: the wheels it lacks from .whl/ (setuptools among them, for the
    # build below), then this tree, into a folder of the temporary directory.
    local site="$work/site"
    if ls .whl/*.whl >/dev/null 2>&1; then
        $PY -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl >>"$log" 2>&1 ||
            { say "cannot install the wheels in .whl/ (see gpu_suite.log)"; return 1; }
    fi
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    $PY -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$site" . >>"$log" 2>&1 ||
        { say "cannot install mlhpc with pip --no-deps --target (see gpu_suite.log; setuptools in .whl/?)"; return 1; }
}

# 0. preflight: an installed mlhpc (never the repo's folder), its dependencies, the GPU, NVML.
if ! $PY -c "import importlib.util as u; u.find_spec('mlhpc.common.training.loop') or exit(1)" >/dev/null 2>&1; then
    install_project || exit 1
fi
preflight="
import importlib.util, sys
try:
    import mlhpc, mlhpc.common.training.loop, mlhpc.benchmarks, mlperf_logging
except Exception as e:
    spec = importlib.util.find_spec('mlhpc')
    sys.exit(f'mlhpc does not import: {type(e).__name__}: {e} (mlhpc found at {spec.origin if spec else None}; '
             'a missing wheel goes in .whl/: perf/gpu_wheels.sh)')
import torch, torchvision
print('mlhpc from', mlhpc.__file__)
print(f'torch {torch.__version__}, torchvision {torchvision.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}')
print('python', sys.version.split()[0])
dali = importlib.util.find_spec('nvidia') and importlib.util.find_spec('nvidia.dali')
print('DALI:', 'installed (loader auto picks it on a GPU)' if dali else 'not installed: the mini run reads with torch DataLoader')
if '$smoke' != '1' and not torch.cuda.is_available():
    sys.exit('no GPU visible to torch (torch.cuda.is_available() is False); run it on the GPU machine, or GPU_SUITE_SMOKE=1 on a CPU')
if torch.cuda.is_available():
    print('GPU:', torch.cuda.get_device_name(0))
try:  # the energy counters, probed once: the mini run gets --power only where they read
    import pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
    print(f'energy: NVML total energy readable ({n.nvmlDeviceGetTotalEnergyConsumption(h)} mJ so far): the mini run gets --power')
except Exception as e:
    print(f'energy: not measured (NVML: {type(e).__name__}: {e})')
"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    # --dirty: the device machine lays the session's tree over an older commit, so a bare hash lies.
    echo "code: ${MLHPC_CODE_VERSION:-$(git describe --always --dirty 2>/dev/null || echo 'unknown (set MLHPC_CODE_VERSION)')}"
    echo "cpu: $(nproc) cores"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/nvidia-smi: /'
} >"$work/env.txt"
if ! $PY -c "$preflight" >>"$work/env.txt" 2>"$work/preflight.err" || [ "${GPU_SUITE_FAIL_STEP:-}" = 0 ]; then
    cat "$work/preflight.err" >>"$log"
    say "$(tail -n 1 "$work/preflight.err")"
    echo "0|preflight|0|0|failed: $(tail -n 1 "$work/preflight.err")" >>"$work/steps.txt"
    failed=1
    exit 1
fi
cat "$work/env.txt" | tee -a "$log" >&2
echo "0|preflight|0|$((SECONDS - started))|ok" >>"$work/steps.txt"
power=()
grep -q "^energy: NVML total energy readable" "$work/env.txt" && power=(--power)

if [ "$smoke" = 1 ]; then
    # Every path of the GPU run, as small as it goes: the mini's target is met after one epoch.
    throughput=(--device cpu --smoke --steps 1 --batch 2 --cases cosmoflow:fp32:eager deepcam:fp32:eager)
    mini=(--device cpu loop.max_epochs=1 loop.target=1.0 data.num_train_samples=64 data.num_eval_samples=32)
    overhead=(--device cpu --batch 2 --steps 2 --epochs 1 --rounds 1)
    characterize=(--device cpu --steps 1 --io-samples 2 --memory-batches 1,2)
else
    cases=(cosmoflow:fp32:eager cosmoflow:bf16:eager cosmoflow:bf16:compiled deepcam:fp32:eager deepcam:bf16:eager)
    [ "${GPU_SUITE_LONG:-0}" = 1 ] && cases+=(deepcam:bf16:compiled cosmoflow:fp32:compiled)
    throughput=(--device cuda --steps 20 --cases "${cases[@]}")
    mini=(--device cuda)
    overhead=(--device cuda --config full --batch 8 --steps 10 --epochs 2 --rounds 3 --set loop.precision=bf16)
    characterize=(--device cuda --steps 5 --batch-size 8)
fi

step 1 "training-step throughput, full-size models" 300 \
    $PY perf/gpu_throughput.py "${throughput[@]}" --markdown "$work/throughput.md"
step 2 "cosmoflow mini run to target through mlhpc run" 150 \
    env MLHPC_LOCAL_DIR="$work/local" $PY -m mlhpc run cosmoflow --config mini --seeds 1 --first-seed 1 \
    --out "$work/mini" --system gpu_suite --no-check "${power[@]}" "${mini[@]}"
# The mini run's result log, breakdown and power log, copied flat (what comes back is flat).
copy_flat() { # copy_flat NAME FIND-ARGS...: the first file find names, as $outdir/NAME
    local found
    found=$(find "$work/mini" -type f "${@:2}" 2>/dev/null | sort | head -n 1)
    [ -n "$found" ] && cp "$found" "$outdir/$1"
}
copy_flat mini_result.txt -path '*/results/*' -name 'result_*.txt'
copy_flat mini_breakdown.json -path '*/breakdown/*' -name 'result_*.json'
copy_flat mini_power.txt -path '*/power/*' -name '*.txt'
step 3 "loop overhead (same precision and memory format)" 90 \
    sh -c '"$@" >"$0" 2>&1; rc=$?; cat "$0"; exit $rc' "$work/overhead.log" $PY perf/loop_overhead.py "${overhead[@]}"
if [ "$smoke" = 1 ]; then
    echo "nccl: not run (smoke run on the CPU)" >"$work/nccl.log"
else
    step 4 "NCCL, a 1-GPU group" 60 \
        sh -c '"$@" >"$0" 2>&1; rc=$?; cat "$0"; exit $rc' "$work/nccl.log" \
        $PY -m torch.distributed.run --standalone --nproc_per_node=1 perf/nccl_check.py
fi
step 5 "characterize cosmoflow mini, every level" 90 \
    $PY -m mlhpc characterize cosmoflow --config mini --out "$work/characterize" "${characterize[@]}"
if [ -f "$work/characterize/characterize.json" ]; then cp "$work/characterize/characterize.json" "$outdir/"; fi
