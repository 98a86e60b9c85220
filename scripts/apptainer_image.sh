#!/usr/bin/env bash
# mlhpc.def built and run with a real Apptainer (scripts/apptainer_tree.sh's), as CI does it.
#
#   sudo scripts/apptainer_image.sh build WORK [--build-arg KEY=VALUE]...   # WORK/mlhpc.sif
#   sudo scripts/apptainer_image.sh main-job WORK     # 1 seed from the SIF into WORK/runs/main.XXXXXX
#
# `build` writes WORK/ci.def: mlhpc.def with only its header (Bootstrap: docker, From:) swapped for
# a Debian bookworm debootstrap, since no Docker registry need be reachable; the body is
# byte-identical. The host's CA bundle is bound in for pip (a site proxy's CA), and the SIF is
# squashed with lz4 (fast to make and to unpack; the tree has no FUSE, so every run unpacks it).
# `main-job` runs the README's main job (1 seed) from the SIF with SLURM_TMPDIR=WORK/scratch set
# outside, as a Slurm job would have it, and checks that mlhpc staged there.
# WORK must be an empty or mlhpc-made folder on a disk with room (the build needs about 10 GB for
# the default CUDA torch); it is left in place for the caller to remove.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TREE_SCRIPT=$REPO/scripts/apptainer_tree.sh
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
NEEDED_GB=10

die() {
    echo "apptainer_image.sh: $*" >&2
    exit 1
}

prepare_work() {
    local work=$1
    mkdir -p "$work/tmp" "$work/scratch" "$work/runs"
    # The tree runs Apptainer as its unprivileged user (uid 4242), which must write here: these
    # folders only, never recursively (WORK may be a folder of the caller's).
    chown 4242:4242 "$work" "$work/tmp" "$work/scratch" "$work/runs"
}

ci_def() {
    # Header lines up to the first %section become a debootstrap header; the rest stays as it is.
    awk -v mirror="$MIRROR" '
        !body && /^%/ { body = 1 }
        body { print; next }
        /^Bootstrap:/ { print "Bootstrap: debootstrap"; next }
        /^From:/ {
            print "OSVersion: bookworm"
            print "MirrorURL: " mirror
            print "Include: python3 python3-venv python3-pip ca-certificates"
            next
        }
        { print }
    ' "$REPO/mlhpc.def"
}

build() {
    local work=${1:?"build WORK [--build-arg KEY=VALUE]..."}
    shift
    local args=()
    while (($#)); do
        [[ $1 == --build-arg && $# -ge 2 && $2 =~ ^[A-Z_]+=[A-Za-z0-9_.:/+-]*$ ]] ||
            die "build WORK [--build-arg KEY=VALUE]...: $1 ${2:-} is not KEY=VALUE"
        args+=(--build-arg "$2")
        shift 2
    done
    mkdir -p "$work"
    local free_gb
    free_gb=$(df -P --block-size=1G "$work" | awk 'NR == 2 { print $4 }')
    ((free_gb >= NEEDED_GB)) || die "$work has ${free_gb} GB free; the build needs about $NEEDED_GB GB"
    prepare_work "$work"
    ci_def >"$work/ci.def"
    cp /etc/ssl/certs/ca-certificates.crt "$work/host-ca.crt"
    chown 4242:4242 "$work/ci.def" "$work/host-ca.crt"
    rm -f "$work/mlhpc.sif"
    local started=$SECONDS
    # The build reads %files from the checkout, so it runs there (bound read-only by ownership).
    (cd "$REPO" && "$TREE_SCRIPT" run "$work" --bind "$REPO" -- \
        env APPTAINER_TMPDIR="$work/tmp" apptainer build --fakeroot \
        --bind "$work/host-ca.crt:/etc/ssl/certs/ca-certificates.crt" \
        --mksquashfs-args "-comp lz4" "${args[@]}" "$work/mlhpc.sif" "$work/ci.def") \
        >"$work/build.log" 2>&1 || die "apptainer build failed; see $work/build.log"
    echo "built $work/mlhpc.sif in $((SECONDS - started)) s ($(du -h "$work/mlhpc.sif" | cut -f1))"
}

main_job() {
    local work=${1:?"main-job WORK"}
    [[ -f $work/mlhpc.sif ]] || die "no $work/mlhpc.sif; build it first: $0 build $work"
    prepare_work "$work"
    # A new --out each time: mlhpc run never overwrites earlier results.
    local out started=$SECONDS
    out=$(mktemp -d "$work/runs/main.XXXXXX")
    chown 4242:4242 "$out"
    "$TREE_SCRIPT" run "$work" -- env SLURM_TMPDIR="$work/scratch" APPTAINER_TMPDIR="$work/tmp" \
        apptainer run "$work/mlhpc.sif" run cosmoflow --config mini --seeds 1 --out "$out" \
        >"$out.log" 2>&1 || die "the main job failed; see $out.log"
    grep -q "staged to $work/scratch" "$out.log" ||
        die "the main job did not stage to SLURM_TMPDIR ($work/scratch); see $out.log"
    echo "main job from the SIF: exit 0 in $((SECONDS - started)) s; results in $out"
}

[[ $(id -u) == 0 ]] || die "run as root (scripts/apptainer_tree.sh needs namespaces)"
case ${1:-} in
build)
    shift
    "$TREE_SCRIPT" make
    build "$@"
    ;;
main-job)
    shift
    main_job "$@"
    ;;
*) die "usage: $0 build WORK [--build-arg KEY=VALUE]... | main-job WORK" ;;
esac
