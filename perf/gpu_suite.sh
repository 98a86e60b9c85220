#!/usr/bin/env bash
# The one command to run on a GPU machine (about 15 minutes on one H100; every step has a time
# limit, the whole suite under 20 minutes):
#
#     bash perf/gpu_suite.sh
#
# 1. full-size CosmoFlow and DeepCAM training-step throughput through the shared loop, fp32 and
#    bf16, compiled and not (perf/gpu_throughput.py), beside the published per-GPU figures;
# 2. a CosmoFlow mini run to its target through `mlhpc run` on the GPU;
# 3. the loop's overhead over a bare PyTorch loop on the GPU (perf/loop_overhead.py);
# 4. the NCCL path of a 1-GPU group (perf/nccl_check.py under torchrun).
# It then writes one dated record, newest first, into perf/RESULTS.md (and $OUT/gpu_suite.md).
#
# GPU_SUITE_SMOKE=1 runs every step tiny on the CPU (no NCCL) and writes the record only under
# $OUT: the test suite does that, so that this script is ready for the first GPU at hand.
#
# The machine's own PyTorch stays: the project goes in with `pip install --no-deps`, and what the
# image lacks comes from wheels in .whl/ (perf/gpu_wheels.sh downloads them where an index is).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
outdir=${OUT:-perf/gpu_suite_out}
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
say() { echo "gpu_suite: $*" >&2; }
results=perf/RESULTS.md
throughput_args=()
mini_args=()
overhead_args=(--device cuda --config full --batch 8 --steps 20 --epochs 2 --rounds 5 --set loop.precision=bf16)
if [ "${GPU_SUITE_SMOKE:-0}" = 1 ]; then
    results="$outdir/RESULTS.md"
    throughput_args=(--device cpu --smoke --steps 2 --batch 2 --compile no --precisions fp32)
    mini_args=(--device cpu loop.max_epochs=1)
    overhead_args=(--device cpu --steps 2 --epochs 1 --rounds 1)
fi

site=$(mktemp -d)
if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl || {
        say "cannot install the wheels in .whl/"
        exit 1
    }
fi
$PY -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$site" . || {
    say "cannot install mlhpc (pip install --no-deps .)"
    exit 1
}
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
$PY -c "import mlhpc.common.loop, mlhpc.benchmarks, mlperf_logging" || {
    say "mlhpc does not import; carry the missing wheels in .whl/ (perf/gpu_wheels.sh)"
    exit 1
}

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    nvidia-smi -L 2>/dev/null || echo "GPU: none visible to nvidia-smi"
    echo "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
    $PY -c "import torch, torchvision; print(f'torch {torch.__version__}, torchvision {torchvision.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}')"
    echo "code: $(git rev-parse --short HEAD 2>/dev/null || echo "${MLHPC_CODE_VERSION:-unknown (no .git)}")"
    echo "cpu: $(nproc) cores"
} >"$outdir/env.txt" 2>&1
cat "$outdir/env.txt" >&2

say "1/4 training-step throughput (full-size models)"
timeout 660 $PY perf/gpu_throughput.py "${throughput_args[@]}" --markdown "$outdir/throughput.md" 2>&1 | tee "$outdir/throughput.log" >&2

say "2/4 cosmoflow mini run to target through mlhpc run"
rm -rf "$outdir/mini"
MLHPC_LOCAL_DIR="$outdir/local" timeout 300 $PY -m mlhpc run cosmoflow --config mini --seeds 1 \
    --first-seed 1 --out "$outdir/mini" --system gpu_suite --no-check "${mini_args[@]}" 2>&1 | tail -n 30 | tee "$outdir/mini.log" >&2

say "3/4 loop overhead on the GPU"
timeout 240 $PY perf/loop_overhead.py "${overhead_args[@]}" 2>&1 | tee "$outdir/overhead.log" >&2

say "4/4 NCCL, a 1-GPU group"
if [ "${GPU_SUITE_SMOKE:-0}" = 1 ]; then
    echo "nccl: not run (smoke run on the CPU)" >"$outdir/nccl.log"
else
    timeout 120 $PY -m torch.distributed.run --standalone --nproc_per_node=1 perf/nccl_check.py 2>&1 |
        tee "$outdir/nccl.log" >&2
fi

$PY perf/gpu_suite_report.py "$outdir" --results "$results"
