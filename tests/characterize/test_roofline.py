"""The roofline level: measured peaks that make sense against each other, and placement arithmetic
checked on hand-made inputs. A real profile's points are not held under the roof: on a CPU a small
operator runs from cache, above the DRAM roof, and on a shared machine the peaks and the profile
see different loads (efficiencies from 0.01 to 3 were seen on the same model)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from mlhpc.characterize.operators import OperatorLevel, OperatorStat, PhaseStat, profile_operators
from mlhpc.characterize.roofline import Peaks, machine_peaks, place_operators
from tests.helpers.characterize_models import conv_workload


@pytest.fixture(scope="module")
def cpu_peaks() -> Peaks:
    return machine_peaks("cpu", torch.float32, seconds=1.0)


def hand_peaks(flops_per_s: float, bandwidth: float) -> Peaks:
    return Peaks(
        device="cpu",
        dtype="float32",
        flops_per_s=flops_per_s,
        gemm_n=0,
        bandwidth_bytes_per_s=bandwidth,
        stream_flops_per_s=0.0,
        stream_array_bytes=0,
        cache_bytes=0,
        num_threads=1,
    )


def op(name: str, flops: float, seconds: float, nbytes: float) -> OperatorStat:
    return OperatorStat(
        phase="forward",
        op=name,
        calls_per_step=1,
        seconds_per_step=seconds,
        step_share=seconds,
        flops_per_step=flops,
        flops_per_s=flops / seconds if flops else None,
        bytes_per_step=nbytes,
        intensity=flops / nbytes if flops else None,
    )


def level_of(*operators: OperatorStat) -> OperatorLevel:
    phase = PhaseStat(phase="forward", range_seconds=1, op_seconds=1, step_share=1, flops=0)
    return OperatorLevel(
        device="cpu",
        time_basis="cpu",
        steps=1,
        step_seconds=1,
        flops_per_step=sum(o.flops_per_step for o in operators),
        phases=(phase,),
        operators=operators,
        bytes_inputs_only=(),
    )


def test_peaks_are_positive_and_gemm_outruns_streaming(cpu_peaks: Peaks) -> None:
    assert cpu_peaks.flops_per_s > 0 and cpu_peaks.bandwidth_bytes_per_s > 0
    assert cpu_peaks.gemm_n > 0 and cpu_peaks.num_threads == torch.get_num_threads()
    assert cpu_peaks.flops_per_s > cpu_peaks.stream_flops_per_s > 0
    assert cpu_peaks.ridge_intensity == cpu_peaks.flops_per_s / cpu_peaks.bandwidth_bytes_per_s
    if cpu_peaks.cache_bytes:
        assert cpu_peaks.stream_array_bytes > cpu_peaks.cache_bytes  # streams from DRAM, not cache
    json.dumps(dataclasses.asdict(cpu_peaks))


def test_placement_under_a_hand_made_roof() -> None:
    peaks = hand_peaks(flops_per_s=100.0, bandwidth=10.0)  # ridge at 10 FLOP/byte
    level = level_of(
        op("aten::relu", flops=0, seconds=1, nbytes=50),  # no FLOPs: not placed
        op("aten::mm", flops=20, seconds=2, nbytes=10),  # AI 2: roof 20, achieved 10
        op("aten::conv2d", flops=400, seconds=5, nbytes=8),  # AI 50: roof 100, achieved 80
    )
    roof = place_operators(peaks, level, workload_point=(10.0, 25.0))
    assert roof.ridge_intensity == 10.0
    conv, mm = roof.points  # most FLOPs first
    assert (conv.label, conv.attainable_flops_per_s, conv.efficiency, conv.bound) == (
        "forward/aten::conv2d",
        100.0,
        0.8,
        "compute",
    )
    assert (mm.label, mm.attainable_flops_per_s, mm.efficiency, mm.bound) == (
        "forward/aten::mm",
        20.0,
        0.5,
        "memory",
    )
    assert roof.workload is not None
    assert (roof.workload.attainable_flops_per_s, roof.workload.efficiency) == (100.0, 0.25)
    assert place_operators(peaks, level).workload is None
    json.dumps(dataclasses.asdict(roof))


def test_a_real_profile_is_placed(cpu_peaks: Peaks) -> None:
    level = profile_operators(conv_workload(4), steps=2)
    roof = place_operators(cpu_peaks, level)
    with_flops = {f"{o.phase}/{o.op}" for o in level.operators if o.flops_per_step}
    assert {p.label for p in roof.points} == with_flops
    for point in roof.points:
        assert point.efficiency > 0
        assert point.attainable_flops_per_s <= cpu_peaks.flops_per_s
        assert point.bound == ("memory" if point.intensity < roof.ridge_intensity else "compute")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_peaks() -> None:
    peaks = machine_peaks("cuda", torch.bfloat16, seconds=2.0)
    assert peaks.flops_per_s > peaks.stream_flops_per_s > 0
    assert peaks.stream_array_bytes > peaks.cache_bytes > 0
