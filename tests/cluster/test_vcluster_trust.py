"""scripts/vcluster deletes and kills only what it made (issue 39): a folder is removed only when
proven a cluster's state folder (its state.json names the folder's device and inode; no link along
VCLUSTER_ROOT), removal never crosses a mount, only recorded processes and those inside their
hosts are signalled, two clusters never touch each other's processes or /local, sizes and names
are bounded, and names from outside print as data. Most attacks need no running Slurm: a killed
`up` leaves a half-made cluster (files only, or its hosts' namespaces) to attack."""

from __future__ import annotations

import contextlib
import json
import os
import string
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scripts.vclusterlib import base, cli, state, up  # the tool's modules, for their pure checks
from scripts.vclusterlib.client import VCLUSTER
from tests.helpers.vcluster_fixture import vcluster_missing

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(vcluster_missing() is not None, reason=vcluster_missing() or ""),
]


def vc(root: Path | str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VCLUSTER_ROOT": str(root)}
    return subprocess.run(
        [str(VCLUSTER), *args], capture_output=True, text=True, timeout=90, env=env, check=False
    )


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The tool's one error line (exit 1, nothing else on stderr)."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, (proc.returncode, proc.stderr)
    return lines[0]


def half_made(root: Path, name: str, phase: str) -> dict[str, Any]:
    """`up --nodes 2` killed (SIGKILL, no clean-up) where it hangs at `phase`: "files" leaves the
    state folder only, "holders" also the hosts' namespaces, each held by a running process."""
    root.mkdir(mode=0o755, exist_ok=True)
    env = {**os.environ, "VCLUSTER_ROOT": str(root), "VCLUSTER_HANG_AT": phase}
    up = subprocess.Popen(
        [str(VCLUSTER), "up", "--name", name, "--nodes", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert up.stderr is not None
        line = up.stderr.readline()
        assert f"hanging at {phase}" in line, line + up.stderr.read()
    finally:
        up.kill()
        up.wait()
    return json.loads((root / name / "state.json").read_text())


def start_time(pid: int) -> int | None:
    """The start time of a live process (None: gone, or a zombie no one reaped yet)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


def running(state: dict[str, Any]) -> dict[str, bool]:
    """Each recorded process of a cluster: still the one recorded (PID and start time)?"""
    return {key: start_time(pid) == state["starts"][key] for key, pid in state["pids"].items()}


def wait_inside(pid: int, host: int) -> None:
    """Until process `pid` (a `vcluster exec`) runs inside host process `host`'s mount namespace."""
    deadline = time.monotonic() + 20
    while os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink(f"/proc/{host}/ns/mnt"):
        assert time.monotonic() < deadline, f"process {pid} never entered the host of {host}"
        time.sleep(0.05)


def local_mounted_somewhere() -> bool:
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and " /local " in (proc / "mountinfo").read_text():
                return True
    return False


@contextlib.contextmanager
def cleared(*clusters: tuple[Path, str]) -> Iterator[None]:
    """Whatever a test leaves of these clusters is taken down at its end."""
    try:
        yield
    finally:
        for root, name in clusters:
            for point in sorted(
                line.split()[4]
                for line in Path("/proc/self/mountinfo").read_text().splitlines()
                if line.split()[4].startswith(f"{root}/")
            )[::-1]:
                subprocess.run(["umount", "-l", point], check=False)
            vc(root, "down", "--name", name)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    made = tmp_path / "root"
    made.mkdir(mode=0o755)
    return made


# --- a folder vcluster did not make is never removed -------------------------------------------


def plant(root: Path, name: str, how: str, real: Path) -> Path:
    """A folder named like a cluster's that is not one, made `how`; a file in it must survive."""
    folder = root / name
    if how == "a link to a real state folder":
        folder.symlink_to(real)
        return real / "slurm.conf"
    folder.mkdir()
    (folder / "precious").write_text("mine\n")
    if how == "state.json a link to a real one":
        (folder / "state.json").symlink_to(real / "state.json")
    elif how == "a copied state.json, fixed up":  # right tool, name and path; another folder's inode
        state = json.loads((real / "state.json").read_text())
        state.update(name=name, state_dir=str(folder))
        (folder / "state.json").write_text(json.dumps(state))
    elif how == "state.json a FIFO":
        os.mkfifo(folder / "state.json")
    return folder / "precious"


@pytest.mark.parametrize(
    "how",
    [
        "no state.json",
        "state.json a link to a real one",
        "a copied state.json, fixed up",
        "state.json a FIFO",
        "a link to a real state folder",
    ],
)
def test_a_folder_not_proven_a_clusters_is_left_whole(root: Path, how: str) -> None:
    with cleared((root, "real")):
        real = root / "real"
        half_made(root, "real", "files")
        kept = plant(root, "planted", how, real)
        before = kept.read_bytes()
        for command in (["down"], ["up", "--nodes", "1"], ["status"], ["shape", "node01", "--clear"]):
            line = one_line(vc(root, *command, "--name", "planted"))
            assert "is not a state folder of vcluster" in line and "leaves it alone" in line, line
            assert "up --name" not in line and "down --name" not in line  # suggests nothing that deletes
            assert kept.read_bytes() == before
        assert (real / "state.json").is_file()  # the real cluster's folder was not touched either
        listed = vc(root, "list", "--json")
        assert {c["name"]: c["phase"] for c in json.loads(listed.stdout)}[
            "planted"
        ] == "not vcluster's (left alone)"
    assert not real.exists()  # the control: the proven one is removed by the same `down`


def test_a_missing_cluster_suggests_only_an_up_with_nothing_to_delete(root: Path) -> None:
    line = one_line(vc(root, "status", "--name", "absent"))
    assert "does not exist" in line and "up --name absent" in line


@pytest.mark.parametrize(
    "attack", ["link in tmp", "link above", "not root's", "others may write", "odd path"]
)
def test_a_root_someone_else_could_redirect_is_refused(tmp_path: Path, attack: str) -> None:
    target = tmp_path / "target"
    target.mkdir(mode=0o755)
    (target / "x").mkdir()
    (target / "x" / "precious").write_text("mine\n")
    link = Path("/tmp") / f"vc-trust-{os.getpid()}-{attack.replace(' ', '-')}"
    given_root = {
        "link in tmp": str(link),
        "link above": f"{link}/target",
        "not root's": str(target),
        "others may write": str(target),
        "odd path": f"{target}/../target",
    }[attack]
    link.symlink_to(target if attack == "link in tmp" else tmp_path)
    if attack == "not root's":
        os.chown(target, 65534, 65534)
    if attack == "others may write":
        os.chmod(target, 0o777)
    try:
        for command in (["down", "--name", "x"], ["list"], ["status", "--name", "x"]):
            line = one_line(vc(given_root, *command))
            assert line.startswith("vcluster: VCLUSTER_ROOT="), line
        assert (target / "x" / "precious").read_text() == "mine\n"
    finally:
        link.unlink()
    os.chmod(target, 0o755)
    os.chown(target, 0, 0)
    assert vc(target, "down", "--name", "x").returncode == 1  # the control: a sound root, an unproven x


# --- removal never crosses a mount; processes: only the recorded and their hosts' -------------


def test_down_leaves_a_mount_inside_shared_and_what_it_holds(root: Path, tmp_path: Path) -> None:
    dataset = tmp_path / "dataset"
    (dataset / "deep").mkdir(parents=True)
    (dataset / "deep" / "sample.h5").write_bytes(b"data" * 100)
    with cleared((root, "c")):
        state = half_made(root, "c", "files")
        inside = Path(state["shared"]) / "ds"
        inside.mkdir()
        subprocess.run(["mount", "--bind", str(dataset), str(inside)], check=True)
        (Path(state["shared"]) / "made-by-a-job").write_text("x")
        line = one_line(vc(root, "down", "--name", "c"))
        assert f"left {inside}:" in line and "unmount it" in line, line
        assert (dataset / "deep" / "sample.h5").read_bytes() == b"data" * 100
        assert not (Path(state["shared"]) / "made-by-a-job").exists()  # the rest is removed
        assert (root / "c" / "state.json").exists()  # still provably vcluster's for the next down
        subprocess.run(["umount", str(inside)], check=True)
        down = vc(root, "down", "--name", "c")
        assert down.returncode == 0, down.stderr
        assert not (root / "c").exists()
    assert (dataset / "deep" / "sample.h5").exists()


def test_two_clusters_of_one_name_under_two_roots_never_touch_each_other(tmp_path: Path) -> None:
    """B's root holds A's whole path (/…/b/<A's path>): a command line naming A's state folder as
    a substring, and a mount suffix, are no proof. A's `down` ends A's hosts, a client inside A,
    never B's hosts nor a decoy naming A's folder, and keeps the host's /local B's nodes mount."""
    a = tmp_path / "a"
    b = tmp_path / "b" / str(a).lstrip("/")
    b.parent.mkdir(parents=True)
    local_before = Path("/local").exists()
    with cleared((a, "same"), (b, "same")):
        state_a, state_b = half_made(a, "same", "holders"), half_made(b, "same", "holders")
        assert all(running(state_a).values()) and all(running(state_b).values())
        clients = {
            r: subprocess.Popen(
                [str(VCLUSTER), "exec", "--name", "same", "node01", "--", "sleep", "300"],
                env={**os.environ, "VCLUSTER_ROOT": str(r)},
            )
            for r in (a, b)
        }
        decoy = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(300)", f"{a}/same/slurm.conf"]
        )
        try:
            for r, state in ((a, state_a), (b, state_b)):
                wait_inside(clients[r].pid, state["pids"]["node01"])
            down = vc(a, "down", "--name", "same")
            assert down.returncode == 0, down.stderr
            assert not any(running(state_a).values()) and not (a / "same").exists()
            assert clients[a].wait(timeout=10) != 0  # a client inside A's node ended with it
            assert all(running(state_b).values()), running(state_b)
            assert clients[b].poll() is None and decoy.poll() is None
            node = state_b["pids"]["node01"]
            assert " /local " in Path(f"/proc/{node}/mountinfo").read_text()
            assert Path("/local").is_dir()
            assert Path(f"/proc/{node}/root/local").is_dir()
            assert vc(b, "down", "--name", "same").returncode == 0
            assert clients[b].wait(timeout=10) != 0 and not any(running(state_b).values())
        finally:
            for proc in (*clients.values(), decoy):
                proc.kill()
                proc.wait()
    if not local_before:  # gone with the last cluster, unless another (another session's) mounts it
        assert not Path("/local").exists() or local_mounted_somewhere()


# --- sizes, names, and names printed as data ------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "node01:0",
        "node01:0M",
        "node01:1023K",
        "node01:999999999G",
        "node01:8M\n",
        "node01:-1M",
        "node01:1T",
        "node9:8M",
    ],
)
def test_small_local_refuses_no_limit_and_more_than_the_memory(root: Path, value: str) -> None:
    line = one_line(vc(root, "up", "--name", "s", "--nodes", "2", "--small-local", value))
    assert "--small-local" in line and "\n" not in line.strip()
    assert not (root / "s").exists()


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(
        st.tuples(st.sampled_from(["node01", "node02", "node03"]), st.text(max_size=12)), max_size=3
    )
)
def test_small_local_sizes_accepted_are_bounded(sizes: list[tuple[str, str]]) -> None:
    values = [f"{node}:{size}" for node, size in sizes]
    try:
        got = up.parse_small_local(values, ["node01", "node02", "node03"])
    except base.VclusterError:
        return
    assert all(v >= 1 << 20 for v in got.values())
    assert sum(got.values()) <= up.memory_bytes() // 2
    for _, size in sizes:  # the syntax, written out apart from the tool's pattern: ASCII digits, one unit
        body = size[:-1] if size[-1:] and size[-1] in "KkMmGg" else size
        assert body and set(body) <= set(string.digits), repr(size)


