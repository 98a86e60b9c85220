# mlhpc in a container. The default base is CPU-only Python and builds anywhere:
#   docker build -t mlhpc .
#   docker run --rm -v "$PWD/runs:/runs" mlhpc run cosmoflow --config mini --seeds 1 --out /runs
# The PyPI torch wheel already carries its CUDA libraries, so this image also trains on GPUs
# (docker run --gpus all ...). A CUDA base adds the toolkit (nvcc, for scripts/install_horovod.sh):
#   docker build --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04 -t mlhpc:cuda .
#   docker build --build-arg BASE_IMAGE=nvcr.io/nvidia/pytorch:25.04-py3 -t mlhpc:ngc .
# (the venv below does not see an NGC image's own torch: pip installs one in mlhpc's tested range.)
# Build and run it with podman, checked end to end: scripts/container_main_job.sh.
# DALI data loading (the gpu extra): --build-arg WITH_DALI=1
# Apptainer: apptainer build mlhpc.sif docker-daemon://mlhpc:latest, or see mlhpc.def.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG WITH_DALI=0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH
# Staging goes to $MLHPC_LOCAL_DIR, else $SLURM_TMPDIR/$TMPDIR, else /tmp; not set here so that
# an Apptainer image made from this one still follows the host's scheduler. For fast node-local
# disk under Docker: -v /local/nvme:/scratch -e MLHPC_LOCAL_DIR=/scratch.

# A venv keeps pip away from the base's system packages (PEP 668 on Ubuntu 24.04 bases).
# nvidia/cuda images have no Python and some Ubuntu ones lack venv: apt installs them then.
RUN python3 -m venv /opt/venv 2>/dev/null || { \
        apt-get update \
        && apt-get install -y --no-install-recommends python3 python3-venv python3-pip \
        && rm -rf /var/lib/apt/lists/* \
        && python3 -m venv --clear /opt/venv; }

# Sources change more often than the base: this layer (torch included) rebuilds on each change.
COPY . /src
RUN if [ "$WITH_DALI" = 1 ]; then pip install '/src[gpu]'; else pip install /src; fi \
    && install -m 0755 /src/run_and_time.sh /usr/local/bin/run_and_time.sh \
    && rm -rf /src \
    && mlhpc --version

WORKDIR /workspace
ENTRYPOINT ["mlhpc"]
CMD ["--help"]
