"""Checks of stored transitions' values, run when a prior dataset or a checkpoint's replay file is
loaded, before any actor starts.

One NaN or infinity in a sampled batch turns every loss, gradient and then every weight of the
networks into NaN; an action outside the policy's [-1, 1] space (a dataset recorded in the env's
own action scale, say) trains the critics on actions the actor can never take. Neither fails
loudly later: the run trains on. So the columns are read once, on load, and the first bad value is
named with its column and row.

The common case, all values good, costs two reductions per column (numpy's min and max, which
propagate NaN): no mask is allocated until a column is known to hold a bad value, and only then is
the first bad row looked for.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# the policy's action space: what datasets and replay files store (env actions are mapped from it)
ACTION_RANGE = (-1.0, 1.0)


@dataclass(frozen=True)
class BadValue:
    """The first bad value of a column: its row (counted from the start of the file) and why."""

    column: str
    row: int
    problem: str  # "NaN", "inf", "an empty (null) value", "1.5, outside the action range [-1, 1]"

    def describe(self) -> str:
        return f"column {self.column} holds {self.problem} at row {self.row}"


def first_bad_value(
    table: pa.Table | pa.RecordBatch, columns: Iterable[str], action_columns: Iterable[str] = (),
    first_row: int = 0,
) -> BadValue | None:
    """The first null or non-finite value of `columns` (float or fixed-size lists of floats), or
    the first value of `action_columns` outside ACTION_RANGE; None when every value is good.
    `first_row`: the file row of the table's first row (tables read a batch at a time)."""
    actions = set(action_columns)
    for column in columns:
        bounds = ACTION_RANGE if column in actions else None
        data = table.column(column)
        chunks = data.chunks if isinstance(data, pa.ChunkedArray) else [data]
        offset = first_row
        for chunk in chunks:
            bad = _first_bad_in_array(chunk, bounds)
            if bad is not None:
                row, problem = bad
                return BadValue(column, offset + row, problem)
            offset += len(chunk)
    return None


def _first_bad_in_array(array: pa.Array, bounds: tuple[float, float] | None) -> tuple[int, str] | None:
    """(row, problem) of an array's first bad value, or None."""
    if len(array) == 0:
        return None
    if array.null_count:
        return _first_true(array.is_null()), "an empty (null) value"
    width = 1
    values = array
    if isinstance(array.type, pa.FixedSizeListType):
        width = array.type.list_size
        values = array.flatten()  # honours the array's offset: row r is values[r * width:(r + 1) * width]
        if values.null_count:
            return _first_true(values.is_null()) // width, "an empty (null) value"
    numbers = values.to_numpy(zero_copy_only=False)
    if numbers.size == 0:
        return None
    low, high = numbers.min(), numbers.max()  # a NaN anywhere makes both NaN
    if np.isfinite(low) and np.isfinite(high) and (bounds is None or (bounds[0] <= low and high <= bounds[1])):
        return None
    bad = ~np.isfinite(numbers)
    if bounds is not None:
        bad |= (numbers < bounds[0]) | (numbers > bounds[1])
    index = int(np.argmax(bad))
    value = float(numbers[index])
    if np.isfinite(value):
        problem = f"{value:.6g}, outside the action range [{bounds[0]:g}, {bounds[1]:g}]"
    else:
        problem = "NaN" if np.isnan(value) else ("inf" if value > 0 else "-inf")
    return index // width, problem


def _first_true(mask: pa.BooleanArray) -> int:
    return int(pc.index(mask, True).as_py())
