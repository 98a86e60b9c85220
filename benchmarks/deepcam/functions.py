"""DeepCAM's torch side: the functions the shared loop calls, bound to its catalog entry by
`registry.get("deepcam")`."""

from mlhpc.benchmarks.deepcam import dali, data, model, train
from mlhpc.common.contract.registry import BenchmarkFunctions
from mlhpc.common.training.dali import data_builder

FUNCTIONS = BenchmarkFunctions(
    generate=data.generate,
    validate_dataset=data.validate_dataset,
    build_model=model.build_model,
    build_data=data_builder(data.build_torch_data, dali.build_dali_data),
    build_optimizer=train.build_optimizer,
    compute_loss=train.compute_loss,
    evaluate=data.evaluate,
    hyperparameters=train.hyperparameters,
    example_batch=train.example_batch,
    sample_bytes=data.sample_bytes,
)
