"""Archive sources: tar, tar.gz and tar.zst extracted while staging, verified, and made safe."""

from __future__ import annotations

import io
import os
import random
import re
import tarfile
import tempfile
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mlhpc.cli import main
from mlhpc.common.errors import MlhpcError, StagingError
from mlhpc.staging import (
    MANIFEST_NAME,
    STAGED_MARKER,
    StageRequest,
    build_manifest,
    stage_dataset,
    verify_staged,
)
from mlhpc.staging.archive import build_archive_manifest, sidecar_manifest
from mlhpc.staging.extract import ArchiveExtractor
from mlhpc.staging.journal import close_journal
from mlhpc.staging.request import CopyOptions
from tests.helpers.cli import mlhpc_cli
from tests.helpers.datasets import dataset_files


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    for i in range(12):
        path = root / ("train" if i % 3 else "validation") / f"s{i:02d}.npy"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(700 * i))
    build_manifest(root).write(root / MANIFEST_NAME)
    return root


def pack(root: Path, archive: Path) -> Path:
    """tar up `root` (manifest included, as `tar -C root .` would), compressed by the suffix."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        tar.add(root, arcname=".")
    data = raw.getvalue()
    if archive.name.endswith(".gz"):
        import gzip

        data = gzip.compress(data)
    elif archive.name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    archive.write_bytes(data)
    return archive


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz", ".tar.zst"])
def test_archive_is_extracted_and_verified(dataset: Path, tmp_path: Path, suffix: str) -> None:
    archive = pack(dataset, tmp_path / f"data{suffix}")
    dest = tmp_path / "dest"
    report = stage_dataset(StageRequest(archive, dest))
    assert report.files == 12 and report.copied_files == 12
    assert report.job_read_bytes <= archive.stat().st_size
    assert dataset_files(dest) == dataset_files(dataset)
    assert verify_staged(dest) == 12


def test_member_that_disagrees_with_the_archive_manifest_is_refused(dataset: Path, tmp_path: Path) -> None:
    (dataset / "train" / "s01.npy").write_bytes(b"changed after the manifest")
    archive = pack(dataset, tmp_path / "data.tar")
    with pytest.raises(
        StagingError, match=r"s01\.npy (fails its xxh3_128 check|has \d+ bytes, its manifest)"
    ):
        stage_dataset(StageRequest(archive, tmp_path / "dest"))
    assert not (tmp_path / "dest" / STAGED_MARKER).exists()


def test_sidecar_manifest_and_resume(dataset: Path, tmp_path: Path) -> None:
    (dataset / MANIFEST_NAME).rename(tmp_path / "manifest.json")
    archive = pack(dataset, tmp_path / "data.tar.zst")
    assert main(["stage", str(archive), "--make-manifest"]) == 0
    assert sidecar_manifest(archive).is_file()
    dest = tmp_path / "dest"
    stage_dataset(StageRequest(archive, dest))
    (dest / STAGED_MARKER).unlink()
    (dest / "train" / "s04.npy").unlink()
    report = stage_dataset(StageRequest(archive, dest))
    assert (report.copied_files, report.skipped_files) == (1, 11)
    assert verify_staged(dest) == 12


def unsafe_archive(path: Path, kind: str) -> Path:
    with tarfile.open(path, "w") as tar:
        good = tarfile.TarInfo("ok/file.bin")
        good.size = 3
        tar.addfile(good, io.BytesIO(b"abc"))
        bad = tarfile.TarInfo(
            {"dotdot": "ok/../../evil.txt", "absolute": "/tmp/mlhpc-evil.txt", "symlink": "ok/link"}.get(
                kind, "ok/hard"
            )
        )
        if kind == "symlink":
            bad.type, bad.linkname = tarfile.SYMTYPE, "../../../etc/passwd"
        elif kind == "hardlink":
            bad.type, bad.linkname = tarfile.LNKTYPE, "/etc/passwd"
        else:
            bad.size = 4
        tar.addfile(bad, io.BytesIO(b"evil") if bad.isfile() else None)
    return path


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("dotdot", "climbs out with '..'"),
        ("absolute", "has an absolute path"),
        ("symlink", "links to '../../../etc/passwd', outside DEST"),
        ("hardlink", "links to '/etc/passwd' has an absolute path"),
    ],
)
def test_archive_path_traversal_is_refused(tmp_path: Path, kind: str, message: str) -> None:
    archive = unsafe_archive(tmp_path / "evil.tar", kind)
    dest = tmp_path / "deep" / "dest"
    with pytest.raises(StagingError, match=rf"evil\.tar: member .* {message}; refused"):
        stage_dataset(StageRequest(archive, dest))
    assert not (dest / STAGED_MARKER).exists()
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "deep" / "evil.txt").exists()
    assert not Path("/tmp/mlhpc-evil.txt").exists()
    assert not (dest / "ok" / "link").exists()


def test_unsafe_archive_is_a_one_line_cli_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    archive = unsafe_archive(tmp_path / "evil.tar", "dotdot")
    assert main(["stage", str(archive), str(tmp_path / "dest")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mlhpc: error: ") and "evil.tar" in err and err.count("\n") == 1


# --- Trust: archives that escape DEST, corrupt archives (issue classes 1 and 2) ---------------------


def make_tar(members: list[tuple[str, str, object]]) -> bytes:
    """A tar of (type, name, payload): file (bytes), dir, sym / hard (link target), fifo."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for kind, name, payload in members:
            info = tarfile.TarInfo(name)
            info.mode = 0o644
            if kind == "file":
                assert isinstance(payload, bytes)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE}.get(
                kind, tarfile.FIFOTYPE
            )
            info.linkname = str(payload) if kind in ("sym", "hard") else ""
            tar.addfile(info)
    return raw.getvalue()


