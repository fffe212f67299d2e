"""HFTokenizer against transformers' AutoTokenizer on tokenizers built here: the same ids, the same
chat template text and ids, stop tokens from generation_config.json, the CharTokenizer interface, and
a prompt's token count with the cheap lower bound curation checks a prompt's length with first."""

import json

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

from hf_fixtures import byte_level_bpe, write_qwen_tokenizer  # noqa: E402
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, processors  # noqa: E402

from spotrl.model.hf.config import CheckpointError  # noqa: E402
from spotrl.model.hf.tokenizer import HFTokenizer  # noqa: E402

# Llama 3's shape: BOS written by the template, header tokens, trim_blocks-sensitive whitespace
LLAMA3 = """{{- bos_token }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""  # noqa: E501 - the template verbatim

TEXTS = ["What is 12 + 34?", "  leading spaces and\nnew lines\n", "Grüße 東京 🙂", "<|im_end|> inside text", ""]
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 12 + 34?"},
    {"role": "assistant", "content": "46"},
    {"role": "user", "content": "And 1 + 1?"},
]


@pytest.fixture(scope="module")
def qwen_like(tmp_path_factory):
    """ChatML specials, no BOS, pad <|endoftext|>, two stop ids in generation_config.json."""
    path = tmp_path_factory.mktemp("qwen_tok")
    write_qwen_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def llama_like(tmp_path_factory):
    """A BOS added by the post-processor, the chat template in chat_template.jinja, no pad token."""
    path = tmp_path_factory.mktemp("llama_tok")
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok = byte_level_bpe(specials)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A",
                pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                special_tokens=[("<|begin_of_text|>", bos)],
            ),
        ]
    )
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": {
                    "__type": "AddedToken",
                    "content": "<|begin_of_text|>",
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "single_word": False,
                    "special": True,
                },
                "eos_token": "<|eot_id|>",
                "model_max_length": 1024,
                "clean_up_tokenization_spaces": False,
            }
        )
    )
    (path / "chat_template.jinja").write_text(LLAMA3)
    ids = [tok.token_to_id(t) for t in ["<|end_of_text|>", "<|eot_id|>"]]
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": bos, "eos_token_id": ids}))
    return path


def _hf_chat_ids(auto, messages):
    out = auto.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


@pytest.mark.parametrize("which", ["qwen_like", "llama_like"])
def test_same_ids_and_chat_template_as_transformers(which, request):
    path = request.getfixturevalue(which)
    ours = HFTokenizer.from_pretrained(str(path))
    auto = transformers.AutoTokenizer.from_pretrained(path)
    for text in TEXTS:
        assert ours.encode(text) == auto.encode(text, add_special_tokens=False), text
        assert ours.encode_prompt(text) == auto(text)["input_ids"], text
        ids = auto.encode(text, add_special_tokens=False)
        assert ours.decode(ids, stop_at_eos=False) == auto.decode(ids, skip_special_tokens=True)
    for messages in (CHAT, CHAT[1:2]):
        text = ours.apply_chat_template(messages, add_generation_prompt=True)
        assert text == auto.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        # a templated prompt is not given a second BOS
        assert ours.encode_prompt(text) == _hf_chat_ids(auto, messages)
    assert ours.apply_chat_template(CHAT, add_generation_prompt=False) == auto.apply_chat_template(
        CHAT, add_generation_prompt=False, tokenize=False
    )


def test_special_and_stop_tokens(qwen_like, llama_like):
    qwen = HFTokenizer.from_pretrained(str(qwen_like))
    end, im_end = qwen.encode("<|endoftext|>")[0], qwen.encode("<|im_end|>")[0]
    assert qwen.bos_id is None and qwen.prefix_ids == ()
    assert qwen.stop_ids == (im_end, end) and qwen.eos_id == im_end and qwen.pad_id == end
    assert qwen.encode("hi", bos=True, eos=True) == qwen.encode("hi") + [im_end]  # no BOS to add
    llama = HFTokenizer.from_pretrained(str(llama_like))
    bos, eot = llama.encode("<|begin_of_text|>")[0], llama.encode("<|eot_id|>")[0]
    assert llama.bos_id == bos and llama.prefix_ids == (bos,)
    assert llama.eos_id == llama.encode("<|end_of_text|>")[0] and eot in llama.stop_ids
    assert llama.pad_id == llama.eos_id  # no pad token: padding is masked anyway
    assert llama.chat_prompt("Hi") == llama.apply_chat_template([{"role": "user", "content": "Hi"}])


def test_char_tokenizer_interface(qwen_like):
    """encode_batch_left_padded / decode behave as CharTokenizer's do, stopping at any stop id."""
    tok = HFTokenizer.from_pretrained(str(qwen_like))
    prompts = ["What is 12 + 34?", "Hi"]
    tokens, valid = tok.encode_batch_left_padded(prompts)
    assert tokens.dtype == np.int32 and tokens.shape == valid.shape
    for row, text in enumerate(prompts):
        assert tokens[row][valid[row]].tolist() == tok.encode_prompt(text)
        assert (tokens[row][~valid[row]] == tok.pad_id).all()
    with pytest.raises(ValueError, match="more than 2"):
        tok.encode_batch_left_padded(prompts, length=2)
    answer = tok.encode(" The answer is 46.")
    generated = np.array(answer + [tok.stop_ids[1], *tok.encode("junk")])
    assert tok.decode(generated) == " The answer is 46."
    assert tok.decode(generated, stop_at_eos=False) == " The answer is 46.junk"
    assert tok.vocab_size >= 300


