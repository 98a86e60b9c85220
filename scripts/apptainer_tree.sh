#!/usr/bin/env bash
# A real Apptainer where the distribution has none (Debian 12): Debian sid's own apptainer package
# in a debootstrapped sid tree, made once per machine and kept; `run` enters that tree with mount
# and PID namespaces of its own and pivot_root (Apptainer refuses "a weak chrooted environment")
# and runs a command there as the unprivileged user `mlhpc` (with /etc/subuid, for --fakeroot: as
# root, a build fails where the VM's capability bounding set lacks CAP_SYS_RESOURCE).
#
#   sudo scripts/apptainer_tree.sh make                  # the tree (about 90 s here; kept)
#   sudo scripts/apptainer_tree.sh run DIR [--bind PATH]... -- CMD ...
#                                    # CMD in the tree; DIR and each PATH bound at their own paths
#   sudo scripts/apptainer_tree.sh path                  # where the kept tree is
#
# The tree lives in $APPTAINER_TREE_CACHE (default /var/cache/mlhpc/apptainer): tree/ with a
# READY file naming the apptainer version, written last. A tree without READY is half made and
# is made again; the script removes only folders it named itself (tree.<pid>.tmp, tree.old).
# Needs root, debootstrap on the host, and Debian's archive (deb.debian.org) reachable.
set -euo pipefail

CACHE=${APPTAINER_TREE_CACHE:-/var/cache/mlhpc/apptainer}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TREE=$CACHE/tree
USER_NAME=mlhpc
USER_ID=4242
PACKAGES=(apptainer debootstrap uidmap ca-certificates squashfs-tools)

die() {
    echo "apptainer_tree.sh: $*" >&2
    exit 1
}

ready() { [[ -f $TREE/READY && ! -L $TREE ]]; }

make_tree() {
    [[ $(id -u) == 0 ]] || die "run as root (debootstrap, namespaces)"
    command -v debootstrap >/dev/null || die "debootstrap is missing; apt-get install -y debootstrap"
    if ready; then
        echo "apptainer tree ready: $TREE ($(cat "$TREE/READY"))"
        return
    fi
    mkdir -p "$CACHE"
    local work="$CACHE/tree.$$.tmp" started=$SECONDS
    rm -rf -- "$work" # this process's own name: nobody else's
    debootstrap --variant=minbase sid "$work" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 ||
        die "debootstrap of Debian sid failed; see $CACHE/debootstrap.log"
    cp /etc/resolv.conf "$work/etc/resolv.conf"
    # Apptainer's build reads /etc/hosts, which a minbase tree lacks.
    printf '127.0.0.1 localhost\n::1 localhost\n' >"$work/etc/hosts"
    # A stored mirror's Release files may be past their Valid-Until: the packages are still Debian's.
    chroot "$work" /bin/sh -c "apt-get -q -o Acquire::Check-Valid-Until=false update >/dev/null &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends ${PACKAGES[*]} >/dev/null" ||
        die "installing ${PACKAGES[*]} into the sid tree failed"
    chroot "$work" /bin/sh -c "useradd -m -u $USER_ID $USER_NAME &&
        echo $USER_NAME:200000:65536 >>/etc/subuid && echo $USER_NAME:200000:65536 >>/etc/subgid"
    chroot "$work" apptainer --version 2>/dev/null | head -1 >"$work/READY"
    if [[ -e $TREE ]]; then
        [[ -d $TREE && ! -L $TREE ]] || die "$TREE is not a folder this script made; move it away"
        rm -rf -- "$CACHE/tree.old"
        mv -- "$TREE" "$CACHE/tree.old" # a half-made tree of ours (no READY)
    fi
    mv -- "$work" "$TREE"
    rm -rf -- "$CACHE/tree.old"
    echo "apptainer tree made in $((SECONDS - started)) s: $TREE ($(cat "$TREE/READY"))"
}

run_in_tree() {
    [[ $(id -u) == 0 ]] || die "run as root (namespaces)"
    ready || die "no apptainer tree at $TREE; make it first: $0 make"
    local dir=${1:?"run DIR [--bind PATH]... -- CMD ..."} binds=() bind
    shift
    [[ -d $dir ]] || die "$dir is not a folder"
    binds+=("$(realpath -- "$dir")")
    while [[ ${1:-} == --bind ]]; do
        bind=${2:?"--bind PATH"}
        [[ -d $bind ]] || die "--bind $bind: not a folder"
        binds+=("$(realpath -- "$bind")")
        shift 2
    done
    [[ ${1:-} == -- ]] && shift
    (($# > 0)) || die "run DIR [--bind PATH]... -- CMD ...: no command"
    local here=${binds[0]}
    for bind in "${binds[@]}"; do
        [[ $PWD == "$bind" || $PWD == "$bind"/* ]] && here=$PWD
    done
    # Its own mount and PID namespaces: the binds and /proc go when the command ends, and the
    # host's mount table never sees them. The network, host name and /etc/hosts stay the
    # caller's, so a node of scripts/vcluster runs it as itself. Folders keep their paths, so a job script's
    # paths mean the same inside; the command starts in the caller's folder where it is bound.
    exec unshare --mount --pid --fork --propagation private /bin/bash -c '
        set -euo pipefail
        tree=$1 user=$2 here=$3 count=$4
        shift 4
        mount --bind "$tree" "$tree"
        mount -t proc proc "$tree/proc"
        mount --rbind /dev "$tree/dev"
        mount --rbind /sys "$tree/sys"
        mount -t tmpfs -o mode=1777 tmpfs "$tree/tmp"
        # The caller'"'"'s names (a cluster'"'"'s /etc/hosts names its nodes), which Apptainer binds
        # into each container from here.
        for file in /etc/hosts /etc/resolv.conf; do
            if [[ -f $file ]]; then mount --bind "$file" "$tree$file"; fi
        done
        for ((i = 0; i < count; i++)); do
            mkdir -p "$tree$1"
            mount --rbind "$1" "$tree$1"
            shift
        done
        mkdir -p "$tree/.oldroot"
        cd "$tree"
        pivot_root . .oldroot
        umount -l /.oldroot
        cd "$here"
        exec runuser -u "$user" -- "$@"
    ' apptainer_tree "$TREE" "$USER_NAME" "$here" "${#binds[@]}" "${binds[@]}" "$@"
}

case ${1:-} in
make) make_tree ;;
run)
    shift
    run_in_tree "$@"
    ;;
path) echo "$TREE" ;;
*) die "usage: $0 make | run DIR -- CMD ... | path" ;;
esac
