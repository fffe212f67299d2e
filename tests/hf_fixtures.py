"""Tiny Hugging Face parts that tests build here (nothing can be downloaded): a byte-level BPE
tokenizer with ChatML specials, randomised transformers models, and transformers' logits."""

import json

import numpy as np

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is 12 + 34? The answer is 46.",
    "Reinforcement learning of language models on preemptible accelerators.",
    "Grüße aus Zürich: naïve café, 東京 and emoji 🙂 too.",
] * 20

# Qwen2.5's template, reduced to its message loop
CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# Qwen2's pre-tokenizer split (one token per digit, among others). transformers 5 builds a Qwen2
# checkpoint's tokenizer with it whatever tokenizer.json says, so a Qwen-like tokenizer.json must too.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def byte_level_bpe(specials, vocab_size=300, split=None):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if split is not None:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def write_qwen_tokenizer(path):
    """Qwen-like tokenizer files in `path`: ChatML specials, no BOS, pad <|endoftext|>, and two stop
    ids (<|im_end|>, <|endoftext|>) in generation_config.json. Returns the tokenizers.Tokenizer."""
    tok = byte_level_bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], split=QWEN2_SPLIT)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "chat_template": CHATML,
                "model_max_length": 1024,
                "clean_up_tokenization_spaces": False,
            }
        )
    )
    ids = {t: tok.token_to_id(t) for t in ["<|endoftext|>", "<|im_end|>"]}
    (path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]], "pad_token_id": ids["<|endoftext|>"]})
    )
    return tok


def randomize(model, seed):
    """Spread every parameter (biases and norms included, which transformers initialises to 0 / 1)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.1 * noise if "norm" in name else 0.15 * noise)
    return model.eval()


def torch_logits(model, tokens, valid=None):
    """transformers' logits of left-padded rows, with our positions (0 at the first real token)."""
    import torch

    valid = np.ones(tokens.shape, bool) if valid is None else np.asarray(valid, bool)
    positions = np.maximum(np.cumsum(valid, axis=-1) - 1, 0)
    with torch.no_grad():
        return model(
            input_ids=torch.tensor(np.asarray(tokens), dtype=torch.long),
            attention_mask=torch.tensor(valid, dtype=torch.long),
            position_ids=torch.tensor(positions, dtype=torch.long),
        ).logits.numpy()
