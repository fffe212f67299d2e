"""Mapping a source's rows into the canonical schema; rows that fail go to quarantine, with the reason.

A source's columns map to the canonical fields (`id`, `prompt`, `answer`, `tests`) by its mapping
(`{"question": "prompt"}`), or by name when a column is already called that. Every other column is
kept in `metadata` (a JSON object), so nothing of a row is lost. Values are coerced only where it
is lossless: integers to text (`72` -> "72"), a list of strings in `tests` to lines. Rows failing
the canonical schema (pandera, `schema.CANONICAL_SCHEMA`) are quarantined with the row number and
the field named; the rest proceed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import pandas as pd

from spotrl.curation.schema import CANONICAL_COLUMNS, canonical_failures
from spotrl.curation.sources import RawSource, SourceError

MAPPABLE = ("id", "prompt", "answer", "tests")
QUARANTINE_COLUMNS = ("source", "row", "fields", "reason", "record")
MAX_RECORD_CHARS = 10_000


def resolve_mapping(raw: RawSource) -> dict[str, str]:
    """canonical field -> source column, checked against the columns the source has."""
    name, columns = raw.spec.name, raw.columns
    fields: dict[str, str] = {}
    for column, target in raw.spec.mapping.items():
        if target not in MAPPABLE:
            raise SourceError(
                f"source {name!r}: cannot map {column!r} to {target!r}; the fields are {', '.join(MAPPABLE)} "
                "(other columns go to metadata by themselves)"
            )
        if column not in columns:
            raise SourceError(f"source {name!r} has no column {column!r} (columns: {', '.join(columns) or 'none'})")
        if target in fields:
            raise SourceError(f"source {name!r}: both {fields[target]!r} and {column!r} map to {target!r}")
        fields[target] = column
    for target in MAPPABLE:
        if target not in fields and target in columns and target not in raw.spec.mapping:
            fields[target] = target
    if "prompt" not in fields and raw.records:
        raise SourceError(
            f"source {name!r} has no prompt column; map one with --map {name}.COLUMN=prompt "
            f"(columns: {', '.join(columns)})"
        )
    if "answer" not in fields and "tests" not in fields and raw.records:
        raise SourceError(
            f"source {name!r} has neither an answer nor a tests column; map one with "
            f"--map {name}.COLUMN=answer or =tests (columns: {', '.join(columns)})"
        )
    return fields


def _text(value):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, bool):
        return value  # refused by the schema: True is not an answer text
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    return value


def _tests(value):
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    return _text(value)


def _json(value) -> str:
    return json.dumps(value, default=str, sort_keys=True, ensure_ascii=False)


def canonicalize(
    raw: RawSource,
    require: str | None = None,
    alphabet: str | None = None,
    reference_is_text: bool = True,
    too_long: Callable[[str], str | None] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, int]]:
    """(valid canonical rows, quarantined rows, {problem kind: rows}) of one source.

    For the run's problem (`spotrl.problems.Problem`): `require` names the field its verifier needs
    ("answer" or "tests": its `reference_field`), and `alphabet` the characters its tokenizer can
    encode (prompt, and an answer checked as text unless `reference_is_text` is False). `too_long`
    says why a prompt does not fit the model's context, or None (`PromptLimit.checker`)."""
    spec, fields = raw.spec, resolve_mapping(raw)
    used = set(fields.values())
    rows, index = [], []
    for row, record in raw.records:
        source_id = _text(record.get(fields["id"])) if "id" in fields else str(row)
        rows.append(
            {
                "id": f"{spec.name}/{source_id}" if isinstance(source_id, str) and source_id.strip() else source_id,
                "prompt": _text(record.get(fields["prompt"])),
                "answer": _text(record.get(fields["answer"])) if "answer" in fields else None,
                "tests": _tests(record.get(fields["tests"])) if "tests" in fields else None,
                "source": spec.name,
                "metadata": _json({k: v for k, v in record.items() if k not in used}),
            }
        )
        index.append(row)
    frame = pd.DataFrame({c: pd.Series([r[c] for r in rows], dtype=object, index=index) for c in CANONICAL_COLUMNS})
    problems: dict[int, dict[str, str]] = {}
    for row, field, problem, _value in canonical_failures(frame):
        problems.setdefault(int(row), {}).setdefault(field, problem)
    for row, record in zip(index, rows):
        if row in problems:  # already quarantined: one reason is enough
            continue
        for field, problem in _unusable_for_problem(record, require, alphabet, reference_is_text, too_long):
            problems.setdefault(row, {}).setdefault(field, problem)
    raw_text = {}
    for row, field, problem, text in raw.errors:
        problems.setdefault(row, {})[field] = problem
        raw_text[row] = text
    records = dict(raw.records)
    bad, kinds = [], {}
    for row in sorted(problems):
        issues = problems[row]
        for field, problem in issues.items():
            kind = problem.split(" (")[0] if field == "*" else f"{field}: {problem.split(' (')[0]}"
            kinds[kind] = kinds.get(kind, 0) + 1
        reason = "; ".join(
            problem if field == "*" else f"field {field!r}: {problem}" for field, problem in issues.items()
        )
        record = _json(records[row]) if row in records else raw_text.get(row)
        record = record[:MAX_RECORD_CHARS] if record is not None else None
        bad.append(
            {
                "source": spec.name,
                "row": row,
                "fields": ",".join(f for f in issues if f != "*"),
                "reason": f"row {row}: {reason}",
                "record": record,
            }
        )
    good = frame.drop(index=[r for r in problems if r in frame.index]).reset_index(drop=True)
    quarantine = pd.DataFrame(bad, columns=list(QUARANTINE_COLUMNS))
    return good, quarantine, kinds


def _unusable_for_problem(
    record: dict, require: str | None, alphabet: str | None, reference_is_text: bool = True, too_long=None
):
    """(field, problem) of a row the run's problem cannot train on: no reference for its verifier, text its
    tokenizer cannot encode, or a prompt longer than the model's context leaves room for."""
    if require and not (isinstance(record[require], str) and record[require].strip()):
        yield require, "missing (the problem's verifier needs it)"
    unencodable = set()
    if alphabet:
        for field in ("prompt", "answer") if require == "answer" and reference_is_text else ("prompt",):
            value = record[field]
            if isinstance(value, str) and (outside := sorted(set(value) - set(alphabet))):
                shown = ", ".join(repr(c) for c in outside[:5]) + (", ..." if len(outside) > 5 else "")
                yield field, f"characters not in the problem's tokenizer alphabet ({shown})"
                unencodable.add(field)
    # one problem with the prompt is enough: an unencodable one is not counted
    if too_long is not None and "prompt" not in unencodable and (problem := too_long(record["prompt"])) is not None:
        yield "prompt", problem
