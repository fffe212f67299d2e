"""Decontamination: drop training prompts that share a word n-gram with the held-out evaluation set.

Texts are compared as word tokens (NFKC, case-folded, punctuation dropped). A prompt of at least
n tokens is contaminated when one of its n-grams occurs in an evaluation prompt, or when it
contains a whole evaluation prompt shorter than n tokens. A prompt shorter than n tokens is
contaminated when it occurs, whole and contiguous, in an evaluation prompt.
"""

from __future__ import annotations

import re
import unicodedata

import pandas as pd

from spotrl.curation.dedup import REMOVED_COLUMNS

_WORD = re.compile(r"\w+")


def words(text: str) -> tuple[str, ...]:
    return tuple(_WORD.findall(unicodedata.normalize("NFKC", text).casefold()))


def _grams(tokens: tuple[str, ...], n: int):
    return (tokens[i : i + n] for i in range(len(tokens) - n + 1))


class NgramIndex:
    """The n-grams of a set of evaluation texts."""

    def __init__(self, texts, n: int = 13):
        if n < 1:
            raise ValueError(f"n-gram size must be at least 1, got {n}")
        self.n = n
        self.texts = [words(t) for t in texts]
        self.grams: set[tuple[str, ...]] = set()
        self.short: set[tuple[str, ...]] = set()
        for tokens in self.texts:
            if len(tokens) >= n:
                self.grams.update(_grams(tokens, n))
            elif tokens:
                self.short.add(tokens)
        self.short_lengths = sorted({len(t) for t in self.short})
        self._k_grams: dict[int, set] = {}

    def _grams_of_length(self, k: int) -> set:
        if k not in self._k_grams:
            self._k_grams[k] = {g for tokens in self.texts for g in _grams(tokens, k)}
        return self._k_grams[k]

    def match(self, text: str) -> str | None:
        """The overlapping words when `text` is contaminated, else None."""
        tokens = words(text)
        if not tokens:
            return None
        if len(tokens) >= self.n:
            for gram in _grams(tokens, self.n):
                if gram in self.grams:
                    return " ".join(gram)
            for k in self.short_lengths:
                for gram in _grams(tokens, k):
                    if gram in self.short:
                        return " ".join(gram)
            return None
        return " ".join(tokens) if tokens in self._grams_of_length(len(tokens)) else None


def decontaminate(
    frame: pd.DataFrame, index: NgramIndex, reason: str = "contaminated"
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows kept, rows removed with the overlapping words as detail)."""
    keep, removed = [], []
    for i, (row_id, prompt, source) in enumerate(zip(frame["id"], frame["prompt"], frame["source"])):
        hit = index.match(prompt)
        if hit is None:
            keep.append(i)
        else:
            removed.append({"id": row_id, "source": source, "reason": reason, "detail": hit})
    return frame.iloc[keep].reset_index(drop=True), pd.DataFrame(removed, columns=REMOVED_COLUMNS)
