"""Checking a .npy file from its header and size alone, without reading the array."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mlhpc.common.errors import DataError
from mlhpc.common.safeio.datasets import open_sample


def check_npy(
    path: Path,
    shape: tuple[int, ...],
    dtype: np.dtype | tuple[np.dtype, ...],
    fix: str = "regenerate it or change the config to match",
) -> None:
    """Wrong shape, wrong dtype (one of `dtype` when a tuple) or truncation is a DataError."""
    allowed = tuple(np.dtype(d) for d in (dtype if isinstance(dtype, tuple) else (dtype,)))
    try:
        with open_sample(path) as handle:  # a regular file only: a FIFO would block
            version = np.lib.format.read_magic(handle)
            if version == (1, 0):
                header = np.lib.format.read_array_header_1_0(handle)
            else:
                header = np.lib.format.read_array_header_2_0(handle)
            got_shape, fortran, got_dtype = header
            offset = handle.tell()
            actual = os.fstat(handle.fileno()).st_size
    except FileNotFoundError as e:
        raise DataError(f"{path} is listed but missing; regenerate or restage the dataset") from e
    except (OSError, ValueError) as e:
        raise DataError(f"{path} is not a valid .npy file ({e}); regenerate or restage it") from e
    got_dtype = np.dtype(got_dtype)
    if tuple(got_shape) != shape or got_dtype not in allowed or fortran:
        expected = " or ".join(f"{d}{list(shape)}" for d in allowed)
        raise DataError(f"{path} holds {got_dtype}{list(got_shape)}, expected {expected}; {fix}")
    expected_bytes = offset + int(np.prod(shape)) * got_dtype.itemsize
    if actual != expected_bytes:
        raise DataError(f"{path} is truncated ({actual} of {expected_bytes} bytes); regenerate or restage it")
