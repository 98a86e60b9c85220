"""vcluster: a real Slurm cluster of N "hosts" in Linux namespaces on this one machine (root only).

Every node has its own host name (UTS namespace), network stack (a network namespace whose eth0 is
a veth into a bridge that lives in a "switch" namespace of its own) and node-local disk (a mount
namespace where a per-node folder, or a small tmpfs, is /local, and another is /tmp); all of them
see the host's other files, which play the shared file system ($VCLUSTER_ROOT/NAME/shared is a
folder for data every host sees). One munged, one slurmctld (on the "login" host) and one
slurmd per node make it a real Slurm cluster.

Network safety: the host's own network namespace gets no address, route or interface for the
cluster, and every client runs inside the cluster (`exec login -- srun ...`), never on the host.

    scripts/vcluster up [--name mlhpc] [--nodes 4] [--rate 100mbit] [--delay 5ms]
                        [--small-local node03:64M] [--cpus N] [--shared-tmp] [--timeout 30]
    scripts/vcluster exec [--name mlhpc] login|switch|nodeNN -- CMD...
    scripts/vcluster status [--name mlhpc] [--json]
    scripts/vcluster shape [--name mlhpc] nodeNN [--rate R] [--delay D] | --clear
    scripts/vcluster link [--name mlhpc] nodeNN down|up
    scripts/vcluster down [--name mlhpc]
    scripts/vcluster list [--json]

State (configs, logs, munge, each node's /local) lives in $VCLUSTER_ROOT/NAME (default
/run/vcluster/NAME; root alone may change every folder of that path). `down` touches only a
folder it proves its own (its state.json names the folder's device and inode) and ends only the
processes `up` recorded (PID and start time) and those inside their hosts' mount namespaces (job
steps, clients); it never crosses a mount point when it removes the folder.
See docs/MULTINODE.md.
"""