def acceptable(name: str) -> bool:
    """The rule, written out apart from the tool's pattern: a-z, then a-z 0-9 _, 1 to 24 characters."""
    head, tail = string.ascii_lowercase, string.ascii_lowercase + string.digits + "_"
    return 1 <= len(name) <= 24 and name[0] in head and all(c in tail for c in name)


NAMES = st.one_of(
    st.text(max_size=30),
    st.from_regex(r"[a-z][a-z0-9_]{0,23}", fullmatch=True).flatmap(
        lambda n: st.sampled_from([n, f"{n}\n", f"{n}/../x", f"../{n}", f"{n}\x1b[2J", f"{n}é", f"{n} "])
    ),
)


@settings(max_examples=300, deadline=None)
@given(name=NAMES)
def test_only_plain_names_reach_the_state_folder(tmp_path_factory: pytest.TempPathFactory, name: str) -> None:
    root = tmp_path_factory.getbasetemp() / "names-root"
    root.mkdir(mode=0o755, exist_ok=True)
    state.ROOT = root
    try:
        cli.main(["down", "--name", name])
        accepted = True
    except base.VclusterError as e:
        accepted = False
        assert "--name" in str(e)
    except SystemExit:  # argparse: a name that looks like an option
        accepted = False
    assert accepted == acceptable(name), repr(name)
    assert list(root.iterdir()) == []


