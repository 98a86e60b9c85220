"""The campaign model (mlhpc/campaign/plan.py): one plan for every route, the one resume rule, the
campaign file and the settings it fixes for an --out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.campaign.io import given_settings, read_campaign_file
from mlhpc.campaign.plan import (
    CAMPAIGN_FILE,
    CampaignFile,
    Entry,
    ResultScan,
    config_identity,
    plan_campaign,
)
from mlhpc.common.errors import ConfigError, MlhpcError, SubmissionError
from tests.helpers.campaign_plans import OUT, SETTINGS, plan, recorded, request


def test_a_fresh_campaign_runs_every_index_from_a_random_first_seed() -> None:
    p = plan(request())
    assert (p.seeds, p.to_run, p.kept) == ((4242, 4243, 4244), (0, 1, 2), ())
    assert p.result_path(1) == OUT / "org/results/sys_n4/strong/cosmoflow/result_1.txt"
    assert p.breakdown_path(1) == OUT / "breakdown/org/sys_n4/strong/cosmoflow/result_1.json"
    assert p.data == OUT / "datasets/cosmoflow-mini" and p.generated_data
    assert p.record.entries["cosmoflow/strong"] == Entry(
        config="mini", config_id="aaaa", num_runs=3, first_seed=4242
    )
    assert (p.settings.division, p.settings.status, p.settings.ruleset) == ("closed", "onprem", "3.0.0")


def test_an_index_run_follows_the_recorded_campaign() -> None:
    scan = ResultScan(present=frozenset({0}), finished={0: 100})
    p = plan(request(num_runs=1, index=2, settings={}), recorded(), scan)
    assert (p.seeds, p.to_run, p.kept) == ((100, 101, 102), (2,), (0,))
    assert p.settings == SETTINGS  # every setting from the campaign file
    beyond = plan(request(num_runs=1, index=4, settings={}), recorded(), scan)
    assert beyond.seeds[4] == 104 and beyond.record.entries["cosmoflow/strong"].num_runs == 5


def test_a_recorded_campaign_needs_resume_even_before_its_first_result() -> None:
    with pytest.raises(SubmissionError, match="pass --resume"):
        plan(request(), recorded())
    assert plan(request(resume=True), recorded()).seeds == (100, 101, 102)


def test_a_changed_config_is_refused_on_every_route() -> None:
    for changes in ({"resume": True}, {"index": 1}, {"index": 0, "resume": True}):
        with pytest.raises(ConfigError, match="pass the same --config and overrides"):
            plan(request(config_id="bbbb", **changes), recorded())


def test_one_out_holds_one_system() -> None:
    with pytest.raises(ConfigError, match="one --out holds one system"):
        plan(request(resume=True, settings={"system": "other_n4"}), recorded())
    # Not given: the recorded one, not this machine's.
    p = plan(request(resume=True, settings={}, default_system="this_machine_n1"), recorded())
    assert p.system == "sys_n4"
    with pytest.raises(ConfigError, match="--submitter x"):
        plan(request(resume=True, settings={"submitter": "x"}), recorded())


def test_a_login_node_leaves_the_system_to_the_first_job() -> None:
    p = plan(request(settings={}, default_system=None))
    assert p.settings.system is None and p.record.settings.system is None
    first_job = plan(request(settings={}, index=0, default_system="gpu_n4"), p.record)
    assert first_job.system == "gpu_n4"


@pytest.mark.parametrize("bad", [{"system": "../x"}, {"submitter": "a/b"}, {"status": "home"}])
def test_a_setting_that_is_not_a_folder_name_or_a_choice_is_refused(bad: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        plan(request(settings=bad))


def test_campaign_file_round_trips_and_refuses_a_hostile_one(tmp_path: Path) -> None:
    path = tmp_path / CAMPAIGN_FILE
    path.write_text(json.dumps(recorded().to_json()))
    assert read_campaign_file(path) == recorded()
    with_hardware = CampaignFile(settings=SETTINGS, hardware="amd_epyc_cpu_n1")
    path.write_text(json.dumps(with_hardware.to_json()))
    assert read_campaign_file(path) == with_hardware
    assert read_campaign_file(tmp_path / "none.json") is None
    for text in ("{", "[]", '{"settings": {"submitter": "../../etc"}}'):
        path.write_text(text)
        with pytest.raises(MlhpcError) as e:
            read_campaign_file(path)
        assert str(path) in str(e.value) and "\n" not in str(e.value)
    path.unlink()
    path.symlink_to("/etc/passwd")
    with pytest.raises(SubmissionError):
        read_campaign_file(path)


def test_campaign_option_gives_settings_that_flags_must_agree_with(tmp_path: Path) -> None:
    given = tmp_path / "site.json"
    given.write_text(json.dumps({"settings": {"submitter": "lab", "system": "big_n64", "status": "cloud"}}))
    assert given_settings(given, {"submitter": None})["system"] == "big_n64"
    assert given_settings(given, {"submitter": "lab"})["status"] == "cloud"
    with pytest.raises(ConfigError, match="--submitter other differs from --campaign"):
        given_settings(given, {"submitter": "other"})


def test_config_identity_is_the_resolved_config() -> None:
    assert config_identity("a", {"x": 1, "y": {"z": 2}}) == config_identity("a", {"y": {"z": 2}, "x": 1})
    assert config_identity("a", {"x": 1}) != config_identity("a", {"x": 2})
    assert config_identity("a", {"x": 1}) != config_identity("b", {"x": 1})


# ---------------------------------------------------------------------------------------------
# The resume rule over any layout of existing results


@st.composite
def layouts(draw: st.DrawFn) -> tuple[int, int, dict[int, int], frozenset[int]]:
    """(count, first seed, finished {index: seed}, present indices) of one campaign's results."""
    count = draw(st.integers(1, 6))
    first = draw(st.integers(1, 10_000))
    present = draw(st.frozensets(st.integers(0, count - 1), max_size=count))
    finished = {i: first + i for i in present if draw(st.booleans())}
    return count, first, finished, present


