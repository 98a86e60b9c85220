"""The host allocator of a CPU rank keeps what it frees (common/cluster/allocator.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mlhpc.common.cluster.allocator import allocator_choice, keep_freed_memory, preloaded_allocator
from mlhpc.common.errors import ConfigError
from tests.helpers.cli import cli_env

# Rounds of four 64 MiB tensors made, filled and freed, as a training step does; the page faults
# of the last round (the first rounds still fault while glibc's heap settles around the aligned
# blocks torch asks for).
_FAULTS = """
import json, resource
from mlhpc.common.cluster.allocator import keep_freed_memory
record = keep_freed_memory()
import torch
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [torch.ones(16 * 2**20) for _ in range(4)]
    del blocks
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"record": record, "faults": faults}))
"""
PAGES = 256 * 2**20 // 4096


def _faults(**env: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _FAULTS], capture_output=True, text=True, timeout=120, env=cli_env(**env)
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_freed_memory_is_reused_without_page_faults() -> None:
    kept = _faults()
    assert kept["record"] == "glibc, freed memory kept"
    assert kept["faults"] < PAGES // 20, kept
    system = _faults(MLHPC_ALLOCATOR="system")
    assert system["record"] == "system (MLHPC_ALLOCATOR=system)"
    assert system["faults"] > PAGES // 2, system


def test_a_preloaded_allocator_is_left_alone() -> None:
    assert (
        preloaded_allocator({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"})
        == "libjemalloc.so.2"
    )
    assert (
        preloaded_allocator({"LD_PRELOAD": "libfoo.so:/opt/libtcmalloc_minimal.so.4"})
        == "libtcmalloc_minimal.so.4"
    )
    assert preloaded_allocator({"LD_PRELOAD": "/opt/libfoo.so"}) is None
    assert preloaded_allocator({}) is None
    assert keep_freed_memory({"LD_PRELOAD": "/x/libjemalloc.so"}) == "libjemalloc.so (LD_PRELOAD)"


def test_a_wrong_choice_is_one_line_naming_the_variable() -> None:
    assert allocator_choice({}) == "keep"
    assert allocator_choice({"MLHPC_ALLOCATOR": " system "}) == "system"
    with pytest.raises(ConfigError, match="MLHPC_ALLOCATOR='jemalloc': use keep"):
        allocator_choice({"MLHPC_ALLOCATOR": "jemalloc"})
