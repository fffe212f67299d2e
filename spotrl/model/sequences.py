"""Batch layout shared by sampling, supervised training and RL updates.

A row is a prompt left-padded to P tokens followed by a completion right-padded to N tokens:
    [pad pad BOS p1 .. pk | c1 c2 .. EOS pad pad]
`valid` marks real prompt tokens and completion tokens up to and including the stop token.
"""

from __future__ import annotations

import numpy as np


def completion_mask(lengths: np.ndarray, width: int) -> np.ndarray:
    return np.arange(width)[None, :] < np.asarray(lengths)[:, None]


def join(prompt_tokens, prompt_valid, completion_tokens, completion_lengths) -> tuple[np.ndarray, np.ndarray]:
    """Tokens [B, P+N] and valid mask [B, P+N] of prompts followed by their completions."""
    completion_tokens = np.asarray(completion_tokens)
    tokens = np.concatenate([np.asarray(prompt_tokens), completion_tokens], axis=1).astype(np.int32)
    valid = np.concatenate(
        [np.asarray(prompt_valid, bool), completion_mask(completion_lengths, completion_tokens.shape[1])], axis=1
    )
    return tokens, valid


def encode_completions(tokenizer, texts: list[str], width: int) -> tuple[np.ndarray, np.ndarray]:
    """Target completions (text + EOS), right-padded to `width`: tokens and lengths."""
    tokens = np.full((len(texts), width), tokenizer.pad_id, np.int32)
    lengths = np.zeros(len(texts), np.int32)
    for row, text in enumerate(texts):
        ids = tokenizer.encode(text, eos=True)
        if len(ids) > width:
            raise ValueError(f"completion {text!r} needs {len(ids)} tokens, more than max_new_tokens={width}")
        tokens[row, : len(ids)] = ids
        lengths[row] = len(ids)
    return tokens, lengths


def left_pad(encoded: list[list[int]], texts: list[str], pad_id: int, length: int | None = None):
    """Token id lists left-padded to `length` (default: the longest): tokens [B, L] and validity mask."""
    length = length or max(map(len, encoded))
    tokens = np.full((len(encoded), length), pad_id, np.int32)
    valid = np.zeros((len(encoded), length), bool)
    for row, ids in enumerate(encoded):
        if len(ids) > length:
            raise ValueError(f"prompt {texts[row]!r} has {len(ids)} tokens, more than {length}")
        tokens[row, length - len(ids) :] = ids
        valid[row, length - len(ids) :] = True
    return tokens, valid
