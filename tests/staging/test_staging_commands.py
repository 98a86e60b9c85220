"""`mlhpc stage`, `mlhpc manifest` and `mlhpc verify` on real files and real hashes, and the old
spellings (`mlhpc stage --make-manifest`, `--verify`) that still work and say where they went."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlhpc.cli import build_parser, main
from mlhpc.staging import MANIFEST_NAME
from mlhpc.staging.archive import sidecar_manifest

FILES = {"a.bin": os.urandom(3000), "sub/b.bin": os.urandom(70_000), "sub/deeper/c.bin": b"", "d.txt": b"x"}


def make_source(root: Path) -> Path:
    for name, data in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def listed(manifest: Path) -> dict[str, tuple[int, str]]:
    return {f["path"]: (f["size"], f["checksum"]) for f in json.loads(manifest.read_text())["files"]}


def real_hashes() -> dict[str, tuple[int, str]]:
    return {name: (len(data), xxhash.xxh3_128(data).hexdigest()) for name, data in FILES.items()}


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_three_commands_are_listed() -> None:
    text = build_parser().format_help()
    assert all(f"    {name} " in text for name in ("stage", "manifest", "verify"))
    assert build_parser("verify").parse_args(["verify", "d"]).handler.__name__ == "_verify"


def test_manifest_of_a_folder_lists_every_file_with_its_real_hash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = make_source(tmp_path / "src")
    code, out, err = run(capsys, "manifest", src)
    assert (code, out.strip(), err) == (0, f"wrote {src / MANIFEST_NAME}", "")
    assert listed(src / MANIFEST_NAME) == real_hashes()


def test_manifest_of_an_archive_is_its_sidecar(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = make_source(tmp_path / "src")
    archive = tmp_path / "data.tar"
    with tarfile.open(archive, "w") as tar:
        for name in FILES:
            tar.add(src / name, arcname=name)
    code, out, _ = run(capsys, "manifest", archive)
    assert code == 0 and out.strip() == f"wrote {sidecar_manifest(archive)}"
    assert listed(sidecar_manifest(archive)) == real_hashes()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("data.tar")) == sorted(
        ["data.tar", sidecar_manifest(archive).name]
    )  # nothing else written beside the archive


def test_stage_then_verify_then_a_corrupted_byte_is_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dest = make_source(tmp_path / "src"), tmp_path / "dest"
    assert run(capsys, "manifest", src)[0] == 0
    assert run(capsys, "stage", src, dest)[0] == 0
    code, out, err = run(capsys, "verify", dest)
    assert (code, out.splitlines()[0], err) == (0, f"{dest}: {len(FILES)} files verified", "")
    assert out.splitlines()[1].startswith("checked against source ")
    victim = dest / "sub" / "b.bin"
    data = bytearray(victim.read_bytes())
    data[12345] ^= 0x01  # one bit of one byte: the size stays, the hash does not
    victim.write_bytes(bytes(data))
    code, out, err = run(capsys, "verify", dest)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"mlhpc: error: staged file {victim} is corrupt")


def test_verify_of_a_folder_never_staged_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = make_source(tmp_path / "src")
    code, _, err = run(capsys, "verify", src)
    assert code == 2 and err.count("\n") == 1 and "holds no complete staged dataset" in err


@pytest.mark.parametrize("argv", [["verify", "d", "--workers", "0"], ["manifest", "s", "--workers", "-1"]])
def test_bad_worker_counts_are_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2 and f"mlhpc {argv[0]} --workers {argv[3]}: it must be at least 1" in err


def test_stage_without_dest_names_the_manifest_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "stage", make_source(tmp_path / "src"))
    assert code == 2 and err.count("\n") == 1 and "mlhpc manifest SRC" in err


def test_old_make_manifest_writes_the_same_and_says_where_it_went(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = make_source(tmp_path / "src")
    code, out, err = run(capsys, "stage", "--make-manifest", src)
    assert (code, out.strip()) == (0, f"wrote {src / MANIFEST_NAME}")
    assert err == "mlhpc stage --make-manifest is now mlhpc manifest SRC\n"
    assert listed(src / MANIFEST_NAME) == real_hashes()


@pytest.mark.parametrize("spelling", ["--verify DEST", "SRC DEST --verify"])
def test_old_verify_spellings_verify_and_say_where_they_went(
    spelling: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dest = make_source(tmp_path / "src"), tmp_path / "dest"
    assert run(capsys, "stage", src, dest)[0] == 0
    argv = [{"SRC": str(src), "DEST": str(dest)}.get(word, word) for word in spelling.split()]
    code, out, err = run(capsys, "stage", *argv)
    assert (code, out.splitlines()[0]) == (0, f"{dest}: {len(FILES)} files verified")
    assert err == "mlhpc stage --verify is now mlhpc verify DEST\n"
    (dest / "a.bin").write_bytes(b"y" * 3000)
    code, _, err = run(capsys, "stage", *argv)  # a failure is still the one error line
    assert code == 2 and err.count("\n") == 1 and f"staged file {dest / 'a.bin'} is corrupt" in err


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("verify")
    src, dest = make_source(root / "src"), root / "dest"
    assert main(["stage", str(src), str(dest)]) == 0
    return dest


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.sampled_from([n for n, d in FILES.items() if d]), where=st.floats(0, 1), flip=st.integers(1, 255)
)
def test_any_changed_byte_is_found_and_named(
    staged: Path, capsys: pytest.CaptureFixture[str], name: str, where: float, flip: int
) -> None:
    victim = staged / name
    original = victim.read_bytes()
    changed = bytearray(original)
    changed[min(len(changed) - 1, int(where * len(changed)))] ^= flip
    victim.write_bytes(bytes(changed))
    try:
        code, _, err = run(capsys, "verify", staged)
    finally:
        victim.write_bytes(original)
    assert (
        code == 2
        and err == f"mlhpc: error: staged file {victim} is corrupt (xxh3_128 mismatch); stage again\n"
    )
    assert run(capsys, "verify", staged)[0] == 0
