"""A site folder, put first on PYTHONPATH, that shadows an installed package: how a test gives
mlhpc a broken environment without installing anything."""

from __future__ import annotations

from pathlib import Path


def fake_torchvision(root: Path, version: str, requires: str, body: str) -> Path:
    """root/site holding a torchvision `version` whose metadata requires `requires` and whose
    import runs `body`; returns the site folder."""
    site = root / "site"
    package = site / "torchvision"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(body)
    info = site / f"torchvision-{version}.dist-info"
    info.mkdir()
    metadata = f"Metadata-Version: 2.1\nName: torchvision\nVersion: {version}\nRequires-Dist: {requires}\n"
    (info / "METADATA").write_text(metadata)
    return site