def test_a_trailing_newline_in_a_name_is_refused_in_one_line(root: Path) -> None:
    line = one_line(vc(root, "down", "--name", "mlhpc\n"))
    assert "--name 'mlhpc\\n'" in line


def test_every_pattern_in_the_tool_is_used_whole() -> None:
    """`re.match` with `$` lets "x\\n" through; the tool uses fullmatch and no `$` anchor."""
    source = "\n".join(
        p.read_text() for p in [VCLUSTER, *sorted((VCLUSTER.parent / "vclusterlib").glob("*.py"))]
    )
    assert ".match(" not in source and "re.search(" not in source
    assert not [
        line for line in source.splitlines() if "re.compile(" in line and ('$"' in line or "^" in line)
    ]
    assert base.NAME_RE.fullmatch("mlhpc\n") is None and base.NAME_RE.fullmatch("mlhpc")  # control


def test_names_from_outside_print_as_data(root: Path) -> None:
    with cleared((root, "c")):
        half_made(root, "c", "files")
        evil = "\x1b[2J\x1b]0;owned\x07node01"
        for argv in (
            ["exec", "--name", "c", evil, "--", "true"],
            ["link", "--name", "c", "node01", evil],
            ["shape", "--name", "c", evil, "--clear"],
            ["down", "--name", evil],
        ):
            proc = vc(root, *argv)
            assert proc.returncode in (1, 2) and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
            assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr, repr(proc.stderr)
            assert "\\x1b[2J" in proc.stderr, proc.stderr
        assert base.shown("plain node01") == "plain node01"  # control: plain text is unchanged


def test_shutil_is_not_how_the_tool_removes() -> None:
    assert "rmtree" not in VCLUSTER.read_text()  # it crosses mount points; the tool's own walk does not
