"""A campaign plan for tests: a request planned over given results on disk with a fixed first-seed draw."""

from __future__ import annotations

from mlhpc.campaign.plan import CampaignFile, CampaignPlan, CampaignRequest, ResultScan, plan_campaign


def plan(
    req: CampaignRequest, record: CampaignFile | None = None, scan: ResultScan | None = None
) -> CampaignPlan:
    """The plan for `req` over `record`, with `scan` as the results on disk and 4242 as the first-seed draw."""
    return plan_campaign(req, record, lambda _: scan or ResultScan(), lambda: 4242)
