"""The staging study: `mlhpc stage-bench` (bench.py, its outputs in report.py), its measures
(dataset.py: the source and its page cache; clock.py: the user's clock; raw.py: the disks
without software; baselines.py: cp, tar, dd; rank_groups.py: runs on local rank groups;
cgroup.py: a memory limit) and the model of staging time against node count (model.py; the
virtual cluster's study, perf/cluster_staging.py, uses it too). It measures staging from
outside, so it lives beside the product, not in `staging/`: nothing staging does imports it."""
