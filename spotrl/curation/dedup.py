"""Duplicate prompts: exact first, then after normalisation (Unicode NFKC, case, whitespace).

The first occurrence wins (sources in the order given, rows in source order); each removed row
names the id it duplicates.
"""

from __future__ import annotations

import re
import unicodedata

import pandas as pd

_TOKEN = re.compile(r"\w+|[^\w\s]")
REMOVED_COLUMNS = ["id", "source", "reason", "detail"]  # rows removed on purpose (written to removed.parquet)


def normalise_prompt(text: str) -> str:
    """Case-folded, NFKC, one space between tokens: 'What is 2+2 ?' == 'what  is 2 + 2?'."""
    return " ".join(_TOKEN.findall(unicodedata.normalize("NFKC", text).casefold()))


def drop_duplicates(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, int]]:
    """(kept rows, removed rows with reason and duplicate_of, {"exact": n, "normalised": m})."""
    first_exact: dict[str, str] = {}
    first_norm: dict[str, str] = {}
    keep, removed = [], []
    counts = {"exact": 0, "normalised": 0}
    for i, (row_id, prompt, source) in enumerate(zip(frame["id"], frame["prompt"], frame["source"])):
        if prompt in first_exact:
            counts["exact"] += 1
            removed.append({"id": row_id, "source": source, "reason": "duplicate", "detail": first_exact[prompt]})
            continue
        key = normalise_prompt(prompt)
        if key in first_norm:
            counts["normalised"] += 1
            removed.append({"id": row_id, "source": source, "reason": "near_duplicate", "detail": first_norm[key]})
            first_exact[prompt] = first_norm[key]
            continue
        first_exact[prompt] = row_id
        first_norm[key] = row_id
        keep.append(i)
    return frame.iloc[keep].reset_index(drop=True), pd.DataFrame(removed, columns=REMOVED_COLUMNS), counts
