"""The I/O plan carries the memory facts it was decided on (`iopath`)."""

from __future__ import annotations

from mlhpc.staging.iopath import available_memory, decide

MIB = 1 << 20


def test_the_io_plan_carries_the_memory_it_was_decided_on() -> None:
    assert decide("auto", 600 * MIB, 1000 * MIB, 0.0).available_bytes == 1000 * MIB
    assert decide("buffered", 1, None, 0.0).available_bytes is None


def test_this_machine_has_some_memory_to_report() -> None:
    memory = available_memory()
    assert memory is None or memory > 0
