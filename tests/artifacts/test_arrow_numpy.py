"""Numpy views of Arrow arrays read from their buffers: the same numbers pyarrow's conversions give."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from dspark_calibrate.artifacts._arrow_numpy import float_values, indices_array, numeric_values, valid_mask

NUMERIC = [
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.uint8(),
    pa.uint16(),
    pa.uint32(),
    pa.uint64(),
    pa.float16(),
    pa.float32(),
    pa.float64(),
]


def _values(typ: pa.DataType) -> list[object]:
    if pa.types.is_floating(typ):
        half = typ == pa.float16()
        return [np.float16(v) if half and v is not None else v for v in (1.5, None, -2.0, 0.0, 3.25, None)]
    return [1, None, 2, 0, 7, None]


@pytest.mark.parametrize("typ", NUMERIC, ids=str)
@pytest.mark.parametrize("start", [0, 1, 3])
def test_views_hold_the_values_of_a_sliced_array(typ: pa.DataType, start: int) -> None:
    arr = pa.array(_values(typ), typ).slice(start)
    want = arr.to_pylist()
    valid = valid_mask(arr)
    assert valid.tolist() == [v is not None for v in want]
    got = numeric_values(arr)
    assert [float(x) for x, ok in zip(got, valid, strict=True) if ok] == [
        float(v) for v in want if v is not None
    ]
    floats = float_values(pa.chunked_array([arr, arr]))
    assert [None if math.isnan(x) else x for x in floats.tolist()] == [
        None if v is None else float(v) for v in want * 2
    ]


def test_an_array_without_nulls_is_all_valid_and_empty_arrays_are_empty() -> None:
    assert valid_mask(pa.array([1, 2], pa.int64())).tolist() == [True, True]
    assert numeric_values(pa.array([], pa.int32())).size == 0
    assert float_values(pa.chunked_array([], pa.float64())).size == 0


def test_only_numeric_arrays_are_viewed() -> None:
    with pytest.raises(TypeError):
        numeric_values(pa.array(["a"]))


def test_indices_take_rows() -> None:
    table = pa.table({"x": [10, 20, 30]})
    assert table.take(indices_array(np.array([2, 0]))).column("x").to_pylist() == [30, 10]
