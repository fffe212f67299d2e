"""Character tokenizers for the built-in model: one token per character of a fixed alphabet.

A problem (`spotrl.problems`) chooses the alphabet and the class; the alphabets it picks from are here.
"""

from __future__ import annotations

import string

import numpy as np

from spotrl.model.sequences import left_pad

PAD, EOS, BOS = "<pad>", "<eos>", "<bos>"

DIGITS_ALPHABET = "0123456789+="  # `a+b=` and its answer
# Code and math text: printable ASCII with newline and tab (no \r, \v, \f: they carry no meaning
# in a prompt and would only be a way to write the same text twice).
TEXT_ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n\t"
PROMPT_BUCKET = 128  # BucketedCharTokenizer left-pads prompts to a multiple of this many tokens


class CharTokenizer:
    """ids 0, 1, 2 are pad, eos and bos; then one id per character of `alphabet`."""

    def __init__(self, alphabet: str = DIGITS_ALPHABET):
        if len(set(alphabet)) != len(alphabet):
            raise ValueError(f"alphabet has repeated characters: {alphabet!r}")
        self.alphabet = alphabet
        self.pad_id, self.eos_id, self.bos_id = 0, 1, 2
        self.stop_ids = (self.eos_id,)  # as HFTokenizer: every id that ends a completion
        self._ids = {c: i + 3 for i, c in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet) + 3

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        try:
            ids = [self._ids[c] for c in text]
        except KeyError as err:
            raise ValueError(f"character {err.args[0]!r} of {text!r} is not in the tokenizer's alphabet") from None
        return ([self.bos_id] if bos else []) + ids + ([self.eos_id] if eos else [])

    def decode(self, ids, *, stop_at_eos: bool = True) -> str:
        out = []
        for i in np.asarray(ids).tolist():
            if i == self.eos_id and stop_at_eos:
                break
            if i >= 3:
                # ids past the alphabet exist when the model's vocabulary is padded; never a digit
                out.append(self.alphabet[i - 3] if i - 3 < len(self.alphabet) else "\ufffd")
        return "".join(out)

    def prompt_tokens(self, text: str) -> int:
        """The tokens `text` takes as a prompt (BOS and one per character; a character outside the
        alphabet counts too, encoding it would fail)."""
        return len(text) + 1

    def encode_batch_left_padded(self, texts: list[str], length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Prompts with BOS, left-padded to `length` (default: the longest): tokens and validity mask."""
        encoded = [self.encode(t, bos=True) for t in texts]
        return left_pad(encoded, texts, self.pad_id, length)


class BucketedCharTokenizer(CharTokenizer):
    """Text prompts vary in length, and every new padded length is a new shape to jit-compile
    (sampler, scoring, train step): a few lengths instead of one per batch."""

    def encode_batch_left_padded(self, texts, length=None):
        if length is None:
            longest = max(len(t) for t in texts) + 1  # + BOS
            length = -(-longest // PROMPT_BUCKET) * PROMPT_BUCKET
        return super().encode_batch_left_padded(texts, length)
