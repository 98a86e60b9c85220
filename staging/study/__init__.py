"""The staging study: `mlhpc stage-bench` (bench.py, its outputs in report.py), its measures
(dataset.py: the source and its page cache; clock.py: the user's clock; raw.py: the disks
without software; baselines.py: cp, tar, dd; rank_groups.py: runs on local rank groups;
cgroup.py: a memory limit) and the paper model of staging at scale (model.py). Apart from the
product so that nothing staging does at run time imports it."""
