"""Extreme weather's torch side: the functions the shared loop calls, bound to its catalog entry
by `registry.get("extreme_weather")`."""

from mlhpc.benchmarks.extreme_weather import data, evaluation, model, train
from mlhpc.common.contract.registry import BenchmarkFunctions

FUNCTIONS = BenchmarkFunctions(
    generate=data.generate,
    validate_dataset=data.validate_dataset,
    build_model=model.build_model,
    build_data=data.build_data,
    build_optimizer=train.build_optimizer,
    compute_loss=train.compute_loss,
    evaluate=evaluation.evaluate,
    hyperparameters=train.hyperparameters,
    run_end_events=train.run_end_events,
    example_batch=train.example_batch,
    sample_bytes=data.sample_bytes,
)
