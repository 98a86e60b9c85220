"""`mlhpc stage` under faults, as separate processes: a second writer, signals at random points,
a full disk, read-only or unusable destinations, unreadable sources. Each ends in one line on
stderr and a meaningful exit code, never a traceback or a marker over an incomplete copy."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlhpc.common.safeio.locks import LOCK_NAME
from mlhpc.staging import MANIFEST_NAME, STAGED_MARKER, build_manifest
from tests.helpers.cli import cli_env, stage_command
from tests.helpers.datasets import dataset_files
from tests.helpers.mounts import tmpfs
from tests.helpers.processes import ctrl_c_as_at_a_terminal, lock_held_elsewhere, wait_for

KILL_SEED = 20261124


def run_stage(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        stage_command(*args), capture_output=True, text=True, env=cli_env(), timeout=timeout
    )


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused `mlhpc stage` prints (nothing else on stderr)."""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlhpc: error: "), proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    return lines[0]


def small_files(root: Path, count: int, big: int = 0) -> Path:
    """`count` small files in 8 folders (and `big` 3 MiB ones), with a manifest."""
    rng = random.Random(count)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        path = root / f"d{i % 8}" / f"s{i:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(2048 + i % 512))
    for i in range(big):
        (root / f"big{i}.bin").write_bytes(rng.randbytes(3 << 20))
    build_manifest(root).write(root / MANIFEST_NAME)
    return root


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About a second of staging here: long enough for kill points inside it."""
    return small_files(tmp_path_factory.mktemp("faults") / "src", 3000, big=4)


def lock_taken(dest: Path) -> bool:
    """Whether a `mlhpc stage` into `dest` holds its lock (wrote its holder line)."""
    try:
        return (dest / LOCK_NAME).read_text().endswith("\n")
    except OSError:
        return False


def workers_of(pid: int) -> list[int]:
    """The copy worker processes that `pid` started (they carry its pid on their command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if b"mlhpc.staging.parallel" in argv and str(pid).encode() in argv:
                    found.append(int(entry.name))
    return found


HELD_STAGING = """
import sys, time
from pathlib import Path
from mlhpc import cli
from mlhpc.staging import parallel

release = Path(sys.argv[1])
real = parallel.copy_file

def held(*args, **kwargs):  # every copy waits for the test's word: this writer is slow on demand
    deadline = time.monotonic() + 120
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return real(*args, **kwargs)

parallel.copy_file = held
sys.exit(cli.main(sys.argv[2:]))
"""


def test_a_second_writer_is_refused_at_once_naming_the_holder(tmp_path: Path) -> None:
    src = small_files(tmp_path / "src", 40)
    dest, release = tmp_path / "dest", tmp_path / "release"
    script = tmp_path / "held.py"
    script.write_text(HELD_STAGING)
    first = subprocess.Popen(
        [sys.executable, str(script), str(release), "stage", str(src), str(dest), "--processes", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    try:
        wait_for(lambda: lock_taken(dest) or first.poll() is not None, "the first writer's lock", interval=0.005)
        assert first.poll() is None, first.communicate()
        second = run_stage(src, dest)  # the first holds DEST until told to go on: this must not wait
        line = error_line(second)
        assert f"pid {first.pid} on {socket.gethostname()}" in line and str(dest) in line
        assert "wait for it to finish, or stage to another directory" in line
        verify = run_stage("--verify", dest)  # no lock needed, no crash: nothing is complete yet
        assert "holds no complete staged dataset" in error_line(verify)
        assert first.poll() is None
    finally:
        release.touch()
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert "Traceback" not in err and "staged 40 files" in out
    verify = run_stage("--verify", dest)
    assert verify.returncode == 0 and "40 files verified" in verify.stdout
    assert dataset_files(dest) == dataset_files(src)


@pytest.mark.distributed
def test_every_rank_of_the_node_fails_with_the_holders_line(tmp_path: Path) -> None:
    """Local rank 0 takes the node's lock; rank 1 learns of the refusal through the agreement.
    The two ranks start side by side as srun starts them (torchrun would stop one when the
    other fails, and their lines would interleave on one stderr)."""
    src = small_files(tmp_path / "src", 10)
    dest = tmp_path / "dest"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    with lock_held_elsewhere(dest) as holder:
        ranks = [
            subprocess.Popen(
                stage_command(src, dest),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=cli_env(
                    RANK=str(r),
                    WORLD_SIZE="2",
                    LOCAL_RANK=str(r),
                    LOCAL_WORLD_SIZE="2",
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=port,
                ),
            )
            for r in (0, 1)
        ]
        errors = [rank.communicate(timeout=300)[1] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [2, 2], errors
    assert errors[0] == errors[1], errors
    lines = errors[0].strip().splitlines()
    assert len(lines) == 1, errors  # one line each, no traceback
    assert lines[0].startswith(f"mlhpc: error: rank 0 on {socket.gethostname()}: {dest} is in use by pid {holder} on ")
    assert [p.name for p in dest.iterdir()] == [LOCK_NAME]


KILLS = [
    pytest.param(
        sig, processes, point, id=f"{sig.name}-{'processes' if processes > 1 else 'threads'}-{point}"
    )
    for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)
    for processes in (1, 2)
    for point in range(3)
]
KILL_WINDOWS_S = [(0.0, 0.4), (0.4, 0.9), (0.9, 2.0)]
"""Seconds after DEST's lock is taken: scanning and early copies, late copies, the end (manifest,
marker) or after it; here the whole staging takes about a second."""
EXIT_CODES = {signal.SIGKILL: -signal.SIGKILL, signal.SIGTERM: 143, signal.SIGINT: 130}


@pytest.mark.parametrize(("sig", "processes", "point"), KILLS)
def test_killed_at_a_random_point_then_a_rerun_completes(
    dataset: Path, tmp_path: Path, sig: signal.Signals, processes: int, point: int
) -> None:
    """Killed at a seeded random point once it holds DEST (so its signal handling is in place):
    nothing marked staged unless it finished, no traceback, no worker left; a rerun resumes."""
    delay = random.Random(f"{KILL_SEED}-{sig.name}-{processes}-{point}").uniform(*KILL_WINDOWS_S[point])
    dest = tmp_path / "dest"
    proc = subprocess.Popen(
        stage_command(dataset, dest, "--processes", str(processes)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        start_new_session=True,  # its own process group, as a shell job is
        preexec_fn=ctrl_c_as_at_a_terminal,
    )
    wait_for(lambda: lock_taken(dest) or proc.poll() is not None, "the staging to start", interval=0.005)
    time.sleep(delay)
    with contextlib.suppress(ProcessLookupError):
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # Ctrl-C: the terminal signals the whole foreground group
        else:
            os.kill(proc.pid, sig)  # kill(1), a scheduler's time limit, the OOM killer
    _, err = proc.communicate(timeout=120)
    finished = (dest / STAGED_MARKER).is_file()
    print(f"{sig.name} after {delay:.3f} s: exit {proc.returncode}, marker {finished}")
    # A signal after the command returned (staging done, Python shutting down) kills the process
    # by the default action: it dies of the signal, as any finished program would.
    after_the_end = (-sig,) if finished else ()
    assert proc.returncode in (EXIT_CODES[sig], 0, *after_the_end), err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    if proc.returncode > 0 and sig != signal.SIGKILL:
        assert err.strip().splitlines()[-1] in ("mlhpc: interrupted", "mlhpc: terminated"), err
    wait_for(lambda: not workers_of(proc.pid), "the copy workers to go", 10, interval=0.005)
    if finished:  # a marker is a promise: the copy verifies
        assert run_stage("--verify", dest).returncode == 0
    else:
        assert "holds no complete staged dataset" in error_line(run_stage("--verify", dest))
    rerun = run_stage(dataset, dest, "--processes", str(processes))
    assert rerun.returncode == 0 and "Traceback" not in rerun.stderr, rerun.stderr
    verify = run_stage("--verify", dest)
    assert verify.returncode == 0 and "3004 files verified" in verify.stdout, verify.stderr
    assert not list(dest.rglob("*.mlhpc-partial"))
    assert dataset_files(dest) == dataset_files(dataset)


TERMINATED_BEFORE_THE_MARKER = """
import os, signal, sys
from mlhpc import cli
from mlhpc.staging import destination as finish

write = finish.atomic_write_text

def terminated(path, text):  # SIGTERM at the last step: every file verified, no marker yet
    if path.name != finish.STAGED_MARKER:
        return write(path, text)
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pause()

finish.atomic_write_text = terminated
sys.exit(cli.main(sys.argv[1:]))
"""


def test_terminated_before_the_marker_then_the_rerun_copies_nothing(dataset: Path, tmp_path: Path) -> None:
    """The narrowest kill point: the node's manifest written, the journals gone, the marker not."""
    dest = tmp_path / "dest"
    script = tmp_path / "terminated.py"
    script.write_text(TERMINATED_BEFORE_THE_MARKER)
    proc = subprocess.run(
        [sys.executable, str(script), "stage", str(dataset), str(dest), "--processes", "2"],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=120,
    )
    assert proc.returncode == 143 and proc.stderr.strip() == "mlhpc: terminated", proc.stderr
    assert (dest / MANIFEST_NAME).is_file() and not (dest / STAGED_MARKER).exists()
    rerun = run_stage(dataset, dest)
    assert rerun.returncode == 0 and "copied 0, skipped 3004 already staged" in rerun.stdout
    assert run_stage("--verify", dest).returncode == 0


def test_bad_counts_are_one_line(tmp_path: Path) -> None:
    src = small_files(tmp_path / "src", 3)
    for flags in (["--workers", "0"], ["--processes", "-1"], ["--chunk-mib", "0"], ["--workers", "-4"]):
        line = error_line(run_stage(src, tmp_path / "dest", *flags))
        assert f"{flags[0]} {flags[1]}: it must be at least 1" in line
    assert not (tmp_path / "dest").exists()


def test_a_destination_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    src = small_files(tmp_path / "src", 3)
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    line = error_line(run_stage(src, afile))
    assert f"staging destination {afile} is a file, not a directory; pass a writable" in line
    # MLHPC_LOCAL_DIR=afile, DEST=$MLHPC_LOCAL_DIR/cosmoflow
    line = error_line(run_stage(src, afile / "cosmoflow"))
    assert f"{afile / 'cosmoflow'}: a folder in that path is a file" in line
    assert afile.read_text() == "not a folder"


def test_verify_of_a_file_or_missing_folder_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    for target in (tmp_path / "afile", tmp_path / "missing"):
        assert "holds no complete staged dataset" in error_line(run_stage("--verify", target))


# Root passes permission bits by; without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH it meets them.
AS_A_USER = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]


def run_stage_as_a_user(*args: str | Path) -> subprocess.CompletedProcess[str]:
    if os.geteuid() != 0:
        command = stage_command(*args)
    else:
        probe = subprocess.run([*AS_A_USER, "true"], capture_output=True, text=True)
        if probe.returncode != 0:
            pytest.skip(f"cannot drop root's permission override with setpriv: {probe.stderr.strip()}")
        command = [*AS_A_USER, *stage_command(*args)]
    return subprocess.run(command, capture_output=True, text=True, env=cli_env(), timeout=120)


def test_permission_denied_on_dest_or_source_is_one_line(tmp_path: Path) -> None:
    src = small_files(tmp_path / "src", 3)
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o555)
    closed.chmod(0o555)
    line = error_line(run_stage_as_a_user(src, closed / "dest"))
    assert f"staging destination {closed / 'dest'}: permission denied; make it writable" in line
    line = error_line(run_stage_as_a_user(src, closed))
    assert f"staging destination {closed}" in line and "permission denied" in line
    secret = src / "d1" / "s00001.bin"
    secret.chmod(0o000)
    line = error_line(run_stage_as_a_user(src, tmp_path / "dest"))
    assert f"cannot read staging source file {secret} (Permission denied)" in line
    assert not (tmp_path / "dest" / STAGED_MARKER).exists()
    (src / "d1").chmod(0o000)
    line = error_line(run_stage_as_a_user(src, tmp_path / "dest2"))
    assert "Permission denied" in line and str(src / "d1") in line


def test_a_full_disk_is_one_line_naming_dest_and_the_fix(tmp_path: Path) -> None:
    big = small_files(tmp_path / "big", 0, big=2)  # 6 MiB
    packed = tmp_path / "packed"  # small compressed, 3 MiB each decompressed: the space check passes
    packed.mkdir()
    for i in range(3):
        (packed / f"zeros{i}.npy.gz").write_bytes(gzip.compress(bytes(3 << 20)))
    build_manifest(packed).write(packed / MANIFEST_NAME)
    with tmpfs(tmp_path / "small", "size=2m") as disk:
        dest = disk / "dest"
        line = error_line(run_stage(big, dest))
        assert f"not enough space on {dest}: staging needs" in line and "MLHPC_LOCAL_DIR" in line
        assert not (dest / STAGED_MARKER).exists()
        for processes in ("1", "2"):
            line = error_line(run_stage(packed, dest, "--decompress", "--processes", processes))
            assert f"disk full while writing {dest}/zeros" in line, line
            assert "free space on that disk or set MLHPC_LOCAL_DIR to a larger one, then rerun" in line
            assert not (dest / STAGED_MARKER).exists()
            assert not list(dest.rglob("*.mlhpc-partial"))


def test_a_read_only_destination_is_one_line(tmp_path: Path) -> None:
    src = small_files(tmp_path / "src", 3)
    with tmpfs(tmp_path / "ro", "size=1m", "ro") as disk:
        for dest in (disk / "dest", disk):
            line = error_line(run_stage(src, dest))
            assert f"staging destination {dest} is on a read-only file system; pass a writable" in line


def test_the_marker_and_lock_holder_are_plain_json(dataset: Path, tmp_path: Path) -> None:
    """What a finished staging leaves: the lock file (its last holder) and the marker."""
    dest = tmp_path / "dest"
    assert run_stage(dataset, dest).returncode == 0
    holder = json.loads((dest / LOCK_NAME).read_text())
    assert holder["what"] == f"mlhpc stage {dataset}" and holder["host"] == socket.gethostname()
    assert json.loads((dest / STAGED_MARKER).read_text())["files"] == 3004
