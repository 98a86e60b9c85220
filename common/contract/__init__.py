"""The benchmark contract: what a benchmark is and how mlhpc finds and configures it.

Owns the catalog of facts found through the `mlhpc.benchmarks` entry points (catalog), those
facts bound to a benchmark's torch functions (registry), typed YAML configs with `key=value`
overrides (config) and which benchmark's layout a data folder has (data_kinds). A third-party
benchmark needs only this room and training's loop settings. May import: the words at common/'s
top and cluster (a config's thread count).
"""
