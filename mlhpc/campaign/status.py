"""Where a campaign in `--out` stands (`mlhpc status OUT`): each result index as done, running,
queued, failed, interrupted or not started, read from what the campaign wrote (campaign.json,
the result logs, each run's lock in .mlhpc-runs/, slurm/jobs.json) and, for Slurm jobs, from
`squeue`/`sacct` when they are on PATH; and the one command to run next. Torch-free, read-only:
it creates, takes and deletes nothing (a run's lock is tested with a shared lock, never held)."""

from __future__ import annotations

import errno
import fcntl
import os
import shlex
import shutil
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mlhpc.campaign.io import read_campaign_file
from mlhpc.campaign.options import RunOptions
from mlhpc.campaign.plan import CAMPAIGN_FILE, CampaignFile, Entry, dataset_dir
from mlhpc.campaign.seeds import seed_of
from mlhpc.common.errors import SubmissionError
from mlhpc.common.layout import result_file
from mlhpc.common.printable import shown
from mlhpc.common.safeio import safe_json, safe_read
from mlhpc.common.safeio.locks import LOCK_NAME

SLURM_TIMEOUT_S = 20
MAX_JOBS_BYTES = 1 << 20
# squeue's %T and sacct's State, as the few words a person reads.
_QUEUED = {"PENDING", "CONFIGURING", "REQUEUED", "RESV_DEL_HOLD", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED"}
_RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING"}
_FAILED = {
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


@dataclass(frozen=True)
class SeedState:
    """One result index of an entry."""

    index: int
    seed: int
    state: str
    """done, running, queued, failed, interrupted or not started."""
    detail: str = ""


@dataclass(frozen=True)
class EntryStatus:
    key: str
    """`benchmark/scaling`, as campaign.json names it."""
    entry: Entry
    seeds: tuple[SeedState, ...]

    def count(self, state: str) -> int:
        return sum(s.state == state for s in self.seeds)


def campaign_status(out: Path) -> tuple[CampaignFile, list[EntryStatus]]:
    """Every entry of the campaign in `out`; a SubmissionError (one line) when `out` holds none."""
    out = Path(out)
    record = read_campaign_file(out / CAMPAIGN_FILE)
    if record is None:
        raise SubmissionError(
            f"{out} holds no {CAMPAIGN_FILE}; pass the --out folder of `mlhpc run` (nothing was run there yet)"
        )
    jobs = _recorded_jobs(out)
    slurm = _slurm_states([job for job, _ in jobs.values()])
    entries = [
        EntryStatus(key, entry, tuple(_seed_states(out, record, key, entry, jobs, slurm)))
        for key, entry in sorted(record.entries.items())
    ]
    return record, entries


def _seed_states(
    out: Path,
    record: CampaignFile,
    key: str,
    entry: Entry,
    jobs: Mapping[int, tuple[str, int | None]],
    slurm: Mapping[str, str],
) -> list[SeedState]:
    from mlhpc.submission_checker.logparse import parse_log

    benchmark, scaling = key.split("/", 1)
    s = record.settings
    states = []
    for index in range(entry.num_runs):
        seed = seed_of(entry.first_seed, index)
        job = jobs.get(index, (None, None))[0]
        on_slurm = f"Slurm job {job}" if job else ""
        if s.system is not None:
            lock = out / ".mlhpc-runs" / f"{s.submitter}-{s.system}-{scaling}-{benchmark}-{index}" / LOCK_NAME
            if _held(lock):
                states.append(SeedState(index, seed, "running", on_slurm or "its lock is held"))
                continue
            path = result_file(out / s.submitter, s.system, scaling, benchmark, index)  # type: ignore[arg-type]
            if path.is_file() and not path.is_symlink():
                try:
                    log = parse_log(path)
                except OSError as e:
                    states.append(SeedState(index, seed, "failed", f"{path.name}: {e.strerror or e}"))
                    continue
                if log.run_stop_status == "success":
                    states.append(SeedState(index, seed, "done", path.name))
                elif log.run_stop_status is None:
                    states.append(SeedState(index, seed, "interrupted", f"{path.name} has no run_stop"))
                else:
                    status = shown(str(log.run_stop_status)[:40])
                    states.append(SeedState(index, seed, "failed", f"{path.name}: run_stop {status}"))
                continue
        states.append(_from_slurm(index, seed, job, slurm))
    return states


def _from_slurm(index: int, seed: int, job: str | None, slurm: Mapping[str, str]) -> SeedState:
    """A seed without a result or a held lock: what Slurm says of its job, else what the files say."""
    if not job:
        return SeedState(index, seed, "not started")
    state = slurm.get(job)
    if state is None:
        return SeedState(index, seed, "queued", f"Slurm job {job} (squeue/sacct not here to ask)")
    if state in _RUNNING:
        return SeedState(index, seed, "running", f"Slurm job {job}")
    if state in _QUEUED:
        return SeedState(index, seed, "queued", f"Slurm job {job}, {state.lower()}")
    if state in _FAILED:
        return SeedState(index, seed, "failed", f"Slurm job {job} {state.lower()}, no result")
    return SeedState(index, seed, "interrupted", f"Slurm job {job} {state.lower()}, no result")


def _held(lock: Path) -> bool:
    """Whether a process holds the run lock at `lock` (a shared lock taken and dropped at once:
    nothing is created, and a lock nobody holds stays free)."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError as e:
        return e.errno in (errno.EACCES, errno.EAGAIN)
    finally:
        os.close(fd)


def _recorded_jobs(out: Path) -> dict[int, tuple[str, int | None]]:
    """{result index: (Slurm job id, seed)} from <out>/slurm/jobs.json, which `mlhpc run --slurm`
    wrote; ids that are not plain numbers are dropped (they are passed to squeue)."""
    path = out / "slurm" / "jobs.json"
    if not path.exists() or safe_read.judge(path, path.parent, MAX_JOBS_BYTES, what="jobs.json") is not None:
        return {}
    try:
        data = safe_json.load_file(path, dict, max_bytes=MAX_JOBS_BYTES)
    except (safe_json.BadJson, OSError):
        return {}
    found: dict[int, tuple[str, int | None]] = {}
    seeds = data.get("seeds")
    for index, job in seeds.items() if isinstance(seeds, dict) else ():
        if not (isinstance(index, str) and index.isdigit() and isinstance(job, dict)):
            continue
        job_id, seed = job.get("job"), job.get("seed")
        if isinstance(job_id, str) and job_id.isdigit() and len(job_id) <= 20:
            found[int(index)] = (job_id, seed if type(seed) is int else None)
    return found


def _slurm_states(ids: list[str]) -> dict[str, str]:
    """{job id: state} as squeue (jobs in the queue) then sacct (jobs that ended) report them;
    {} where neither is on PATH or answers."""
    if not ids:
        return {}
    states = _ask(["squeue", "-h", "-o", "%i %T", "-j", ",".join(ids)])
    rest = [job for job in ids if job not in states]
    if rest:
        ended = _ask(["sacct", "-n", "-X", "-P", "--format=JobID,State", "-j", ",".join(rest)], sep="|")
        states.update({job: state for job, state in ended.items() if job not in states})
    return {job: state for job, state in states.items() if job in ids}


def _ask(command: list[str], sep: str | None = None) -> dict[str, str]:
    program = shutil.which(command[0])
    if program is None:
        return {}
    try:
        proc = subprocess.run(
            [program, *command[1:]], capture_output=True, text=True, timeout=SLURM_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if proc.returncode != 0:
        return {}
    states = {}
    for line in proc.stdout.splitlines():
        parts = line.strip().split(sep, 1)
        if len(parts) == 2 and parts[0].isdigit() and parts[1].strip():
            states[parts[0]] = parts[1].split()[0].upper()  # sacct: "CANCELLED by 1000"
    return states


def next_command(out: Path, record: CampaignFile, entries: list[EntryStatus], program: str = "mlhpc") -> str:
    """The one line saying what to do next: wait, resume, or check the submission."""
    waiting = sum(e.count("running") + e.count("queued") for e in entries)
    if waiting:
        return f"next: wait for the {waiting} running or queued seed(s), then: {program} status {shlex.quote(str(out))}"
    for e in entries:
        if e.count("done") < len(e.seeds):
            benchmark, scaling = e.key.split("/", 1)
            words = [program, "run", benchmark, "--config", e.entry.config]
            words += ["--instances" if scaling == "weak" else "--seeds", str(e.entry.num_runs)]
            words += ["--out", str(out)]
            if not dataset_dir(out, benchmark, e.entry.config).is_dir():
                words += ["--data", "DATA"]  # given by hand before: the campaign does not record it
            words.append("--resume")
            return f"next: rerun what is not done (finished seeds are kept): {shlex.join(words)}"
    return f"next: all done; check the submission: {program} check {shlex.quote(str(out / record.settings.submitter))}"


def short_campaign_line(found: int, required: int, scaling: str = "strong", opts: RunOptions | None = None) -> str:
    """What a campaign of fewer runs than a score needs is: finished and checked, not yet an
    entry; and the command that makes it one (the recorded first seed and results are kept).
    Without `opts` (the check job of a Slurm campaign knows the submission, not the command) it
    names the flags to add."""
    weak = scaling == "weak"
    head = f"{found} of {required} {'models' if weak else 'runs'}: not yet a scoreable entry"
    if opts is None:
        return f"{head}; add {required - found} more with the campaign's command, --seeds {required} --resume"
    words = ["mlhpc", "run", opts.benchmark, "--config", opts.config, "--out", str(opts.out)]
    words += ["--instances" if weak else "--seeds", str(required), *opts.overrides]
    if weak:  # weak scaling is timed as one job: more models are a new campaign
        return f"{head}; train all {required} at once with `{shlex.join(words)}` into a new --out"
    return f"{head}; run {required - found} more with `{shlex.join([*words, '--resume'])}`"
