"""A tokenizer small enough to read by eye, for the sampler and evaluation tests."""

import numpy as np


class DigitTokenizer:
    """Characters '0'..'9' are ids 2..11; 1 is BOS and the stop token, 0 the pad."""

    pad_id = 0

    def encode_batch_left_padded(self, texts, length=None):
        encoded = [[1] + [2 + int(c) for c in t] for t in texts]
        width = length or max(map(len, encoded))
        tokens = np.zeros((len(texts), width), np.int32)
        for i, e in enumerate(encoded):
            tokens[i, width - len(e) :] = e
        return tokens, tokens != 0

    def decode(self, tokens):
        return "".join(str(int(t) - 2) for t in tokens if t >= 2)
