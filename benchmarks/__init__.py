"""The reference trainers. Each package's `__init__` holds its catalog facts (torch-free); its
`functions` module holds the torch side, imported only when a run needs it.

The catalog finds them through the `mlhpc.benchmarks` entry points in pyproject.toml, as it
finds a third party's; this list is what those entry points must declare (a test checks).
"""

BUILTIN: tuple[str, ...] = ("aiperf", "cosmoflow", "deepcam", "extreme_weather")
"""The benchmarks mlhpc ships: entry point `<name> = mlhpc.benchmarks.<name>:BENCHMARK`."""
