#!/usr/bin/env bash
# Download, on a machine with a package index, the wheels perf/gpu_suite.sh needs on a GPU machine
# whose stock PyTorch image has everything else (torch, torchvision, h5py, xxhash, timm,
# torchmetrics, rich, matplotlib) and no index: into .whl/ at the repo root (ignored by git: the
# device call must carry it, carry=[".whl"]). setuptools builds the project there
# (pip --no-build-isolation). Python 3.12, x86-64, as the lent machines run.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl "mlperf-logging==${MLPERF_LOGGING_VERSION:-4.1.68}" zstandard pycocotools setuptools
ls -1 .whl
