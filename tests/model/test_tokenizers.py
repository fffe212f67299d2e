import numpy as np
import pytest

from spotrl.model.tokenizers import CharTokenizer


def test_roundtrip_and_special_ids():
    tok = CharTokenizer()
    ids = tok.encode("12+3=", bos=True, eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids) == "12+3="
    assert tok.decode(tok.encode("753") + [tok.eos_id] + tok.encode("9")) == "753"  # stops at EOS
    assert tok.vocab_size == 15


def test_left_padding():
    tok = CharTokenizer()
    tokens, valid = tok.encode_batch_left_padded(["1+2=", "10+20="])
    assert tokens.shape == (2, 7)
    np.testing.assert_array_equal(valid[0], [False, False, True, True, True, True, True])
    assert tokens[0, 0] == tok.pad_id and tokens[0, 2] == tok.bos_id


def test_unknown_character_is_named():
    with pytest.raises(ValueError, match="'x'"):
        CharTokenizer().encode("1x2")


def test_ids_beyond_alphabet_decode_to_replacement():
    tok = CharTokenizer()
    assert tok.decode([tok.vocab_size]) == "\ufffd"
