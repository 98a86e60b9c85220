"""Weak scaling on one machine: `mlhpc run --instances K` started alone launches K local ranks
under torchrun, one model each, then checks the submission they wrote."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from dataclasses import replace

from mlhpc.campaign.io import read_campaign_file
from mlhpc.campaign.options import RunOptions, check_instances
from mlhpc.campaign.plan import CAMPAIGN_FILE
from mlhpc.campaign.status import short_campaign_line
from mlhpc.common.cluster.termination import Terminated
from mlhpc.submission_checker.command import CAMPAIGN_RULESET, check_command


def launch_instances(opts: RunOptions) -> int:
    """Start one local rank per instance under torchrun with these options (`to_argv`, the check
    left out), then check the submission here (a failing check in a rank would read as a crashed
    worker)."""
    check_instances(opts.instances)  # never more local ranks than this machine holds
    # Each rank chooses its threads from the CPUs it may use and the ranks beside it (common/cluster/threads).
    env = dict(os.environ)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    rank_argv = replace(opts, check=False).to_argv()
    command += [f"--nproc_per_node={opts.instances}", "-m", "mlhpc", *rank_argv]
    print(f"launching {opts.instances} local ranks, one per instance: {shlex.join(command)}", flush=True)
    with subprocess.Popen(command, env=env) as launcher:
        try:
            status = launcher.wait()
        except KeyboardInterrupt as stop:
            # Pass the signal on: torchrun stops its ranks on it, where a SIGKILL would orphan them.
            launcher.send_signal(signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)
            try:
                launcher.wait(timeout=60)
            except subprocess.TimeoutExpired:
                launcher.kill()
            raise
    if status != 0 or not opts.check:
        return status
    recorded = read_campaign_file(opts.out / CAMPAIGN_FILE)  # the settings the ranks ran with
    assert recorded is not None, "the instances' rank 0 writes the campaign file"
    ruleset = recorded.settings.ruleset
    return check_command(
        opts.out / recorded.settings.submitter,
        ruleset=ruleset,
        ruleset_reason=CAMPAIGN_RULESET,
        short_campaign=lambda found, required: short_campaign_line(found, required, "weak", opts),
    )
