"""A campaign: the options of `mlhpc run` (options), the pure planner (plan), campaign.json and the
results folders (io), resuming (resume), and the three ways to run one: here (local), through
Slurm (slurm) and on paper (dry_run). plan, io, options and slurm are torch-free: a login node
plans and submits without torch."""
