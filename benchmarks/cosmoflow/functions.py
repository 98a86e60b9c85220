"""CosmoFlow's torch side: the functions the shared loop calls, bound to its catalog entry by
`registry.get("cosmoflow")`."""

from mlhpc.benchmarks.cosmoflow import data, model, train
from mlhpc.common.contract.registry import BenchmarkFunctions

FUNCTIONS = BenchmarkFunctions(
    generate=data.generate,
    validate_dataset=data.validate_dataset,
    build_model=model.build_model,
    build_data=data.build_data,
    build_optimizer=train.build_optimizer,
    compute_loss=train.compute_loss,
    evaluate=data.evaluate,
    hyperparameters=train.hyperparameters,
)
