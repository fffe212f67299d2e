"""Reading prompt sources: JSONL/JSON, Parquet, CSV files and saved `datasets` directories, from a
local path or any fsspec URL (gs:// through gcsfs). Nothing is validated here beyond parsing: a line
that is not JSON or a CSV row with the wrong number of fields becomes a row error (quarantined by
`canonical`), never a crash; a source that cannot be read at all raises `SourceError`.

Rows are numbered from 0 in the order of the source: for JSONL the line number minus one (blank
lines are skipped but keep their number), for CSV the data row after the header, for Parquet and
`datasets` the row index.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
from dataclasses import dataclass, field

import fsspec
from fsspec.utils import infer_compression

FORMATS = ("jsonl", "json", "parquet", "csv", "datasets")
_EXTENSIONS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
}
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class SourceError(ValueError):
    """A source that cannot be used at all (missing, unknown format, bad mapping)."""


@dataclass(frozen=True)
class SourceSpec:
    name: str
    path: str
    mapping: dict = field(default_factory=dict)  # source column -> canonical field
    format: str | None = None  # one of FORMATS; None: from the extension (a directory is `datasets`)
    split: str | None = None  # the split of a saved DatasetDict
    storage_options: dict = field(default_factory=dict)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "path": self.path,
            "mapping": dict(sorted(self.mapping.items())),
            "format": self.format,
            "split": self.split,
        }


@dataclass
class RawSource:
    spec: SourceSpec
    format: str
    records: list[tuple[int, dict]]  # (row, record)
    errors: list[tuple[int, str, str, str | None]]  # (row, field, problem, raw text) for rows that could not be parsed
    columns: list[str]  # every column seen, in first-seen order
    sha256: str  # of the content read (all files of a directory)

    @property
    def rows_read(self) -> int:
        return len(self.records) + len(self.errors)


def parse_source_arg(arg: str) -> tuple[str, str]:
    """'NAME=PATH' or 'PATH' (the name is then the file or directory name without extensions)."""
    name, sep, path = arg.partition("=")
    if sep and _NAME.match(name) and "/" not in name and "://" not in name:
        return name, path
    return default_name(arg), arg


def default_name(path: str) -> str:
    base = path.rstrip("/").rsplit("/", 1)[-1]
    for ext in (".gz", ".bz2", ".xz", ".zst", ".zstd"):
        if base.endswith(ext):
            base = base[: -len(ext)]
    stem, dot, ext = base.rpartition(".")
    name = stem if dot and f".{ext}" in _EXTENSIONS else base
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "source"


def read_source(spec: SourceSpec) -> RawSource:
    try:
        fs, root = fsspec.core.url_to_fs(spec.path, **spec.storage_options)
    except (ImportError, ValueError) as err:
        raise SourceError(f"source {spec.name!r}: cannot open {spec.path}: {err}") from None
    try:
        is_dir = fs.isdir(root)
        if not is_dir and not fs.exists(root):
            raise SourceError(f"source {spec.name!r}: {spec.path} does not exist")
    except SourceError:
        raise
    except Exception as err:  # noqa: BLE001 - any filesystem's way of saying it cannot reach the path
        raise SourceError(f"source {spec.name!r}: cannot reach {spec.path}: {type(err).__name__}: {err}") from None
    fmt = spec.format or ("datasets" if is_dir else _format_of(root))
    if fmt not in FORMATS:
        raise SourceError(
            f"source {spec.name!r}: unknown format {fmt!r} for {spec.path} (known: {', '.join(FORMATS)}; "
            "name the file .jsonl, .json, .parquet or .csv, or pass a saved datasets directory)"
        )
    if fmt == "datasets":
        return _read_datasets(spec, fs, root)
    with fs.open(root, "rb", compression=infer_compression(root)) as f:
        data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    records, errors, *columns = {"jsonl": _jsonl, "json": _json, "parquet": _parquet, "csv": _csv}[fmt](spec, data)
    return RawSource(spec, fmt, records, errors, columns[0] if columns else _columns(records), digest)


def _format_of(path: str) -> str | None:
    base = path.lower()
    for ext in (".gz", ".bz2", ".xz", ".zst", ".zstd"):
        if base.endswith(ext):
            base = base[: -len(ext)]
    return _EXTENSIONS.get(os.path.splitext(base)[1])


def _columns(records) -> list[str]:
    seen: dict[str, None] = {}
    for _, record in records:
        for key in record:
            seen.setdefault(key, None)
    return list(seen)


def _jsonl(spec: SourceSpec, data: bytes):
    records, errors = [], []
    for row, line in enumerate(data.split(b"\n")):
        if not line.strip():
            continue
        try:
            value = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            errors.append((row, "*", "line is not UTF-8", None))
            continue
        except ValueError as err:
            errors.append((row, "*", f"line is not valid JSON ({err})", line.decode("utf-8", "replace")))
            continue
        if not isinstance(value, dict):
            errors.append(
                (row, "*", f"line is not a JSON object ({type(value).__name__})", line.decode("utf-8", "replace"))
            )
            continue
        records.append((row, value))
    return records, errors


def _json(spec: SourceSpec, data: bytes):
    text = data.lstrip()
    if not text.startswith(b"["):
        return _jsonl(spec, data)
    try:
        values = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise SourceError(f"source {spec.name!r}: {spec.path} is not valid JSON: {err}") from None
    records, errors = [], []
    for row, value in enumerate(values):
        if isinstance(value, dict):
            records.append((row, value))
        else:
            errors.append((row, "*", f"element is not a JSON object ({type(value).__name__})", json.dumps(value)))
    return records, errors


def _parquet(spec: SourceSpec, data: bytes):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(io.BytesIO(data))
    except (pa.ArrowException, OSError) as err:
        raise SourceError(f"source {spec.name!r}: {spec.path} is not a readable Parquet file: {err}") from None
    return list(enumerate(table.to_pylist())), [], list(table.column_names)


def _csv(spec: SourceSpec, data: bytes):
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise SourceError(f"source {spec.name!r}: {spec.path} is not UTF-8: {err}") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        return [], [], []
    except csv.Error as err:
        raise SourceError(f"source {spec.name!r}: {spec.path}: unreadable CSV header: {err}") from None
    records, errors = [], []
    row = -1
    while True:
        row += 1
        try:
            values = next(reader)
        except StopIteration:
            break
        except csv.Error as err:
            errors.append((row, "*", f"unreadable CSV row ({err})", None))
            continue
        if not values:
            continue
        if len(values) != len(header):
            errors.append(
                (
                    row,
                    "*",
                    f"CSV row has the wrong number of fields ({len(values)}, the header has {len(header)})",
                    json.dumps(values),
                )
            )
            continue
        records.append((row, {k: (v if v != "" else None) for k, v in zip(header, values)}))
    return records, errors, header


def _read_datasets(spec: SourceSpec, fs, root: str) -> RawSource:
    import datasets

    h = hashlib.sha256()
    for path in sorted(fs.find(root)):
        h.update(os.path.relpath(path, root).encode() + b"\0")
        with fs.open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    try:
        loaded = datasets.load_from_disk(spec.path, storage_options=spec.storage_options or None)
    except (FileNotFoundError, ValueError) as err:
        raise SourceError(f"source {spec.name!r}: {spec.path} is not a saved datasets directory: {err}") from None
    if isinstance(loaded, datasets.DatasetDict):
        split = spec.split or ("train" if "train" in loaded else None)
        if split not in loaded:
            raise SourceError(
                f"source {spec.name!r}: {spec.path} holds splits {sorted(loaded)}; choose one "
                f"(--split {spec.name}=SPLIT)"
            )
        loaded = loaded[split]
    records = list(enumerate(loaded.to_list()))
    return RawSource(spec, "datasets", records, [], list(loaded.column_names), h.hexdigest())
