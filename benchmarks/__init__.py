"""The reference trainers; importing this package registers every benchmark it ships."""

from mlhpc.benchmarks import (
    cosmoflow,  # noqa: F401
    deepcam,  # noqa: F401
    extreme_weather,  # noqa: F401
)