def compress(data: bytes, kind: str) -> bytes:
    if kind == "gz":
        import gzip

        return gzip.compress(data, mtime=0)
    if kind.startswith("zst"):
        return zstandard.ZstdCompressor(write_checksum=kind == "zst").compress(data)
    return data


SUFFIX = {"tar": ".tar", "gz": ".tar.gz", "zst": ".tar.zst", "zst-nocheck": ".tar.zst"}


def snapshot(root: Path, skip: Path) -> dict[str, tuple]:
    """Everything under `root` but `skip`: type, bytes, link target, link count, mode."""
    found: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if Path(dirpath, d) != skip)
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            info = path.lstat()
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path))
            elif path.is_file():
                found[rel] = ("file", path.read_bytes(), info.st_nlink, info.st_mode)
            else:
                found[rel] = ("dir", info.st_mode)
    return found


class Box:
    """base/l0/.../l9/box/{dest, canary/...}: DEST deep enough that no '..' chain reaches above
    `base`, and a canary folder beside it; the archive lies in base/in."""

    def __init__(self, base: Path) -> None:
        self.base = base
        box = base.joinpath(*(f"l{i}" for i in range(10)), "box")
        self.dest = box / "dest"
        self.canary = box / "canary"
        (self.canary / "dir").mkdir(parents=True)
        (self.canary / "file").write_bytes(b"canary")
        (self.canary / "dir" / "deep").write_bytes(b"deep canary")
        (base / "in").mkdir()
        self.before = snapshot(base, self.dest)

    def archive(self, data: bytes, kind: str) -> Path:
        path = self.base / "in" / f"a{SUFFIX[kind]}"
        path.write_bytes(data)
        self.before = snapshot(self.base, self.dest)
        return path

    def unchanged(self) -> bool:
        return snapshot(self.base, self.dest) == self.before

    def links_inside(self) -> bool:
        real = os.path.realpath(self.dest)
        for dirpath, dirnames, filenames in os.walk(self.dest):
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                resolved = os.path.realpath(path)
                if resolved != real and not resolved.startswith(real + os.sep):
                    return False
        return True


def stage_outcome(box: Box, archive: Path) -> StagingError | None:
    """Stage `archive` into the box's DEST; the project's error if it refused (any other
    exception fails the test)."""
    try:
        stage_dataset(StageRequest(archive, box.dest, workers=2))
    except MlhpcError as e:
        assert isinstance(e, StagingError) and "\n" not in str(e)
        assert not (box.dest / STAGED_MARKER).exists()
        return e
    assert (box.dest / STAGED_MARKER).exists()
    return None


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return Box(tmp_path)


