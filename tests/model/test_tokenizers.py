import numpy as np
import pytest

from spotrl.model.tokenizers import BucketedCharTokenizer, CharTokenizer


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


@pytest.mark.parametrize("cls", [CharTokenizer, BucketedCharTokenizer])
def test_prompt_tokens_is_what_a_prompt_encodes_to_before_padding(cls):
    tok = cls()
    for text in ["1+2=", "", "0123456789" * 20]:
        assert tok.prompt_tokens(text) == int(tok.encode_batch_left_padded([text])[1].sum())
    assert tok.prompt_tokens("x" * 1000) == 1001  # counted, not encoded: the alphabet is curation's check
