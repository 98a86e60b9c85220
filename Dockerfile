# mlhpc in a container. The default base is CPU-only Python and builds anywhere:
#   docker build -t mlhpc .
#   docker run --rm -v "$PWD/runs:/runs" mlhpc run cosmoflow --config mini --seeds 1 --out /runs
# The PyPI torch wheel already carries its CUDA libraries, so this image also trains on GPUs
# (docker run --gpus all ...). A CUDA base adds the toolkit (nvcc, for scripts/install_horovod.sh):
#   docker build --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04 -t mlhpc:cuda .
#   docker build --build-arg BASE_IMAGE=nvcr.io/nvidia/pytorch:25.04-py3 -t mlhpc:ngc .
# (the venv below does not see an NGC image's own torch: pip installs one in mlhpc's tested range.)
# Build and run it with podman, checked end to end: scripts/container_main_job.sh.
# Build arguments, as in mlhpc.def (scripts/image_install.sh is the one recipe both run):
#   TORCH=pypi|cu126|cu128|cpu|INDEX-URL  which torch build (PyPI's is CUDA 13, R580+ drivers;
#                                          cu126 runs on R525+; cpu is a fraction of the size)
#   WITH_MPI=1   Open MPI and mpi4py (mpirun)      WITH_DALI=0   1: DALI data loading
# Apptainer: apptainer build mlhpc.sif docker-daemon://mlhpc:latest, or see mlhpc.def.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH=pypi
ARG WITH_MPI=1
ARG WITH_DALI=0
ENV PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH
# Staging goes to $MLHPC_LOCAL_DIR, else $SLURM_TMPDIR/$TMPDIR, else /tmp; not set here so that
# an Apptainer image made from this one still follows the host's scheduler. For fast node-local
# disk under Docker: -v /local/nvme:/local -e MLHPC_LOCAL_DIR=/local.

# Sources change more often than the base: this layer (torch included) rebuilds on each change.
COPY . /src
RUN sh /src/scripts/image_install.sh /src "$TORCH" "$WITH_MPI" "$WITH_DALI" && rm -rf /src

WORKDIR /workspace
ENTRYPOINT ["mlhpc"]
CMD ["--help"]
