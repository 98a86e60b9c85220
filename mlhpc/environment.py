"""The environment a run needs, checked before anything is staged, generated or recorded (and by
`mlhpc doctor`): torch and torchvision built for each other (the pin in torchvision's metadata,
the minor-version rule, a real `torchvision::nms` call), the modules each benchmark imports, the
benchmark's own functions, DALI where the config asks for it, and the device asked for. A
problem is one line naming the versions and the fix (EnvironmentProblem, exit 2)."""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any

from mlhpc.common.errors import MlhpcError

NEEDS: dict[str, tuple[str, ...]] = {
    "deepcam": ("torchvision", "torchmetrics"),  # torchmetrics' mean_iou imports torchvision
    "extreme_weather": ("torchvision", "torchmetrics", "pycocotools"),
}
"""The third-party modules a benchmark imports beyond torch, numpy and h5py (its functions may
import them lazily, after staging: checked here first)."""

INSTALL = {"pycocotools": "pip install pycocotools", "torchmetrics": "pip install torchmetrics"}


class EnvironmentProblem(MlhpcError):
    """Something the run needs is missing or broken in this Python environment."""


def _one_line(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())[:300]


def torchvision_for(torch_version: str) -> str | None:
    """The torchvision release series built for `torch_version` (torch 2.N pairs with 0.(N+15)),
    as a pip specifier; None outside the 2.x line the rule is known for."""
    parts = torch_version.split("+")[0].split(".")
    if len(parts) < 2 or parts[0] != "2" or not parts[1].isdigit():
        return None
    return f"0.{int(parts[1]) + 15}.*"


def _pair_fix(torch_version: str) -> str:
    wanted = torchvision_for(torch_version)
    base = torch_version.split("+")[0]
    if wanted is None:
        return "install the torchvision release built for this torch"
    return f"pip install 'torchvision=={wanted}' (the pair of torch {base}), or reinstall torch to match"


def pair_problem(torch_version: str, vision_version: str, vision_requires: list[str]) -> str | None:
    """Why torchvision `vision_version` (whose metadata requires `vision_requires`) is not built
    for torch `torch_version`; None when the metadata and the minor-version rule agree."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

    try:
        torch_release = Version(Version(torch_version).base_version)
    except InvalidVersion:
        return None  # a source build names itself freely; the op call below still tests it
    for text in vision_requires:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        pins = requirement.name == "torch" and requirement.marker is None
        if pins and not requirement.specifier.contains(torch_release, prereleases=True):
            return (
                f"torchvision {vision_version} is built for torch{requirement.specifier}, but torch is "
                f"{torch_version}; {_pair_fix(torch_version)}"
            )
    wanted = torchvision_for(torch_version)
    if wanted is not None and vision_version.split("+")[0].rsplit(".", 1)[0] + ".*" != wanted:
        return (
            f"torchvision {vision_version} is not the release built for torch {torch_version} "
            f"(torchvision {wanted}); {_pair_fix(torch_version)}"
        )
    return None


def check_torchvision() -> str:
    """torchvision importable, built for this torch, its C++ ops callable; its version line."""
    import torch

    try:
        vision_version = importlib.metadata.version("torchvision")
        requires = importlib.metadata.requires("torchvision") or []
    except importlib.metadata.PackageNotFoundError:
        raise EnvironmentProblem(
            f"torchvision is not installed (torch {torch.__version__}); {_pair_fix(torch.__version__)}"
        ) from None
    problem = pair_problem(torch.__version__, vision_version, requires)
    if problem is not None:
        raise EnvironmentProblem(problem)
    try:
        importlib.import_module("torchvision")
        boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
        torch.ops.torchvision.nms(boxes, torch.ones(1), 0.5)
    except Exception as e:  # a mismatched build fails in its import or its first op, anything
        raise EnvironmentProblem(
            f"torchvision {vision_version} does not work with torch {torch.__version__} ({_one_line(e)}); "
            f"{_pair_fix(torch.__version__)}"
        ) from None
    return f"torchvision {vision_version} (built for torch {torch.__version__}: nms runs)"


def check_module(name: str) -> str:
    """`name` importable; its version line."""
    if name == "torchvision":
        return check_torchvision()
    try:
        importlib.import_module(name)
    except Exception as e:  # an import may raise anything (a broken extension, a bad pin)
        fix = INSTALL.get(name, f"pip install {name}")
        raise EnvironmentProblem(f"{name} cannot be imported ({_one_line(e)}); {fix}") from None
    try:
        return f"{name} {importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return name


def check_benchmark(name: str, cfg: Any = None) -> list[str]:
    """What benchmark `name` imports, its functions bound (registry.get: any exception from its
    import is one line) and, where `cfg` asks for data.loader=dali, DALI."""
    from mlhpc.common.contract import registry

    lines = [check_module(module) for module in NEEDS.get(name, ())]
    try:
        registry.get(name)
    except MlhpcError as e:
        raise EnvironmentProblem(str(e)) from None
    except Exception as e:  # registry.get wraps the import; anything else its binding raises
        raise EnvironmentProblem(
            f"benchmark {name} cannot be loaded ({_one_line(e)}); reinstall it"
        ) from None
    lines.append(f"{name}: its functions load")
    loader = getattr(getattr(cfg, "data", None), "loader", None)
    if loader == "dali":
        from mlhpc.common.training.dali import import_dali

        try:
            import_dali()
        except MlhpcError as e:
            raise EnvironmentProblem(str(e)) from None
        lines.append("nvidia-dali imports (data.loader=dali)")
    return lines


def check_device(device: str) -> str:
    """The device asked for: cuda must be there; auto says which it will be."""
    import torch

    cuda = torch.cuda.is_available()
    if device == "cuda" and not cuda:
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise EnvironmentProblem(
            f"--device cuda, but torch {torch.__version__} ({build}) sees no GPU; run on a GPU node "
            "with a CUDA build of torch, or pass --device cpu"
        )
    if device == "cpu" or not cuda:
        return "device: cpu"
    return f"device: cuda ({torch.cuda.get_device_name(0)}, {torch.cuda.device_count()} visible)"


def check_environment(benchmarks: list[str], cfg: Any = None, device: str = "auto") -> list[str]:
    """Every check for `benchmarks` (a run's one, or all for doctor) and `device`; the lines of
    what is fine, or EnvironmentProblem at the first problem."""
    try:
        import torch
    except Exception as e:
        raise EnvironmentProblem(f"torch cannot be imported ({_one_line(e)}); pip install torch") from None
    lines = [f"torch {torch.__version__}"]
    for name in benchmarks:
        lines += check_benchmark(name, cfg)
    if device != "none":
        lines.append(check_device(device))
    return lines
