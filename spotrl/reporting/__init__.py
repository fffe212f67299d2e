"""Curves of a run: PNG plots and one self-contained HTML page (plots.py), TensorBoard scalars (tensorboard.py).

Both read the run directory's JSON-lines records (RUN/metrics.jsonl, RUN/eval.jsonl) straight from
storage, local or gs:// (spotrl.storage.records), so this package sits below spotrl.flows (the train
flow calls it) and imports only spotrl.storage. The helpers here are the shared, pure part: flatten
records.
"""

from __future__ import annotations

import math


def numeric(value) -> float | None:
    """The value as a float when it is a number (a bool is not one), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def flatten(record: dict, prefix: str = "") -> dict[str, float]:
    """The numeric leaves of a nested record, keys joined with "/": {"timing": {"a": 1}} -> {"timing/a": 1.0}.

    Strings, lists, bools and None are left out.
    """
    out: dict[str, float] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}/"))
            continue
        number = numeric(value)
        if number is not None:
            out[f"{prefix}{key}"] = number
    return out


def step_of(record: dict) -> int | None:
    """The record's iteration as an int, or None when it has none usable."""
    step = numeric(record.get("iteration"))
    if step is None or not math.isfinite(step):
        return None
    return int(step)
