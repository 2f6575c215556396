"""pandas frames handed to Spark, the same on pandas 2 and 3."""

from __future__ import annotations

import pandas as pd


def object_strings(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with its text columns as Python objects.

    pandas 3 keeps text in pyarrow-backed string columns by default, and PySpark (seen with 4.3)
    cannot convert those chunked arrays when a pandas UDF returns them or a frame becomes a
    DataFrame ("Cannot convert pyarrow.lib.ChunkedArray to pyarrow.lib.Array"). Object columns
    convert on every version; on pandas 2 text is already object and nothing changes."""
    text = [name for name, dtype in frame.dtypes.items() if isinstance(dtype, pd.StringDtype)]
    return frame.astype({name: object for name in text}) if text else frame
