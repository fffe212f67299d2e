"""The canonical prompt-row schema, checked with pandera on every dataset that enters a run."""

from __future__ import annotations

import datasets
import pandas as pd
import pandera.pandas as pa

PROMPT_SCHEMA = pa.DataFrameSchema(
    {
        "id": pa.Column(str, unique=True, checks=pa.Check.str_length(min_value=1)),
        "prompt": pa.Column(str, checks=pa.Check.str_length(min_value=1)),
        "answer": pa.Column(str, checks=pa.Check.str_length(min_value=1)),
        "source": pa.Column(str, checks=pa.Check.str_length(min_value=1)),
        # the completion a warm start teaches, where the problem has one (see spotrl/problems/spec.py)
        "target": pa.Column(str, nullable=True, required=False),
    },
    strict=True,
    coerce=False,
)


class SchemaError(ValueError):
    """A dataset failed the prompt schema; the message names the dataset, the rows and the fields."""


def validate_rows(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    try:
        return PROMPT_SCHEMA.validate(frame, lazy=True)
    except pa.errors.SchemaErrors as err:
        cases = err.failure_cases
        lines = [
            f"  row {row}: field {col!r} failed {check} (value {value!r})"
            for row, col, check, value in cases[["index", "column", "check", "failure_case"]]
            .head(20)
            .itertuples(index=False)
        ]
        raise SchemaError(f"dataset {name!r}: {len(cases)} schema failure(s)\n" + "\n".join(lines)) from None


def to_dataset(frame: pd.DataFrame, name: str) -> datasets.Dataset:
    """Validate and wrap rows as a `datasets.Dataset`."""
    return datasets.Dataset.from_pandas(validate_rows(frame, name), preserve_index=False)


# ------------------------------------------------------------------------------------------------
# The canonical row of curated datasets (issue 6): every source is mapped into these columns.
#   id        unique, "<source>/<id in the source or row number>"
#   prompt    non-empty text
#   answer    the reference answer (math/exact problems), or missing
#   tests     Python assert statements (code problems), or missing; at least one of answer and tests
#   source    the source's name
#   metadata  a JSON object (string) with the source's other columns

CANONICAL_COLUMNS = ("id", "prompt", "answer", "tests", "source", "metadata")


def _present(values: pd.Series) -> pd.Series:
    return values.map(lambda v: isinstance(v, str) and v.strip() != "")


def _tests_parse(values: pd.Series) -> pd.Series:
    import ast

    def ok(v) -> bool:
        if not isinstance(v, str):
            return False
        try:
            tree = ast.parse(v)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
        return any(isinstance(node, ast.Assert) for node in tree.body)

    return values.map(ok)


def _json_object(values: pd.Series) -> pd.Series:
    import json

    def ok(v) -> bool:
        try:
            return isinstance(v, str) and isinstance(json.loads(v), dict)
        except ValueError:
            return False

    return values.map(ok)


NONEMPTY = "empty or not text"
CANONICAL_SCHEMA = pa.DataFrameSchema(
    {
        "id": pa.Column(
            None, checks=pa.Check(_present, error=NONEMPTY), unique=True, report_duplicates="exclude_first"
        ),
        "prompt": pa.Column(None, checks=pa.Check(_present, error=NONEMPTY)),
        "answer": pa.Column(None, nullable=True, checks=pa.Check(_present, error=NONEMPTY)),
        "tests": pa.Column(
            None,
            nullable=True,
            checks=[
                pa.Check(_present, error=NONEMPTY),
                pa.Check(_tests_parse, error="not Python with an assert statement"),
            ],
        ),
        "source": pa.Column(None, checks=pa.Check(_present, error=NONEMPTY)),
        "metadata": pa.Column(None, checks=pa.Check(_json_object, error="not a JSON object")),
    },
    checks=[
        pa.Check(
            lambda df: _present(df["answer"]) | _present(df["tests"]), error="missing (a row needs an answer or tests)"
        )
    ],
    strict=True,
    coerce=False,
)


def canonical_failures(frame: pd.DataFrame) -> list[tuple[object, str, str, object]]:
    """(index, field, problem, value) for every canonical-schema failure of `frame` (empty when valid).
    A row-level failure (neither answer nor tests) is reported with field 'answer/tests'."""
    try:
        CANONICAL_SCHEMA.validate(frame, lazy=True)
    except pa.errors.SchemaErrors as err:
        out = []
        for ctx, col, check, value, index in err.failure_cases[
            ["schema_context", "column", "check", "failure_case", "index"]
        ].itertuples(index=False):
            if ctx == "DataFrameSchema" and check not in ("column_in_schema", "column_in_dataframe"):
                col = "answer/tests"
            elif check == "field_uniqueness":
                check = "duplicate id"
            elif check == "not_nullable":
                check = "missing"
            out.append((index, str(col), str(check), value))
        return out
    return []
