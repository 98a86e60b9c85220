"""The one time-to-train loop and what it is made of.

Owns the loop and its epoch, its settings (loop_config), the MLLOG file and its well-formed
intervals (mllogger, run_events), where the time goes (timing), what a person watching sees
(progress), batches, DataLoaders and the optional DALI import, schedules and seeding. The top
room of common/: may import every other room, never the benchmarks or the command line.
"""
