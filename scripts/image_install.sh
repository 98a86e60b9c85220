#!/bin/sh
# Installs mlhpc into /opt/venv while a container image is built: mlhpc.def's %post and the
# Dockerfile's RUN both call this one recipe, so the two images cannot drift apart.
#
#   image_install.sh SRC TORCH WITH_MPI WITH_DALI
#
# SRC        the copied checkout (pyproject.toml, the packages, .ci/constraints.txt)
# TORCH      which torch build: pypi (PyPI's wheel: CUDA 13, needs an R580+ driver), cu126 or
#            cu128 (CUDA 12: R525+/R570+ drivers), cpu (no CUDA: a fraction of the size), or an
#            index URL of your own (a site mirror); torch and torchvision come from there
# WITH_MPI   1: Open MPI's runtime and mpi4py, so `mpirun` can launch the ranks
# WITH_DALI  1: the gpu extra (NVIDIA DALI data loading)
#
# The tested torch pair (.ci/constraints.txt) is kept whatever the index: 2.14.1+cpu or +cu126
# satisfy torch==2.14.1. The usual bind targets of HPC sites exist, empty, so a runtime that
# cannot create mount points in a read-only image (Charliecloud, Apptainer without overlay)
# can still bind there.
set -eu
src=${1:?SRC} torch=${2:?TORCH} with_mpi=${3:?WITH_MPI} with_dali=${4:?WITH_DALI}

case $torch in
pypi) torch_index= ;;
cpu | cu1[0-9][0-9]) torch_index=https://download.pytorch.org/whl/$torch ;;
http://* | https://* | file://*) torch_index=$torch ;;
*)
    echo "image_install.sh: TORCH=$torch: give pypi, cpu, cu126, cu128 or an index URL" >&2
    exit 2
    ;;
esac

export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export PIP_CONSTRAINT="$src/.ci/constraints.txt"
apt_packages=
# nvidia/cuda bases have no Python and some Ubuntu ones lack venv: apt installs them then.
python3 -m venv /opt/venv 2>/dev/null || apt_packages="python3 python3-venv python3-pip"
[ "$with_mpi" = 1 ] && apt_packages="$apt_packages openmpi-bin"
if [ -n "$apt_packages" ]; then
    apt-get update
    # shellcheck disable=SC2086 # a list of package names
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $apt_packages
    rm -rf /var/lib/apt/lists/*
    [ -x /opt/venv/bin/python ] || python3 -m venv --clear /opt/venv
fi

# Built from a checkout, so drop caches that the copy may have brought along.
find "$src" -name __pycache__ -prune -exec rm -rf {} +
if [ -n "$torch_index" ]; then
    /opt/venv/bin/pip install --index-url "$torch_index" torch torchvision
fi
extras=
[ "$with_mpi" = 1 ] && extras=mpi
[ "$with_dali" = 1 ] && extras="${extras:+$extras,}gpu"
/opt/venv/bin/pip install "$src${extras:+[$extras]}"
install -m 0755 "$src/run_and_time.sh" /usr/local/bin/run_and_time.sh
mkdir -p /local /scratch /data /runs
# On the default PATH of every runtime (pyxis and Charliecloud do not read the image's ENV).
ln -sf /opt/venv/bin/mlhpc /usr/local/bin/mlhpc
/opt/venv/bin/mlhpc --version
