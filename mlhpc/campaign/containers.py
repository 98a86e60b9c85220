"""Where a Slurm campaign's jobs run mlhpc: inside the image `--container` names, through the
runtime the site uses (Apptainer/Singularity, pyxis/enroot, podman-hpc, Charliecloud). A
`Container` is the words a job puts between `srun` and `mlhpc`; the host folders the run reads
and writes (--out, --data, the node-local folder) are bound in at the same path, so every path
on the command line means the same inside. Torch-free: the login node writes the job scripts."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from mlhpc.common.errors import ConfigError
from mlhpc.common.printable import shown

RUNTIMES = ("apptainer", "singularity", "pyxis", "podman-hpc", "charliecloud")
LOCAL_DIR = "${MLHPC_LOCAL_DIR}"
"""The node-local folder, bound as the job finds it (its MLHPC_LOCAL_DIR, SLURM_TMPDIR or /tmp)."""

# run_and_time.sh splits LAUNCHER on whitespace, and the job writes it in double quotes: a word
# of it holds none of these. A bind path holds no `,` (the bind lists) and no `:` (src:dest).
_LAUNCHER_SAFE = re.compile(r"[^\s\"'`$\\]+")
_BIND_SAFE = re.compile(r"[^\s\"'`$\\,:]+")


@dataclass(frozen=True)
class Container:
    image: str
    runtime: str
    binds: tuple[str, ...] = ()
    """Host folders bound at the same path; LOCAL_DIR stands for the node-local folder."""

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise ConfigError(
                f"--container-runtime {shown(self.runtime)}: not one of {', '.join(RUNTIMES)}"
            )
        if not _LAUNCHER_SAFE.fullmatch(self.image):
            raise ConfigError(
                f"--container {shown(repr(self.image))}: a job's launcher is split on whitespace and "
                "written in double quotes; name the image without whitespace, quotes, $, ` or \\"
            )
        for path in self.binds:
            if path != LOCAL_DIR and not _BIND_SAFE.fullmatch(path):
                raise ConfigError(
                    f"{shown(repr(path))} is bound into the container, and a bind list cannot hold "
                    "whitespace, quotes, $, `, \\, ',' or ':'; use a folder whose path has none"
                )

    def words(self, *, gpus: bool) -> list[str]:
        """What goes between `srun [options]` and `mlhpc ...` (pyxis: srun options)."""
        binds = list(self.binds)
        if self.runtime in ("apptainer", "singularity"):
            return [self.runtime, "exec", *(["--nv"] if gpus else []), f"--bind={','.join(binds)}", self.image]
        if self.runtime == "pyxis":
            mounts = ",".join(f"{path}:{path}" for path in binds)
            return [f"--container-image={self.image}", f"--container-mounts={mounts}"]
        if self.runtime == "podman-hpc":
            volumes = [f"--volume={path}:{path}" for path in binds]
            # The image's entrypoint is mlhpc itself: env runs the command as given instead.
            gpu = ["--gpu"] if gpus else []
            return ["podman-hpc", "run", "--rm", "--network=host", *gpu, "--env=MLHPC_LOCAL_DIR", *volumes,
                    "--entrypoint=/usr/bin/env", self.image]
        # Charliecloud: --set-env takes the image's own PATH (else `can't execve(2): mlhpc`).
        return ["ch-run", "--set-env", *(f"--bind={path}" for path in binds), self.image, "--"]


def outermost(folders: list[Path]) -> list[str]:
    """`folders` to bind, each once: one inside another is bound with it."""
    kept: list[Path] = []
    for folder in sorted(set(folders)):
        if not any(folder.is_relative_to(k) for k in kept):
            kept.append(folder)
    return [str(k) for k in kept]


def container_for(image: str | None, runtime: str | None, binds: tuple[str, ...]) -> Container | None:
    """The container of --container IMAGE with --container-runtime, or the runtime the image's
    name says (a .sif: Apptainer, else Singularity where only that is on PATH; a .sqsh: pyxis);
    None without --container."""
    if image is None:
        if runtime is not None:
            raise ConfigError("--container-runtime names how to run an image; add --container IMAGE")
        return None
    runtime = runtime or _runtime_of(image)
    if runtime in ("apptainer", "singularity", "charliecloud") and "://" not in image:
        # A file or folder on the login node, which a job reaches from another folder (and node).
        if not Path(image).exists():
            raise ConfigError(f"--container {shown(image)}: no such image here; give the path of the image")
        image = str(Path(image).resolve())
    return Container(image, runtime, binds)


def _runtime_of(image: str) -> str:
    suffix = Path(image).suffix
    if suffix == ".sif":
        return "singularity" if shutil.which("apptainer") is None and shutil.which("singularity") else "apptainer"
    if suffix == ".sqsh" or image.startswith("docker://"):
        return "pyxis"
    raise ConfigError(
        f"--container {shown(image)}: say which runtime runs it, --container-runtime "
        f"{{{','.join(RUNTIMES)}}} (only a .sif or a .sqsh says it by its name)"
    )