@pytest.mark.parametrize(
    ("members", "message"),
    [
        (  # the chain: each link is inside DEST as text, together they climb out
            [("sym", "a/up", ".."), ("sym", "a/up/esc", ".."), ("file", "a/up/esc/pwn", b"evil")],
            "would replace a directory",  # files come first, so a/up is a real folder by then
        ),
        (
            [("sym", "a/up", ".."), ("sym", "a/up/esc", ".."), ("sym", "a/up/esc/pwn", "canary")],
            "member 'a/up/esc' goes through the symlink 'a/up'",
        ),
        (
            [("file", "f", b"x"), ("sym", "a/up", ".."), ("hard", "a/up/hl", "f")],
            "member 'a/up/hl' goes through the symlink 'a/up'",
        ),
        (  # inside when made (b does not exist yet); outside once b -> . is made after it
            [("sym", "x", "b/../canary"), ("sym", "b", ".")],
            "member 'x' links to 'b/../canary', which leads outside DEST through links made after it",
        ),
        ([("sym", "a/out", "../../canary")], "member 'a/out' links to '../../canary', outside DEST"),
        ([("hard", "h", "../canary/file")], "member 'h' links to '../canary/file' climbs out with '..'"),
        ([("fifo", "pipe", None)], "member 'pipe' is a device or FIFO"),
        ([("file", "a/.f.mlhpc-partial", b"x")], "has the name of a staging temporary file"),
    ],
)
def test_archive_links_are_judged_where_they_land(
    box: Box, members: list[tuple[str, str, object]], message: str
) -> None:
    archive = box.archive(make_tar(members), "tar")
    error = stage_outcome(box, archive)
    assert error is not None and message in str(error), error
    assert str(archive) in str(error) and box.unchanged() and box.links_inside()


def test_absolute_link_target_is_refused(box: Box) -> None:
    archive = box.archive(make_tar([("sym", "c", str(box.canary))]), "tar")
    error = stage_outcome(box, archive)
    assert error is not None and f"links to {str(box.canary)!r}, which has an absolute path" in str(error)


def test_symlink_already_in_dest_is_not_written_through(box: Box) -> None:
    """A DEST staged into before, where a symlink has appeared since."""
    assert stage_outcome(box, box.archive(make_tar([("file", "other", b"x")]), "tar")) is None
    os.symlink(box.canary, box.dest / "data")
    archive = box.archive(make_tar([("file", "data/file", b"overwritten")]), "tar")
    error = stage_outcome(box, archive)
    assert error is not None and "member 'data/file' goes through the symlink 'data'" in str(error)
    assert (box.canary / "file").read_bytes() == b"canary"


def test_links_inside_dest_are_made(box: Box) -> None:
    members = [
        ("file", "v2/data.bin", b"payload"),
        ("sym", "latest", "v2"),
        ("sym", "v2/self", "../v2/data.bin"),
        ("hard", "copy.bin", "v2/data.bin"),
    ]
    assert stage_outcome(box, box.archive(make_tar(members), "tar")) is None
    assert (box.dest / "latest" / "data.bin").read_bytes() == b"payload"
    assert os.readlink(box.dest / "v2" / "self") == "../v2/data.bin"
    assert (box.dest / "copy.bin").stat().st_ino == (box.dest / "v2" / "data.bin").stat().st_ino
    assert box.unchanged() and verify_staged(box.dest) == 2


@pytest.mark.parametrize(
    ("members", "x_is_link", "x_bytes"),
    [
        ([("sym", "x", "y"), ("file", "x", b"file wins"), ("file", "y", b"")], False, b"file wins"),
        ([("file", "x", b"first"), ("sym", "x", "y"), ("file", "y", b"target")], True, b"target"),
    ],
)
def test_a_later_member_of_the_same_name_wins(
    box: Box, members: list, x_is_link: bool, x_bytes: bytes
) -> None:
    """Links are made after the files, yet the archive's order decides, as with tar itself."""
    assert stage_outcome(box, box.archive(make_tar(members), "tar")) is None
    assert (box.dest / "x").is_symlink() == x_is_link and (box.dest / "x").read_bytes() == x_bytes
    assert verify_staged(box.dest) == (1 if x_is_link else 2)


def member_files(count: int = 6, size: int = 3000) -> list[tuple[str, str, object]]:
    rng = random.Random(0)
    return [("file", f"d/f{i}.bin", rng.randbytes(size)) for i in range(count)]


def corrupt_message(archive: Path) -> str:
    return rf"^{re.escape(str(archive))}: corrupt or truncated [a-z.]+ archive at byte \d+"


