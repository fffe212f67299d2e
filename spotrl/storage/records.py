"""Run records: the JSON-lines files of a run directory, read and written in one place.

Every JSON file a resume reads goes through `parse_json`/`read_json` (a seal, a manifest, a
per-iteration record): bytes that are not UTF-8 JSON of an object with the expected keys are a
`RecordError` naming the file, which the caller treats as damage (moved aside, regenerated), never a
traceback.

RUN/metrics.jsonl and RUN/eval.jsonl are rebuilt whole from one file per iteration
(RUN/<kind>/iter_N.json, written atomically), so a killed and resumed run never duplicates or loses
a line; RUN/quarantine/log.jsonl is appended to. Local paths and object stores (gs://) alike.

One reading rule for all of them: a line is one JSON object; blank lines are skipped; a LAST line
that does not parse is a torn append (a process killed mid-write) and is skipped; any other line
that is not a JSON object is damage, a `RecordError` naming the file and the line.
"""

from __future__ import annotations

import json

from spotrl.storage.atomic import atomic_write_json, atomic_write_text
from spotrl.storage.paths import AnyPath, append_line, as_path


class RecordError(ValueError):
    """A damaged JSON file, or a damaged line in a JSON-lines file (not the torn last one)."""


def parse_json(data: bytes, source: str, keys: tuple[str, ...] = ()) -> dict:
    """One JSON object holding `keys`, from `data`; `source` names the file in errors."""
    try:
        value = json.loads(data.decode())
    except ValueError as err:  # UnicodeDecodeError and JSONDecodeError are both ValueErrors
        raise RecordError(f"{source}: not JSON ({type(err).__name__}: {err})") from None
    if not isinstance(value, dict):
        raise RecordError(f"{source}: not a JSON object but {type(value).__name__}")
    if missing := [k for k in keys if k not in value]:
        raise RecordError(f"{source}: no {', '.join(missing)} in it")
    return value


def read_json(path: str | AnyPath, keys: tuple[str, ...] = ()) -> dict:
    """`parse_json` of a file; FileNotFoundError when it does not exist."""
    path = as_path(path)
    return parse_json(path.read_bytes(), str(path), keys)


def parse_lines(data: bytes, source: str) -> list[dict]:
    """The JSON objects of JSON-lines `data`, in order, by the rule above; `source` names the file in errors."""
    lines = [(number, line) for number, line in enumerate(data.split(b"\n"), 1) if line.strip()]
    records = []
    for place, (number, line) in enumerate(lines):
        try:
            record = json.loads(line.decode())
        except ValueError as err:  # UnicodeDecodeError and JSONDecodeError are both ValueErrors
            if place == len(lines) - 1:
                break  # torn: the last append did not finish
            raise RecordError(f"{source}:{number}: not a JSON line ({err})") from None
        if not isinstance(record, dict):
            raise RecordError(f"{source}:{number}: not a JSON object but {type(record).__name__}")
        records.append(record)
    return records


def read_jsonl(path: str | AnyPath) -> list[dict]:
    """The records of one JSON-lines file; FileNotFoundError when it does not exist."""
    path = as_path(path)
    return parse_lines(path.read_bytes(), str(path))


def append_record(path: str | AnyPath, record: dict) -> None:
    """Append one record as a line (an object store rewrites the object whole)."""
    append_line(as_path(path), json.dumps(record))


def write_jsonl(path: str | AnyPath, records: list[dict]) -> None:
    """Replace the file, atomically, with one line per record (keys sorted)."""
    atomic_write_text(path, "".join(json.dumps(record, sort_keys=True) + "\n" for record in records))


# --- the per-iteration records behind RUN/<kind>.jsonl -------------------------------------------------
def _iteration_file(run_dir: str | AnyPath, kind: str, iteration: int) -> AnyPath:
    return as_path(run_dir) / kind / f"iter_{iteration:06d}.json"


def write_record(run_dir: str | AnyPath, kind: str, iteration: int, record: dict) -> None:
    """Write RUN/<kind>/iter_N.json and rebuild RUN/<kind>.jsonl from all records, in order."""
    atomic_write_json(_iteration_file(run_dir, kind, iteration), record)
    rebuild_jsonl(run_dir, kind)


def rebuild_jsonl(run_dir: str | AnyPath, kind: str) -> None:
    """RUN/<kind>.jsonl made again from RUN/<kind>/iter_N.json (not created when there are none)."""
    files, path = record_files(run_dir, kind), as_path(run_dir) / f"{kind}.jsonl"
    if files or path.exists():
        write_jsonl(path, [read_json(files[i]) for i in sorted(files)])


def record_exists(run_dir: str | AnyPath, kind: str, iteration: int) -> bool:
    return _iteration_file(run_dir, kind, iteration).exists()


def read_record(run_dir: str | AnyPath, kind: str, iteration: int) -> dict:
    return read_json(_iteration_file(run_dir, kind, iteration))


def record_files(run_dir: str | AnyPath, kind: str) -> dict[int, AnyPath]:
    """RUN/<kind>/iter_N.json by iteration."""
    folder = as_path(run_dir) / kind
    if not folder.exists():
        return {}
    found = {p.name.removeprefix("iter_").removesuffix(".json"): p for p in folder.glob("iter_*.json")}
    return {int(number): p for number, p in found.items() if number.isdigit()}


def damaged_records(run_dir: str | AnyPath, kind: str) -> dict[AnyPath, str]:
    """The RUN/<kind>/iter_N.json files that are not a JSON object, and why."""
    damaged = {}
    for path in record_files(run_dir, kind).values():
        try:
            read_json(path)
        except RecordError as err:
            damaged[path] = str(err)
    return damaged


def read_records(run_dir: str | AnyPath, kind: str) -> list[dict]:
    """RUN/<kind>.jsonl's records in file order; [] when the file does not exist."""
    path = as_path(run_dir) / f"{kind}.jsonl"
    return read_jsonl(path) if path.exists() else []
