#!/usr/bin/env bash
# Build the project's Dockerfile with podman and run the main job (1 seed) in it, twice, in two
# containers writing one submission: the two results must land under one system name (inside a
# container the host name is the container's random id, so nothing may be derived from it).
#
#   sudo scripts/container_main_job.sh [WORK]        # WORK: where the image's base and the runs go
#
# Slow (a base image from Debian's packages, torch installed in the image: ~10 minutes on
# 2 cores) and needs root, podman and network access to Debian and PyPI; so it is its own
# command, not part of every CI run. On Debian: apt-get install -y debootstrap podman runc.
# Prints the system folders it found and exits non-zero if the check fails.
set -euo pipefail
cd "$(dirname "$0")/.."

WORK=${1:-/tmp/mlhpc-container}
BASE=localhost/debian-py:bookworm
IMAGE=localhost/mlhpc:main-job
# runc: crun fails on some VMs' cgroups; cgroupfs: no systemd inside CI machines.
P=(podman --runtime runc --cgroup-manager=cgroupfs)

die() {
    echo "container_main_job.sh: $*" >&2
    exit 1
}
[[ $(id -u) == 0 ]] || die "run as root (podman's rootful storage, debootstrap)"
for tool in podman debootstrap runc; do
    command -v "$tool" >/dev/null || die "$tool is missing; apt-get install -y debootstrap podman runc"
done
mkdir -p "$WORK"
if [[ ! -e /etc/containers/containers.conf ]]; then
    # No ulimit overrides: the VM's hard limits are lower than podman's defaults.
    mkdir -p /etc/containers
    printf '[containers]\ndefault_ulimits = []\n' >/etc/containers/containers.conf
fi

# No registry is needed: the base is Debian's own packages, imported as an image.
if ! "${P[@]}" image exists "$BASE"; then
    rootfs=$(mktemp -d "$WORK/rootfs.XXXXXX")
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
        bookworm "$rootfs" http://deb.debian.org/debian
    tar -C "$rootfs" -c . | "${P[@]}" import - "$BASE"
    rm -rf -- "$rootfs" # made by mktemp above
fi

started=$SECONDS
"${P[@]}" build --network=host \
    -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
    --build-arg BASE_IMAGE="$BASE" -t "$IMAGE" .
echo "built $IMAGE in $((SECONDS - started)) s"

runs=$(mktemp -d "$WORK/runs.XXXXXX")
for index in 0 1; do
    started=$SECONDS
    "${P[@]}" run --rm -v "$runs:/runs" "$IMAGE" \
        run cosmoflow --config mini --first-seed 1 --index "$index" \
        --out /runs/o --no-check
    echo "container $index: the 1-seed main job took $((SECONDS - started)) s"
done

systems=$(find "$runs/o/mlhpc/results" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort)
echo "system folders: $systems"
results=$(find "$runs/o/mlhpc/results" -name 'result_*.txt' | sort)
echo "results:"
echo "$results"
[[ $(wc -l <<<"$systems") == 1 ]] || die "the two containers filed their results under different systems"
[[ $(wc -l <<<"$results") == 2 ]] || die "expected result_0.txt and result_1.txt"
echo "ok: both containers' results are under $systems (in $runs)"
