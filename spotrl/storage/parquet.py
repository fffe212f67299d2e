"""Data frames as parquet files, written atomically and read back only if their checksum matches."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from spotrl.storage.atomic import atomic_write_bytes
from spotrl.storage.paths import as_path


class CorruptFileError(RuntimeError):
    pass


def frame_bytes(frame: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), buffer)
    return buffer.getvalue()


def write_frame(path: str | Path, frame: pd.DataFrame) -> str:
    """Write `frame` atomically; returns the sha256 of the file."""
    data = frame_bytes(frame)
    atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def read_frame(path: str | Path, sha256: str | None = None) -> pd.DataFrame:
    """Read a parquet file; with `sha256`, refuse a file whose content is not exactly that."""
    data = as_path(path).read_bytes()  # read once: the bytes checked are the bytes parsed
    if sha256 is not None and (actual := hashlib.sha256(data).hexdigest()) != sha256:
        raise CorruptFileError(f"{path}: sha256 {actual[:12]}... does not match the recorded {sha256[:12]}...")
    return pq.read_table(pa.BufferReader(data)).to_pandas()