def test_garbled_header_fails_the_whole_archive(box: Box) -> None:
    clean = make_tar(member_files())
    with tarfile.open(fileobj=io.BytesIO(clean)) as tar:
        third = tar.getmembers()[2].offset
    garbled = bytearray(clean)
    garbled[third + 20] ^= 0x01  # in the third member's name: its header fails its checksum
    archive = box.archive(bytes(garbled), "tar")
    error = stage_outcome(box, archive)
    assert error is not None
    assert re.match(corrupt_message(archive), str(error))
    assert f"at byte {third} (bad member header: bad checksum); check or rebuild it" in str(error)
    assert dataset_files(box.dest) == {}  # what came before it is not kept either


@pytest.mark.parametrize("cut", ["member boundary", "inside data", "inside end block"])
def test_truncated_tar_is_refused(box: Box, cut: str) -> None:
    clean = make_tar(member_files())
    with tarfile.open(fileobj=io.BytesIO(clean)) as tar:
        members = tar.getmembers()
        end = tar.offset
    at = {"member boundary": members[3].offset, "inside data": members[3].offset_data + 100}.get(
        cut, end + 100
    )
    error = stage_outcome(box, box.archive(clean[:at], "tar"))
    assert error is not None and re.match(corrupt_message(box.base / "in" / "a.tar"), str(error))


def test_data_after_the_end_block_is_refused(box: Box) -> None:
    error = stage_outcome(box, box.archive(make_tar(member_files()) + b"more", "tar"))
    assert error is not None and "(data after the end-of-archive block)" in str(error)