def test_missing_tokenizer_file_is_named(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'tokenizer.json'}: missing file"):
        HFTokenizer.from_pretrained(str(tmp_path))
    tok = Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(CheckpointError, match="no eos_token"):
        HFTokenizer.from_pretrained(str(tmp_path))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(CheckpointError, match="special token '</s>' is not in the vocabulary"):
        HFTokenizer.from_pretrained(str(tmp_path))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "a"}))
    with pytest.raises(CheckpointError, match="no chat template"):
        HFTokenizer.from_pretrained(str(tmp_path)).apply_chat_template([{"role": "user", "content": "x"}])


# text whose byte count a tokenizer could shrink: whitespace runs, combining marks NFC composes
# (e + U+0301, Hangul jamo), multi-byte characters, special tokens written in the text
LENGTH_TEXTS = TEXTS + [" " * 300, "\n\n\t " * 40, "e\u0301" * 50, "\u1100\u1161\u11a8" * 30, "🙂東京" * 40]


@pytest.fixture(scope="module")
def nfc_like(tmp_path_factory):
    """The Qwen-like tokenizer with Qwen2's NFC normalizer."""
    path = tmp_path_factory.mktemp("nfc_tok")
    tok = write_qwen_tokenizer(path)
    tok.normalizer = normalizers.NFC()
    tok.save(str(path / "tokenizer.json"))
    return path


@pytest.mark.parametrize("which", ["qwen_like", "llama_like", "nfc_like"])
@pytest.mark.parametrize("chat", [True, False])
def test_prompt_tokens_counts_the_encoded_prompt_and_min_prompt_tokens_never_exceeds_it(which, chat, request):
    tok = HFTokenizer.for_prompts(str(request.getfixturevalue(which)), chat_template=chat)
    assert tok.chat_prompts == chat
    for text in LENGTH_TEXTS:
        count = tok.prompt_tokens(text)
        assert count == int(tok.encode_batch_left_padded([text])[1].sum()), text
        assert tok.min_prompt_tokens(text) <= count, text
    # byte-level BPE: the bound grows with the text (no token of these vocabularies is longer than
    # "<|start_header_id|>", 19 bytes)
    assert tok.min_prompt_tokens("The quick brown fox. " * 200) >= 4200 / 19


def test_min_prompt_tokens_is_zero_where_text_can_vanish(tmp_path):
    """Tokenizers that drop whitespace, or a special token that swallows it: no byte bound holds."""
    tok = Tokenizer(models.WordLevel({"a": 0, "<unk>": 1, "</s>": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    words = HFTokenizer.from_pretrained(str(tmp_path))
    assert words.prompt_tokens(" " * 100 + "a") == 1 and words.min_prompt_tokens(" " * 100 + "a") == 0

    swallowing = byte_level_bpe([])
    swallowing.add_special_tokens([AddedToken("</s>", rstrip=True)])
    swallowing.save(str(tmp_path / "tokenizer.json"))
    tok = HFTokenizer.from_pretrained(str(tmp_path))
    assert tok.min_prompt_tokens("</s>" + " " * 100) == 0 and tok.prompt_tokens("</s>" + " " * 100) == 1
