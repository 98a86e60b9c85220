#!/usr/bin/env bash
# Build and install Horovod 0.28.1 (PyTorch, Gloo, MPI) against torch 2.14 in the current Python.
# The last Horovod release ships only an sdist whose CMake files pin C++14, while torch 2.14's
# headers need C++20; this patches the two pins and builds (about 4 minutes on 2 cores).
#   PYTHON=.venv/bin/python scripts/install_horovod.sh
#   HOROVOD_WITH_MPI=0 scripts/install_horovod.sh        # Gloo only, no MPI needed
# Needs cmake and a C++ compiler; MPI builds need mpicxx (apt-get install -y libopenmpi-dev openmpi-bin).
# Then: mlhpc run ... --backend horovod, under horovodrun, mpirun or srun.
#
# The wheel it builds is kept per machine in $HOROVOD_CACHE (default ~/.cache/mlhpc/horovod), under a
# key of every version the build depends on (Horovod, torch, Python, MPI or not, compiler, machine);
# a later run with the same key installs it after checking its SHA-256, and builds from source
# when the key is new or the entry does not check. HOROVOD_CACHE=off: always build, keep nothing.
set -euo pipefail

PYTHON=${PYTHON:-python3}
HOROVOD_VERSION=${HOROVOD_VERSION:-0.28.1}
HOROVOD_WITH_MPI=${HOROVOD_WITH_MPI:-1}
# The CUDA build of torch makes Horovod's CMake look for the toolkit, even on a machine without a GPU.
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export CUDAToolkit_ROOT=${CUDAToolkit_ROOT:-$CUDA_HOME}

die() {
    echo "install_horovod.sh: $*" >&2
    exit 1
}

command -v cmake >/dev/null || die "cmake not found; apt-get install -y cmake (or pip install cmake)"
if [[ $HOROVOD_WITH_MPI == 1 ]] && ! command -v mpicxx >/dev/null; then
    die "mpicxx not found; apt-get install -y libopenmpi-dev openmpi-bin, or HOROVOD_WITH_MPI=0"
fi
"$PYTHON" -c 'import torch' 2>/dev/null || die "$PYTHON cannot import torch; install mlhpc first"

work=$(mktemp -d)
trap 'rm -rf -- "$work"' EXIT

"$PYTHON" -m pip install cloudpickle psutil wheel

cache_root=${HOROVOD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlhpc/horovod}
mpi_version=none
[[ $HOROVOD_WITH_MPI == 1 ]] && mpi_version=$(mpicxx --showme:version 2>/dev/null | tr -cs 'A-Za-z0-9.' '-' || echo mpi)
key=$(printf '%s\n' "$HOROVOD_VERSION" "$("$PYTHON" -c 'import sys, torch; print(torch.__version__, sys.implementation.cache_tag)')" \
    "$mpi_version" "$(c++ -dumpfullversion 2>/dev/null || echo cxx)" "$(uname -m)" "$(sha256sum "$0" | cut -c1-16)" |
    sha256sum | cut -c1-24)
entry=$cache_root/$key

horovodrun_check() {
    # horovodrun sits next to the interpreter it was installed for.
    "$(dirname -- "$("$PYTHON" -c 'import sys; print(sys.executable)')")/horovodrun" --check-build
}

# A cached wheel is installed only when its checksum holds; anything else is rebuilt, never trusted.
if [[ $cache_root != off && -f $entry/SHA256SUMS ]] && (cd "$entry" && sha256sum --quiet -c SHA256SUMS 2>/dev/null); then
    wheel=$(find "$entry" -maxdepth 1 -name 'horovod-*.whl' | head -n 1)
    if [[ -n $wheel ]] && "$PYTHON" -m pip install --no-deps --force-reinstall "$wheel" && horovodrun_check; then
        echo "install_horovod.sh: installed the wheel built earlier on this machine ($entry)"
        exit 0
    fi
    echo "install_horovod.sh: the cached wheel in $entry did not install; building from source" >&2
fi

"$PYTHON" -m pip download --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work"
tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
src=$work/horovod-$HOROVOD_VERSION

# Top level to C++17, the standard Horovod already forces on its bundled gloo (they must match, or
# gloo's kDefaultTimeout clashes at link time); the torch extension to C++20 for torch's headers.
sed -i 's/^set(CMAKE_CXX_STANDARD 14)$/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt"
sed -i 's/^\( *\)set(CMAKE_CXX_STANDARD 14)$/\1set(CMAKE_CXX_STANDARD 20)/' "$src/horovod/torch/CMakeLists.txt"
grep -q '^set(CMAKE_CXX_STANDARD 17)$' "$src/CMakeLists.txt" || die "patching $src/CMakeLists.txt failed"
grep -q 'set(CMAKE_CXX_STANDARD 20)' "$src/horovod/torch/CMakeLists.txt" ||
    die "patching $src/horovod/torch/CMakeLists.txt failed"

HOROVOD_WITH_PYTORCH=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 \
    HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITH_MPI=$HOROVOD_WITH_MPI \
    MAKEFLAGS=${MAKEFLAGS:--j$(nproc)} \
    "$PYTHON" -m pip wheel --no-deps --no-build-isolation --no-cache-dir -w "$work/wheel" "$src"
"$PYTHON" -m pip install --no-deps --force-reinstall "$work"/wheel/horovod-*.whl
horovodrun_check
echo "install_horovod.sh: built horovod $HOROVOD_VERSION from source"

# Kept for the next run on this machine: written beside the entry, then renamed into place.
if [[ $cache_root != off ]] && mkdir -p "$cache_root" 2>/dev/null; then
    staged=$(mktemp -d "$cache_root/.new-XXXXXX")
    cp "$work"/wheel/horovod-*.whl "$staged/" && (cd "$staged" && sha256sum horovod-*.whl >SHA256SUMS) &&
        { [[ ! -e $entry ]] || mv -T "$entry" "$staged.old"; } && mv -T "$staged" "$entry" &&
        echo "install_horovod.sh: kept the wheel in $entry" || echo "install_horovod.sh: could not keep the wheel in $entry" >&2
    rm -rf -- "$staged" "$staged.old"
fi
