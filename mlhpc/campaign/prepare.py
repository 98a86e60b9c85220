"""One preparation of `mlhpc run` for every route: the local runner (and each torchrun rank),
weak scaling, the dry run and the Slurm submitter all start from the same `Prepared`, made once
per process, without torch: the options checked, the config loaded and validated, the node-local
folder found, and the size check of a dataset the run would generate."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlhpc.campaign.io import ResolvedConfig, resolve_config
from mlhpc.campaign.options import RunOptions, check_options
from mlhpc.campaign.plan import dataset_dir
from mlhpc.generation import SizeCheck, run_size_check
from mlhpc.staging.localdir import resolve_local_dir


@dataclass(frozen=True)
class Prepared:
    """What `mlhpc run` works from once its options are checked."""

    opts: RunOptions
    resolved: ResolvedConfig
    """The config as the run trains it (overrides applied, validated)."""
    local_root: Path
    """The node-local staging folder: --local-dir, else MLHPC_LOCAL_DIR, the scheduler's, /tmp."""
    size: SizeCheck | None
    """What a run without --data checks before generating its dataset; None with --data."""

    @property
    def benchmark(self) -> str:
        """The catalog's name of the benchmark (as the config resolved it)."""
        return str(self.resolved.info.name)

    @property
    def generated_dir(self) -> Path | None:
        """Where a run without --data generates its dataset; None with --data."""
        if self.opts.data is not None:
            return None
        return dataset_dir(self.opts.out, self.benchmark, self.opts.config)


def prepare(opts: RunOptions) -> Prepared:
    """Check `opts` (check_options), then resolve what every route needs from them, once."""
    check_options(opts)
    resolved = resolve_config(opts.benchmark, opts.config, opts.overrides)
    size = None
    if opts.data is None:
        size = run_size_check(resolved.info.name, resolved.cfg, opts.config, opts.allow_size)
    return Prepared(opts, resolved, resolve_local_dir(opts.local_dir), size)
