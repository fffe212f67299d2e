"""Data frames as parquet files, written atomically."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from spotrl.storage.atomic import atomic_write_bytes


def write_frame(path: str | Path, frame: pd.DataFrame) -> None:
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), buffer)
    atomic_write_bytes(path, buffer.getvalue())


def read_frame(path: str | Path) -> pd.DataFrame:
    return pq.read_table(path).to_pandas()
