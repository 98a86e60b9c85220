"""Campaign plans for tests: a request (the planner's view of an `mlhpc run`), a recorded
campaign file, and a request planned over given results with a fixed first-seed draw."""

from __future__ import annotations

from pathlib import Path

from mlhpc.campaign.plan import (
    CampaignFile,
    CampaignPlan,
    CampaignRequest,
    Entry,
    ResultScan,
    Settings,
    plan_campaign,
)

OUT = Path("/runs/out")
SETTINGS = Settings(submitter="org", system="sys_n4", division="closed", status="onprem", ruleset="3.0.0")


def request(**changes: object) -> CampaignRequest:
    """A strong CosmoFlow mini campaign of 3 runs into OUT, submitter and system given; `changes` on top."""
    values: dict[str, object] = {
        "benchmark": "cosmoflow",
        "config": "mini",
        "config_id": "aaaa",
        "out": OUT,
        "num_runs": 3,
        "settings": {"submitter": "org", "system": "sys_n4"},
    }
    values.update(changes)
    return CampaignRequest(**values)  # type: ignore[arg-type]


def recorded(seeds: int = 3, first_seed: int = 100, config_id: str = "aaaa") -> CampaignFile:
    """The campaign file such a campaign left: SETTINGS and its one entry."""
    entry = Entry(config="mini", config_id=config_id, num_runs=seeds, first_seed=first_seed)
    return CampaignFile(settings=SETTINGS, entries={"cosmoflow/strong": entry})


def plan(
    req: CampaignRequest, record: CampaignFile | None = None, scan: ResultScan | None = None
) -> CampaignPlan:
    """The plan for `req` over `record`, with `scan` as the results on disk and 4242 as the first-seed draw."""
    return plan_campaign(req, record, lambda _: scan or ResultScan(), lambda: 4242)
