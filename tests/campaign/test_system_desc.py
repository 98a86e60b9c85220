"""The systems/<system>.json mlhpc writes passes the official system-description checker
(mlperf_logging.system_desc_checker, run as is): the machine's facts where it tells them, empty
strings where it cannot, and a user's file merged into, never replaced (issue 30)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlperf_logging.system_desc_checker.system_desc_checker import check_system_desc

from mlhpc.common.cluster.distributed import DistContext
from mlhpc.common.errors import SubmissionError
from mlhpc.system_desc import cpu_facts, describe_system, write_system_json

SETTINGS = {"submitter": "mlhpc", "division": "closed", "status": "onprem", "system": "box_cpu_n1"}


def cpu_context() -> DistContext:
    return DistContext(
        rank=0, local_rank=0, world_size=1, local_world_size=1, num_nodes=1,
        device=torch.device("cpu"), backend="gloo", launcher="none",
    )  # fmt: skip


def official(path: Path) -> bool:
    valid, name, _, _ = check_system_desc(str(path), "hpc", "3.0.0")
    return bool(valid) and name == json.loads(path.read_text())["system_name"]


def test_what_mlhpc_writes_passes_the_official_checker(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "systems" / "box_cpu_n1.json"
    write_system_json(path, describe_system(cpu_context(), **SETTINGS))
    with caplog.at_level(logging.INFO):
        assert official(path), caplog.text
    written = json.loads(path.read_text())
    assert all(isinstance(v, str) for v in written.values())  # the checker joins them as CSV
    for known in ("host_processor_model_name", "host_processor_core_count", "host_processor_vcpu_count",
                  "host_memory_capacity", "framework", "operating_system", "other_software_stack"):  # fmt: skip
        assert written[known], known
    assert written["host_processor_vcpu_count"] == str(os.cpu_count())
    assert written["accelerators_per_node"] == "0" and written["accelerator_memory_capacity"] == ""
    assert written["framework"] == f"PyTorch {torch.__version__}"


def test_a_users_file_is_merged_into_and_then_passes(tmp_path: Path) -> None:
    path = tmp_path / "box_cpu_n1.json"
    mine = {
        "system_name": "box_cpu_n1",
        "cooling": "liquid",
        "host_storage_type": "NVMe",
        "my_note": "rack 4",
    }
    path.write_text(json.dumps(mine))
    with pytest.raises(AssertionError):
        assert official(path)  # the hand-written file alone lacks fields
    write_system_json(path, describe_system(cpu_context(), **SETTINGS))
    merged = json.loads(path.read_text())
    assert {k: merged[k] for k in mine} == mine  # every hand-written value kept
    assert official(path)


def test_a_conflicting_users_file_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "box_cpu_n1.json"
    path.write_text(json.dumps({"submitter": "someone_else"}))
    with pytest.raises(SubmissionError, match=r"submitter='someone_else'.*pass --submitter someone_else"):
        write_system_json(path, describe_system(cpu_context(), **SETTINGS))
    assert json.loads(path.read_text()) == {"submitter": "someone_else"}


@pytest.mark.parametrize(
    "text", ["[" * 100_000, '{"cooling": 1e400}', "[1, 2]", "{not json", '{"a": NaN}', b"\xff\xfe"]
)
def test_a_hostile_file_is_one_line_and_left_alone(tmp_path: Path, text: str | bytes) -> None:
    path = tmp_path / "box_cpu_n1.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(SubmissionError, match="fix it or move it away") as caught:
        write_system_json(path, describe_system(cpu_context(), **SETTINGS))
    assert "\n" not in str(caught.value)
    assert path.read_bytes() == (text if isinstance(text, bytes) else text.encode())


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8), lambda inner: st.lists(inner, max_size=3)
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.text(min_size=1, max_size=12), JSON_VALUES, max_size=8))
def test_any_existing_object_keeps_every_field(tmp_path: Path, existing: dict[str, object]) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(existing))
    description = describe_system(cpu_context(), **SETTINGS)
    conflict = any(
        k in existing and existing[k] != description[k] for k in ("submitter", "division", "status")
    )
    conflict |= "system_name" in existing and existing["system_name"] != "box_cpu_n1"
    try:
        write_system_json(path, description)
    except SubmissionError:
        assert conflict
        return
    merged = json.loads(path.read_text())
    assert {k: merged[k] for k in existing} == existing
    assert set(description) <= set(merged)


def test_cpu_facts_from_a_two_socket_machine(tmp_path: Path) -> None:
    cpuinfo = "".join(
        f"processor\t: {i}\nmodel name\t: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz\n"
        f"physical id\t: {i // 40}\ncpu cores\t: 20\n\n"
        for i in range(80)
    )
    for index, (level, kind, size) in enumerate(
        [(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K")]
    ):
        folder = tmp_path / "cpu0" / "cache" / f"index{index}"
        folder.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (folder / name).write_text(f"{value}\n")
    facts = cpu_facts(cpuinfo, tmp_path)
    assert facts["host_processors_per_node"] == "2"
    assert facts["host_processor_core_count"] == "20"
    assert facts["host_processor_frequency"] == "2.40 GHz"
    assert facts["host_processor_caches"] == "L1d 32K, L1i 32K, L2 1024K"
    assert cpu_facts("", tmp_path / "nothing")["host_processor_caches"] == ""  # unknown: empty, not a guess


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_gpu_run_names_its_accelerator(tmp_path: Path) -> None:
    ctx = cpu_context()
    ctx = DistContext(**{**ctx.__dict__, "device": torch.device("cuda", 0)})
    path = tmp_path / "gpu.json"
    write_system_json(path, describe_system(ctx, **SETTINGS))
    written = json.loads(path.read_text())
    assert written["accelerators_per_node"] == "1"
    assert written["accelerator_model_name"] == torch.cuda.get_device_name(0)
    assert written["accelerator_memory_capacity"].endswith("GiB")
    assert "CUDA" in written["other_software_stack"]
    assert official(path)
