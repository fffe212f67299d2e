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
