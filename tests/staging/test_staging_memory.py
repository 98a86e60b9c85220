"""The direct path sizes its buffers to the memory the node may use (`parallel.fit_in_memory`)."""

from __future__ import annotations

from mlhpc.staging.iopath import decide
from mlhpc.staging.parallel import fit_in_memory, read_ahead_depth
from mlhpc.staging.sink import BUFFER_BYTES

MIB = 1 << 20


def test_unknown_or_ample_memory_keeps_the_threads_and_reads_in_flight() -> None:
    sizes = [128 * MIB] * 4
    assert fit_in_memory(32, sizes, None) == (32, read_ahead_depth(32, 4))
    assert fit_in_memory(32, sizes, 64 << 30) == (32, 4)


def test_a_small_memory_takes_reads_in_flight_first_then_threads() -> None:
    sizes = [128 * MIB] * 4
    threads, depth = fit_in_memory(32, sizes, 220 * MIB)  # a 256 MiB cgroup, less the interpreter
    assert threads * (depth + 2) * BUFFER_BYTES <= 110 * MIB and threads >= 1
    assert (threads, depth) == (2, 1)
    assert fit_in_memory(32, sizes, 10 * MIB) == (1, 1)  # never none: one thread, one read at a time
    roomy = fit_in_memory(32, sizes, 2048 * MIB)  # room for all four files, fewer reads each
    assert roomy[0] >= 4 and roomy[0] * (roomy[1] + 2) * BUFFER_BYTES <= 1024 * MIB


def test_small_files_hold_one_small_buffer_a_thread() -> None:
    assert fit_in_memory(32, [64 << 10] * 4000, 220 * MIB)[0] == 32
    assert fit_in_memory(32, [8 * MIB] * 100, 100 * MIB)[0] == 6  # 50 MiB over buffers of 8 MiB and a page


def test_the_io_plan_carries_the_memory_it_was_decided_on() -> None:
    assert decide("auto", 600 * MIB, 1000 * MIB, 0.0, True).available_bytes == 1000 * MIB
    assert decide("direct", 1, None, 0.0, True).available_bytes is None
