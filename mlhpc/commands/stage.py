"""`mlhpc stage` and `mlhpc stage-bench`: the staging commands' options and handlers."""

from __future__ import annotations

import argparse
from pathlib import Path

from mlhpc.commands import add_command
from mlhpc.common.errors import ConfigError
from mlhpc.staging.plan import MODES
from mlhpc.staging.stage import DEFAULT_WORKERS


def add_parsers(sub: argparse._SubParsersAction, command: str | None) -> None:
    """Add stage and stage-bench; stage-bench's options only when it is the command (heavy imports)."""
    stage = add_command(
        sub,
        "stage",
        "copy a dataset (directory or tar/tar.gz/tar.zst) to node-local storage, verified",
        "mlhpc stage /lustre/cosmoflow $MLHPC_LOCAL_DIR/cosmoflow\n"
        "srun -N 8 --ntasks-per-node=1 mlhpc stage /lustre/cosmoflow.tar.zst /local/cosmoflow --mode replicate\n"
        "torchrun --nproc_per_node=2 -m mlhpc stage data/ /tmp/node{node} --each-rank-a-node --mode shard",
    )
    stage.add_argument("src", type=Path, help="dataset directory or archive")
    stage.add_argument(
        "dest", type=Path, nargs="?", help="node-local directory; {node} becomes the node index"
    )
    stage.add_argument(
        "--mode",
        choices=MODES,
        default="replicate",
        help="replicate: every node gets all, the source is read once (default); shard: each node 1/N; "
        "copy: every node reads all",
    )
    stage.add_argument(
        "--workers", type=int, default=DEFAULT_WORKERS, help=f"parallel copies per rank ({DEFAULT_WORKERS})"
    )
    stage.add_argument("--processes", type=int, default=None, help="worker processes per rank (default auto)")
    stage.add_argument("--decompress", action="store_true", help="decompress .gz/.zst files while staging")
    stage.add_argument(
        "--io",
        choices=("auto", "buffered", "direct", "kernel"),
        default="auto",
        help="auto: page cache when the node's share fits in memory or the source is cached, else O_DIRECT; "
        "kernel: the page cache, large files copied in the kernel (copy_file_range)",
    )
    stage.add_argument("--no-direct-io", action="store_true", help="the same as --io buffered")
    stage.add_argument(
        "--durable", action="store_true", help="have the copy on disk before the marker (syncfs)"
    )
    stage.add_argument("--chunk-mib", type=int, default=16, help="exchange chunk per node and round")
    stage.add_argument("--comm", choices=("auto", "torch", "mpi"), default="auto", help="collectives backend")
    stage.add_argument(
        "--each-rank-a-node", action="store_true", help="treat every rank as a node (one-machine study)"
    )
    stage.add_argument(
        "--verify", action="store_true", help="only re-hash DEST against its manifest (also: --verify DEST)"
    )
    stage.add_argument(
        "--make-manifest", action="store_true", help="write SRC's manifest (checksums to verify against)"
    )
    stage.set_defaults(handler=_stage)

    bench = add_command(
        sub,
        "stage-bench",
        "measure staging throughput against cp, tar and the raw disk (CSV, PNG, markdown)",
        "mlhpc stage-bench --out runs/stage-bench --total-mib 512 --file-kib 64,1024,65536",
    )
    if command in (None, "stage-bench"):
        from mlhpc.staging.study.bench import add_bench_arguments

        add_bench_arguments(bench)
    bench.set_defaults(handler=_stage_bench)


def _stage(args: argparse.Namespace) -> int:
    from mlhpc.staging import MANIFEST_NAME, build_manifest, make_comm, stage_dataset, verify_staged
    from mlhpc.staging.archive import archive_kind, build_archive_manifest, sidecar_manifest

    counts = {"--workers": args.workers, "--processes": args.processes, "--chunk-mib": args.chunk_mib}
    for flag, value in counts.items():
        if value is not None and value < 1:  # refused before any work, not met deep in a pool
            raise ConfigError(f"mlhpc stage {flag} {value}: it must be at least 1; pass {flag} 1 or more")
    if args.make_manifest:
        if archive_kind(args.src) is not None:
            build_archive_manifest(args.src).write(written := sidecar_manifest(args.src))
        else:
            build_manifest(args.src, workers=args.workers).write(written := args.src / MANIFEST_NAME)
        print(f"wrote {written}")
        return 0
    if args.verify:  # `mlhpc stage --verify DEST` or `mlhpc stage SRC DEST --verify`; no lock needed
        dest = args.src if args.dest is None else args.dest
        count = verify_staged(dest)
        print(f"{dest}: {count} files verified")
        return 0
    if args.dest is None:
        raise ConfigError("mlhpc stage needs DEST (or --make-manifest); see mlhpc stage --help")
    comm = make_comm(args.comm, each_rank_a_node=args.each_rank_a_node)
    dest = Path(str(args.dest).replace("{node}", str(comm.topology.node)))
    try:
        report = stage_dataset(
            args.src,
            dest,
            comm=comm,
            mode=args.mode,
            workers=args.workers,
            processes=args.processes,
            decompress=args.decompress,
            io="buffered" if args.no_direct_io else args.io,
            durable=args.durable,
            chunk_bytes=args.chunk_mib << 20,
            progress=True,
        )
    finally:
        comm.close()
    if comm.rank == 0:
        rate = report.bytes / max(report.seconds, 1e-9) / 1e6
        print(
            f"staged {report.files} files, {report.bytes} bytes to {report.dest} in {report.seconds:.2f} s "
            f"({rate:.0f} MB/s; mode {report.mode}, {report.num_nodes} node(s)); copied {report.copied_files}, "
            f"skipped {report.skipped_files} already staged; the job read {report.job_read_bytes} source bytes; "
            f"I/O {report.io.label if report.io else '-'}"
        )
    return 0


def _stage_bench(args: argparse.Namespace) -> int:
    from mlhpc.staging.study.bench import run_bench

    return run_bench(args)
