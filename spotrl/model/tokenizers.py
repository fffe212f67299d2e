"""Character tokenizer for the built-in tasks: one token per character of a fixed alphabet."""

from __future__ import annotations

import numpy as np

from spotrl.model.sequences import left_pad

PAD, EOS, BOS = "<pad>", "<eos>", "<bos>"


class CharTokenizer:
    """ids 0, 1, 2 are pad, eos and bos; then one id per character of `alphabet`."""

    def __init__(self, alphabet: str = "0123456789+="):
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

    def encode_batch_left_padded(self, texts: list[str], length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Prompts with BOS, left-padded to `length` (default: the longest): tokens and validity mask."""
        encoded = [self.encode(t, bos=True) for t in texts]
        return left_pad(encoded, texts, self.pad_id, length)
