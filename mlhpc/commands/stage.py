"""`mlhpc stage SRC DEST`: copy a dataset to node-local storage, verified. `mlhpc stage
--make-manifest` and `--verify` still work and say where they went (manifest.py, verify.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from mlhpc.commands import add_command, refuse_bad_counts
from mlhpc.commands.manifest import write_manifest
from mlhpc.commands.verify import verify
from mlhpc.common.errors import ConfigError
from mlhpc.common.vocabulary import IO_CHOICES, STAGING_MODES, STAGING_WORKERS

if TYPE_CHECKING:
    from mlhpc.staging import StageReport


def add_parser(sub: argparse._SubParsersAction, command: str | None) -> None:
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
        choices=STAGING_MODES,
        default="replicate",
        help="replicate: every node gets all, the source is read once (default); shard: each node 1/N; "
        "copy: every node reads all",
    )
    stage.add_argument(
        "--workers", type=int, default=STAGING_WORKERS, help=f"parallel copies per rank ({STAGING_WORKERS})"
    )
    stage.add_argument("--processes", type=int, default=None, help="worker processes per rank (default: none, the copies run as threads here)")
    stage.add_argument("--decompress", action="store_true", help="decompress .gz/.zst files while staging")
    stage.add_argument(
        "--io",
        choices=IO_CHOICES,
        default="auto",
        help="the I/O path: auto and buffered are both the one page-cache path (O_DIRECT and the "
        "kernel copy were removed: measured slower, see docs/STAGING.md)",
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
    stage.add_argument("--verify", action="store_true", help="the old spelling of: mlhpc verify DEST")
    stage.add_argument("--make-manifest", action="store_true", help="the old spelling of: mlhpc manifest SRC")
    stage.set_defaults(handler=_stage)


def _moved(flag: str, new: str, run: Callable[[], int]) -> int:
    """Run an old spelling, then say (one line on stderr) where it went; a failure is still the
    one error line."""
    code = run()
    print(f"mlhpc stage {flag} is now {new}", file=sys.stderr)
    return code


def _stage(args: argparse.Namespace) -> int:
    from mlhpc.staging import StageRequest, make_comm, stage_dataset

    counts = {"--workers": args.workers, "--processes": args.processes, "--chunk-mib": args.chunk_mib}
    refuse_bad_counts("stage", counts)
    if args.make_manifest:
        return _moved("--make-manifest", "mlhpc manifest SRC", lambda: write_manifest(args.src, args.workers))
    if args.verify:  # `mlhpc stage --verify DEST` or `mlhpc stage SRC DEST --verify`
        dest = args.src if args.dest is None else args.dest
        return _moved("--verify", "mlhpc verify DEST", lambda: verify(dest))
    if args.dest is None:
        raise ConfigError(
            "mlhpc stage needs DEST: mlhpc stage SRC DEST (to write SRC's manifest: mlhpc manifest SRC)"
        )
    from mlhpc.common.printable import shown

    if not args.src.exists() and not args.src.is_symlink():
        raise ConfigError(
            f"mlhpc stage: the source {shown(str(args.src))} does not exist; pass as SRC a dataset folder or a "
            ".tar, .tar.gz or .tar.zst archive"
        )
    comm = make_comm(args.comm, each_rank_a_node=args.each_rank_a_node)
    dest = Path(str(args.dest).replace("{node}", str(comm.topology.node)))
    try:
        request = StageRequest(
            args.src,
            dest,
            mode=args.mode,
            workers=args.workers,
            processes=args.processes,
            decompress=args.decompress,
            io="buffered" if args.no_direct_io else args.io,
            durable=args.durable,
            chunk_bytes=args.chunk_mib << 20,
            progress=True,
        )
        report = stage_dataset(request, comm)
    finally:
        comm.close()
    if comm.rank == 0:
        _print_report(args.src, report)
    return 0


def _print_report(src: Path, report: StageReport) -> None:
    """Rank 0's summary: the warnings, what checked the files, and one line of figures."""
    for warning in report.warnings:
        print(f"mlhpc: warning: {warning}", file=sys.stderr)
    if report.checked_by == "identity" and report.skipped_files:
        from mlhpc.staging.request import IDENTITY_PROMISE

        print(f"{src} has no manifest: {IDENTITY_PROMISE}; mlhpc manifest {src} adds checksums")
    rate = report.bytes / max(report.seconds, 1e-9) / 1e6
    print(
        f"staged {report.files} files, {report.bytes} bytes to {report.dest} in {report.seconds:.2f} s "
        f"({rate:.0f} MB/s; mode {report.mode}, {report.num_nodes} node(s)); copied {report.copied_files}, "
        f"skipped {report.skipped_files} already staged; the job read {report.job_read_bytes} source bytes; "
        f"I/O {report.io.label if report.io else '-'}"
    )