@settings(max_examples=300, deadline=None)
@given(layout=layouts(), resume=st.booleans(), index=st.none() | st.integers(0, 7), record=st.booleans())
def test_resume_rule_never_reruns_a_finished_result(
    layout: tuple[int, int, dict[int, int], frozenset[int]], resume: bool, index: int | None, record: bool
) -> None:
    count, first, finished, present = layout
    scan = ResultScan(present=present, finished=finished)
    req = request(num_runs=count, resume=resume, index=index)
    rec = recorded(seeds=count, first_seed=first) if record else None
    try:
        p = plan(req, rec, scan)
    except (ConfigError, SubmissionError) as refused:
        message = str(refused)
        assert "\n" not in message
        if index is None:
            assert not resume and (present or record), message
        else:
            assert index in finished or (index in present and not resume), message
        return
    assert not set(p.to_run) & set(finished)  # a finished result is never run over
    assert all(p.seeds[i] == seed for i, seed in finished.items())  # its seed fixes the campaign's
    assert p.seeds == tuple(p.seeds[0] + i for i in range(len(p.seeds)))
    if finished or record:
        assert p.seeds[0] == first
    if index is None:
        assert sorted([*p.to_run, *p.kept]) == list(range(count))
        assert not (present - set(finished)) or resume
    else:
        assert p.to_run == (index,) and len(p.seeds) > index
    assert p.record.entries["cosmoflow/strong"].first_seed == p.seeds[0]


# ---------------------------------------------------------------------------------------------
# The default system name: the hardware's, never the host's (a container's host name is random)


def test_default_system_name_is_the_hardware_not_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    import platform

    import torch

    from mlhpc.common.cluster.distributed import DistContext
    from mlhpc.system_desc import hardware_slug, stable_system_name

    assert hardware_slug("Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz", "cpu", 2) == (
        "intel_xeon_platinum_8480_cpu_n2"
    )
    assert hardware_slug("NVIDIA H100 80GB HBM3", "gpu", 8) == "nvidia_h100_80gb_hbm3_gpu_n8"
    assert hardware_slug("AMD EPYC 7763 64-Core Processor", "cpu", 4) == "amd_epyc_7763_cpu_n4"
    assert hardware_slug("../..", "cpu", 1) == "unknown_cpu_n1"
    ctx = DistContext(
        rank=0,
        local_rank=0,
        world_size=4,
        local_world_size=4,
        num_nodes=1,
        device=torch.device("cpu"),
        backend="none",
        launcher="none",
    )
    names = set()
    for host in ("b51eb5ad80fa", "f00dcafe1234"):  # two containers of one image on one machine
        monkeypatch.setattr(platform, "node", lambda host=host: host)
        names.add(stable_system_name(ctx))
    (name,) = names
    assert name.endswith("_cpu_n4") and "b51eb5ad80fa" not in name


def test_results_under_another_system_are_not_mixed_with_a_new_one(tmp_path: Path) -> None:
    """An --out from before the campaign file, filed under a host-named system: refused, not mixed."""
    from mlhpc.campaign.io import scan_out

    (tmp_path / "org/results/b51eb5ad80fa_cpu_n1/strong/cosmoflow").mkdir(parents=True)
    req = request(out=tmp_path, settings={"submitter": "org"}, default_system="amd_epyc_cpu_n1")
    with pytest.raises(ConfigError, match="holds system b51eb5ad80fa_cpu_n1, not amd_epyc_cpu_n1"):
        plan_campaign(req, None, scan_out(tmp_path, "cosmoflow", "strong"), lambda: 1)
    same = request(out=tmp_path, settings={"submitter": "org", "system": "b51eb5ad80fa_cpu_n1"})
    assert plan_campaign(same, None, scan_out(tmp_path, "cosmoflow", "strong"), lambda: 1).to_run == (0, 1, 2)


def test_a_run_on_other_machines_is_refused_whatever_system_it_names() -> None:
    first = plan(request(settings={"system": "cluster"}, default_system="nvidia_h100_gpu_n8"))
    assert first.record.hardware == "nvidia_h100_gpu_n8"
    assert (
        plan(request(index=1, settings={}, default_system="nvidia_h100_gpu_n8"), first.record).system
        == "cluster"
    )
    for machine in ("nvidia_a100_gpu_n8", "nvidia_h100_gpu_n4"):  # another GPU, or other ranks
        with pytest.raises(
            ConfigError, match=f"on nvidia_h100_gpu_n8 machines, but this run is on {machine}"
        ):
            plan(request(index=1, settings={}, default_system=machine), first.record)
    # A login node (no hardware of its own) plans beside it.
    assert plan(request(resume=True, settings={}), first.record).record.hardware == "nvidia_h100_gpu_n8"
