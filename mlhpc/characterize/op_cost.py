"""What one recorded aten call costs in FLOPs and bytes: the call is replayed on meta tensors (no data,
no time) from the shapes, dtypes and arguments the profiler recorded, under FlopCounterMode."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from torch.autograd.profiler_util import FunctionEvent
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count, flop_registry

# The profiler names dtypes as c10 spells them; these are the ones a training step uses.
_DTYPES = {
    "float": torch.float32,
    "double": torch.float64,
    "c10::Half": torch.float16,
    "c10::BFloat16": torch.bfloat16,
    "long int": torch.int64,
    "int": torch.int32,
    "short int": torch.int16,
    "signed char": torch.int8,
    "unsigned char": torch.uint8,
    "bool": torch.bool,
    "c10::Float8_e4m3fn": torch.float8_e4m3fn,
    "c10::Float8_e5m2": torch.float8_e5m2,
}


@dataclass(frozen=True)
class OpCost:
    """One call's cost."""

    flops: int
    """Floating-point operations, as torch.utils.flop_counter counts them: matmuls, convolutions
    (forward and backward) and attention; elementwise ops count none."""
    bytes: int
    """Input plus output tensor bytes (shape x element size); 0 for a view, which moves nothing."""
    complete: bool
    """False where neither the call nor the one call it passed on could be replayed (a tensor list,
    an op without a meta kernel): then `flops` sums the calls it made and `bytes` counts its
    recorded inputs only (a tensor list counts none)."""


def op_cost(event: FunctionEvent) -> OpCost:
    """The cost of one recorded aten call (the profiler needs record_shapes=True)."""
    dtypes = tuple(event.input_dtypes or ())
    shapes = tuple(tuple(s) if isinstance(s, list) else () for s in event.input_shapes or ())
    concrete = tuple(_hashable(c) for c in event.concrete_inputs or ())
    try:
        replay = _replay(event.name, shapes, dtypes, concrete)
    except TypeError:  # an argument the cache cannot key on; such calls are not replayed
        replay = None
    if replay is not None:
        return replay
    # Not replayable (conv3d(padding="same") keeps no record of its string argument): cost the
    # calls it made instead, which the profiler recorded in full.
    children = [op_cost(c) for c in event.cpu_children if c.name.startswith("aten::")]
    if len(children) == 1 and children[0].complete:
        return children[0]  # a wrapper that passed its whole call on
    inputs = sum(_nbytes(s, d) for s, d in zip(shapes, dtypes, strict=False))
    return OpCost(flops=sum(c.flops for c in children), bytes=inputs, complete=False)


def _nbytes(shape: Sequence[int], dtype: str) -> int:
    if dtype not in _DTYPES:
        return 0
    return _numel(shape) * _DTYPES[dtype].itemsize


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _hashable(value: Any) -> Any:
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


@lru_cache(maxsize=4096)
def _replay(name: str, shapes: tuple, dtypes: tuple, concrete: tuple) -> OpCost | None:
    """Replay once per distinct call signature (a step repeats the same calls)."""
    if not name.startswith("aten::") or any(
        d not in _DTYPES and d not in ("", "Scalar", "ScalarList") for d in dtypes
    ):
        return None
    packet = getattr(torch.ops.aten, name.removeprefix("aten::"), None)
    if packet is None:
        return None
    schema = _match_schema(packet, dtypes)
    if schema is None:
        return None
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for arg, shape, dtype, value in zip(schema.arguments, shapes, dtypes, concrete, strict=False):
        if dtype in _DTYPES:
            value = torch.empty(shape, dtype=_DTYPES[dtype], device="meta")
        elif "Device" in str(arg.type):
            value = torch.device("meta")  # never allocate for real while costing
        elif isinstance(value, tuple):
            value = list(value)
        if arg.kwarg_only:
            kwargs[arg.name] = value
        else:
            args.append(value)
    counter = FlopCounterMode(
        display=False, custom_mapping={torch.ops.aten.convolution_backward: _conv_backward_flops}
    )
    try:
        with counter:
            out = getattr(packet, schema.overload_name or "default")(*args, **kwargs)
    except Exception:  # no meta kernel, or arguments the profiler did not keep: cost it without
        return None
    view = all(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
    tensors = [t for t in (*args, *kwargs.values(), *tree_leaves(out)) if isinstance(t, torch.Tensor)]
    nbytes = 0 if view else sum(t.numel() * t.element_size() for t in tensors)
    return OpCost(flops=int(counter.get_total_flops()), bytes=nbytes, complete=True)


def _conv_backward_flops(
    grad_out: Any, x: Any, w: Any, *args: Any, out_val: Any = None, **kwargs: Any
) -> int:
    """torch's count, less its overcount of a grouped convolution's weight gradient: it counts that
    gradient as if the convolution were not grouped, `groups` times the forward's FLOPs."""
    flops = flop_registry[torch.ops.aten.convolution_backward](
        grad_out, x, w, *args, out_val=out_val, **kwargs
    )
    _bias, _stride, _padding, _dilation, transposed, _output_padding, groups, output_mask = args
    if groups > 1 and output_mask[1]:
        flops -= (groups - 1) * conv_flop_count(
            list(x.shape), list(w.shape), list(grad_out.shape), transposed
        )
    return flops


_conv_backward_flops._get_raw = True  # type: ignore[attr-defined]  # FlopCounterMode passes tensors, as to its own


def _match_schema(packet: Any, dtypes: tuple) -> Any:
    """The overload whose arguments line up with what was recorded: a tensor where a tensor was
    recorded, an optional where nothing was."""
    for overload in packet.overloads():
        schema = getattr(packet, overload)._schema
        if len(schema.arguments) != len(dtypes):
            continue
        if all(_fits(str(a.type), d) for a, d in zip(schema.arguments, dtypes, strict=True)):
            return schema
    return None


def _fits(schema_type: str, dtype: str) -> bool:
    tensor = schema_type in ("Tensor", "Optional[Tensor]")
    if dtype in _DTYPES:
        return tensor
    if dtype == "":
        return schema_type.startswith("Optional")
    return not tensor and "Tensor" not in schema_type