def flip_that_garbles_a_header(tar_bytes: bytes, frame: bytes) -> int:
    """The first position in a checksum-less zstd frame where one flipped byte still
    decompresses, to a tar whose member headers differ (silent garbage, not a zstd error)."""
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        headers = [m.offset for m in tar.getmembers()]
    for at in range(len(frame) // 3, len(frame)):
        flipped = bytearray(frame)
        flipped[at] ^= 0x20
        try:
            out = zstandard.ZstdDecompressor().decompress(bytes(flipped))
        except zstandard.ZstdError:
            continue
        if len(out) == len(tar_bytes) and any(out[h : h + 512] != tar_bytes[h : h + 512] for h in headers):
            return at
    raise AssertionError("no such position")


def test_flipped_byte_in_zstd_frame_without_checksum_is_refused(box: Box) -> None:
    rng = random.Random(1)
    members = [("file", f"d/f{i}.txt", b"%d " % i * rng.randrange(50, 400)) for i in range(12)]
    clean = make_tar(members)
    frame = compress(clean, "zst-nocheck")
    at = flip_that_garbles_a_header(clean, frame)
    flipped = bytearray(frame)
    flipped[at] ^= 0x20
    archive = box.archive(bytes(flipped), "zst-nocheck")
    error = stage_outcome(box, archive)
    assert error is not None and re.match(corrupt_message(archive), str(error)), error
    assert "of its uncompressed tar stream" in str(error) and dataset_files(box.dest) == {}


@pytest.mark.parametrize(
    ("kind", "data", "reason"),
    [
        ("zst", b"", "the stream ends without an end-of-archive block"),
        ("zst", random.Random(2).randbytes(5000), "not a zstd frame"),
        ("gz", random.Random(2).randbytes(5000), "Not a gzipped file"),
        ("tar", random.Random(2).randbytes(5000), "bad member header"),
        ("tar", b"", "the stream ends without an end-of-archive block"),
    ],
)
def test_not_an_archive_is_one_error(box: Box, kind: str, data: bytes, reason: str) -> None:
    archive = box.archive(data, kind)
    error = stage_outcome(box, archive)
    assert error is not None and re.match(corrupt_message(archive), str(error)) and reason in str(error)


@pytest.mark.parametrize("kind", ["gz", "zst", "zst-nocheck"])
def test_truncated_compressed_archive_is_refused(box: Box, kind: str) -> None:
    data = compress(make_tar(member_files()), kind)
    error = stage_outcome(box, box.archive(data[:-1], kind))
    assert error is not None and "corrupt or truncated" in str(error)


def test_make_manifest_of_a_corrupt_archive_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clean = make_tar(member_files())
    archive = tmp_path / "half.tar.zst"
    archive.write_bytes(compress(clean[: len(clean) // 2], "zst"))
    assert main(["stage", str(archive), "--make-manifest"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mlhpc: error: {archive}: corrupt or truncated tar.zst archive at byte ")
    assert err.count("\n") == 1 and not sidecar_manifest(archive).exists()


def test_corrupt_archive_through_the_real_cli(tmp_path: Path) -> None:
    archive = tmp_path / "random.tar.zst"
    archive.write_bytes(random.Random(3).randbytes(4096))
    result = mlhpc_cli(["stage", str(archive), str(tmp_path / "dest")], tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"mlhpc: error: {archive}: corrupt or truncated tar.zst archive at byte 0 (not a zstd frame); "
        "check or rebuild it\n"
    )
    assert not (tmp_path / "dest" / STAGED_MARKER).exists()


# --- Properties: random trees, random links, random corruption --------------------------------------


def joined(components: list[str]) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(components), min_size=1, max_size=3).map("/".join)


plain = joined(["a", "b", "c", "up", "."])
climbing = joined(["a", "up", "..", ".."])
NAMES = {"plain": plain, "climbing": climbing, "absolute": plain.map(lambda p: "/" + p)}
names = st.sampled_from(["plain"] * 18 + ["climbing", "absolute"]).flatmap(
    NAMES.__getitem__
)  # one spoils all
targets = st.one_of(
    plain,
    plain,
    climbing,
    st.sampled_from(["@CANARY", "@CANARY/file", "/etc/hostname", "..", "../..", "../canary"]),
)
KINDS = ["file"] * 8 + ["dir"] * 2 + ["sym"] * 4 + ["hard"] * 3 + ["fifo"]


def member(kind: str) -> st.SearchStrategy[tuple[str, str, object]]:
    payload = {"file": st.binary(max_size=40), "sym": targets, "hard": targets}.get(kind, st.none())
    return st.tuples(st.just(kind), names, payload)


@st.composite
def chain(draw: st.DrawFn) -> list[tuple[str, str, object]]:
    """Symlinks each under the one before (`a/up -> ..`, `a/up/esc -> ..`, ...), then a member
    under the last: each link is inside DEST as text; together they may climb out."""
    name, links = "a", []
    for _ in range(draw(st.integers(1, 4))):
        name = f"{name}/{draw(st.sampled_from(['up', 'esc', 'a']))}"
        links.append(("sym", name, draw(st.sampled_from(["..", "..", "..", ".", "../..", "a", "../a"]))))
    kind = draw(st.sampled_from(["file", "sym", "sym", "hard"]))
    payload = {"file": b"through the chain", "sym": draw(targets), "hard": draw(targets)}[kind]
    return [*links, (kind, f"{name}/{draw(st.sampled_from(['z', 'canary', 'file']))}", payload)]


pieces = st.one_of(st.sampled_from(KINDS).flatmap(member).map(lambda m: [m]), chain())
trees = st.lists(pieces, max_size=5).map(lambda lists: [m for piece in lists for m in piece])
kinds = st.sampled_from(["tar", "gz", "zst", "zst-nocheck"])
damage = st.one_of(
    st.none(),
    st.none(),
    st.tuples(st.just("flip"), st.floats(0, 1, exclude_max=True), st.integers(1, 255)),
    st.tuples(st.just("flips"), st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)))),
    st.tuples(st.just("cut"), st.floats(0, 1, exclude_max=True)),
)
SETTINGS = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


def resolve(tree: list[tuple[str, str, object]], canary: Path) -> list[tuple[str, str, object]]:
    return [(k, n, str(t).replace("@CANARY", str(canary)) if k in ("sym", "hard") else t) for k, n, t in tree]


def damaged(data: bytes, kind: str, how: tuple | None) -> tuple[bytes, bool]:
    """`data` damaged as `how` says, and whether the damage must be caught: any cut of a
    compressed stream, a cut of a tar before its end block ends, one flipped byte in a tar's
    member header (outside its checksum field), end block or padding. Other damage (a flipped
    byte in a file's bytes, say) cannot be seen without a manifest: it must only stay harmless."""
    if how is None or not data:
        return data, False
    out = bytearray(data)
    if how[0] == "cut":
        at = int(how[1] * len(data))
        if kind != "tar":
            return bytes(out[:at]), True
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.getmembers()
            end = tar.offset
        return bytes(out[:at]), at < end + tarfile.BLOCKSIZE
    flips = [how[1:]] if how[0] == "flip" else how[1]
    for fraction, mask in flips:
        out[int(fraction * len(data))] ^= mask
    if how[0] != "flip" or kind != "tar":
        return bytes(out), False
    at = int(how[1] * len(data))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        headers = {h for m in tar.getmembers() for h in (m.offset, m.offset_data - tarfile.BLOCKSIZE)}
        end = tar.offset
    block, within = divmod(at, tarfile.BLOCKSIZE)
    in_header = block * tarfile.BLOCKSIZE in headers and not 148 <= within < 156
    return bytes(out), in_header or at >= end


@SETTINGS
@given(tree=trees, kind=kinds, how=damage)
def test_property_nothing_outside_dest_changes(tree: list, kind: str, how: tuple | None) -> None:
    """Whatever the archive holds and however it is damaged: nothing outside DEST changes, the
    only error is the project's one-line StagingError, a failed staging leaves no completion
    marker, damage that can be seen is refused, and every link made resolves inside DEST."""
    with tempfile.TemporaryDirectory() as base:
        box = Box(Path(base))
        data, must_fail = damaged(compress(make_tar(resolve(tree, box.canary)), kind), kind, how)
        error = stage_outcome(box, box.archive(data, kind))
        event(f"{'refused' if error else 'staged'}, damage {'must be seen' if must_fail else how and how[0]}")
        assert box.unchanged()
        assert box.links_inside()
        assert error is not None or not must_fail, f"{kind} {how}: damage not seen"


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees, kind=kinds, how=damage)
def test_property_the_extractor_alone_raises_only_staging_errors(
    tree: list, kind: str, how: tuple | None
) -> None:
    """The extractor without stage_dataset around it (which turns an OSError into a line too)."""
    with tempfile.TemporaryDirectory() as base:
        box = Box(Path(base))
        data, must_fail = damaged(compress(make_tar(resolve(tree, box.canary)), kind), kind, how)
        archive = box.archive(data, kind)
        box.dest.mkdir()
        try:
            with open(archive, "rb") as raw:
                extractor = ArchiveExtractor(archive, box.dest, CopyOptions(), None, {}, workers=2)
                extractor.run(raw, kind.split("-")[0])
            failed = False
        except MlhpcError as e:
            assert isinstance(e, StagingError) and "\n" not in str(e)
            failed = True
        finally:
            close_journal(str(box.dest))
        assert box.unchanged() and box.links_inside()
        assert failed or not must_fail, f"{kind} {how}: damage not seen"


@SETTINGS
@given(tree=trees, kind=kinds, how=damage)
def test_property_make_manifest_never_describes_a_damaged_archive(
    tree: list, kind: str, how: tuple | None
) -> None:
    with tempfile.TemporaryDirectory() as base:
        canary = Path(base, "canary")
        data, must_fail = damaged(compress(make_tar(resolve(tree, canary)), kind), kind, how)
        archive = Path(base, f"a{SUFFIX[kind]}")
        archive.write_bytes(data)
        try:
            build_archive_manifest(archive)
        except MlhpcError as e:
            assert isinstance(e, StagingError) and "\n" not in str(e)
        else:
            assert not must_fail, f"{kind} {how}: damage not seen"


safe_names = st.lists(st.sampled_from(["a", "b", "c.bin", "d"]), min_size=1, max_size=3).map("/".join)


@settings(max_examples=60, deadline=None, database=None)
@given(files=st.dictionaries(safe_names, st.binary(max_size=3000), max_size=8), kind=kinds)
def test_property_clean_archives_stage_whole(files: dict[str, bytes], kind: str) -> None:
    """A clean archive of files stages completely, byte for byte (what is refused above is not
    refused for being unusual)."""
    names = sorted(files)
    usable = {n: d for n, d in files.items() if not any(o.startswith(n + "/") for o in names)}
    with tempfile.TemporaryDirectory() as base:
        box = Box(Path(base))
        tar = make_tar([("file", n, d) for n, d in usable.items()])
        assert stage_outcome(box, box.archive(compress(tar, kind), kind)) is None
        assert dataset_files(box.dest) == usable and box.unchanged()
