"""What a resumed campaign keeps: the finished runs already in its results folder and the seeds
they fix. Torch-free, so `mlhpc run --slurm` can plan on a login node."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from mlhpc.common.errors import SubmissionError
from mlhpc.common.safeio import safe_read


def finished_runs(paths: Iterable[Path]) -> dict[int, int]:
    """{result index: seed} of the result_<i>.txt logs that reached run_stop with status success.

    A result slot that cannot be read (not a regular file, too big, a link loop or out of its
    folder) is a SubmissionError: rerunning over it would lose whatever it is.
    """
    from mlhpc.submission_checker.compliance import MAX_RESULT_BYTES
    from mlhpc.submission_checker.logparse import parse_log

    finished: dict[int, int] = {}
    for path in paths:
        path = Path(path)
        index = path.stem.rsplit("_", 1)[-1]
        if not index.isdigit():
            continue
        problem = safe_read.judge(path, path.parent, MAX_RESULT_BYTES, what="a result log")
        if problem is not None:
            raise SubmissionError(f"{problem.line(path)}, then resume ({_NOT_RUN_OVER})")
        try:
            log = parse_log(path)
        except OSError as e:
            message = (
                f"{path}: cannot read it: {e.strerror or e}; make it readable or move it away, then resume"
            )
            raise SubmissionError(f"{message} ({_NOT_RUN_OVER})") from None
        if log.run_stop_status != "success" or not log.seeds:
            continue
        seed = _whole_number(log.seeds[0][0])
        if seed is None:
            raise SubmissionError(
                f"{path} finished with seed {log.seeds[0][0][:40]}, not a whole number; fix its seed "
                f"line or move it away, then resume"
            )
        finished[int(index)] = seed
    return finished


_NOT_RUN_OVER = "a result that cannot be read is not rerun over"


def _whole_number(text: str) -> int | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
