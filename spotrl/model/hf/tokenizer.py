"""A Hugging Face tokenizer (`tokenizer.json`) behind the interface of our CharTokenizer.

    tok = HFTokenizer.from_pretrained("path/to/Qwen2.5-0.5B-Instruct")   # local or fsspec URL
    prompt = tok.chat_prompt("What is 12+34?")     # the chat template, when the checkpoint has one
    tokens, valid = tok.encode_batch_left_padded([prompt])
    text = tok.decode(generated)                   # stops at the first stop token

It reads `tokenizer.json` (with the `tokenizers` library, installed with transformers: the `hf`
extra), the special tokens and the chat template from `tokenizer_config.json` (or
`chat_template.jinja`, which wins as it does in transformers), and the stop tokens from
`generation_config.json` when present. The chat template renders in the same sandboxed Jinja
environment as transformers' `apply_chat_template` (trim_blocks, lstrip_blocks, loop controls,
`tojson`, `raise_exception`, `strftime_now`).
"""

from __future__ import annotations

import functools
import json
import unicodedata
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import numpy as np

from spotrl.model.hf.config import CheckpointError, read_json
from spotrl.model.sequences import left_pad
from spotrl.storage.paths import as_path

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
GENERATION_CONFIG = "generation_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
TOKENIZER_FILES = (TOKENIZER_FILE, TOKENIZER_CONFIG, CHAT_TEMPLATE_FILE, SPECIAL_TOKENS_MAP, GENERATION_CONFIG)


def _token_text(value: Any) -> str | None:
    """A special token as written in tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, Mapping):
        return value.get("content")
    return value if isinstance(value, str) else None


def _as_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def compile_chat_template(source: str):
    """The template compiled the way transformers compiles it."""
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """`{% generation %}...{% endgeneration %}` renders its body (transformers tracks it for masks)."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


class HFTokenizer:
    """Same interface as CharTokenizer: encode / decode / encode_batch_left_padded, pad_id, eos_id, bos_id."""

    def __init__(
        self,
        tokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        unk_token: str | None = None,
        chat_template: str | None = None,
        stop_ids: Iterable[int] = (),
        source: str = "tokenizer",
    ):
        self._tok = tokenizer
        self.source = source
        self.bos_token, self.eos_token, self.pad_token, self.unk_token = bos_token, eos_token, pad_token, unk_token
        self.bos_id = self._id(bos_token)
        eos = self._id(eos_token)
        stops = tuple(dict.fromkeys(list(stop_ids) + ([eos] if eos is not None else [])))
        if not stops:
            raise CheckpointError(
                f"{source}: no eos_token in {TOKENIZER_CONFIG} and no eos_token_id in {GENERATION_CONFIG}"
            )
        self.stop_ids = stops  # every id that ends a completion; eos_id is the first
        self.eos_id = stops[0]
        pad = self._id(pad_token)
        self.pad_id = pad if pad is not None else self.eos_id
        self.chat_template = chat_template
        self._template = None
        # set by a run with model.chat_template: batch-encoded prompts are problem text, rendered as a user turn
        self.chat_prompts = False
        # what the post-processor puts around a single sequence (Llama 3: <|begin_of_text|> before it)
        probe_plain = self._tok.encode("a", add_special_tokens=False).ids
        probe = self._tok.encode("a", add_special_tokens=True).ids
        start = next(
            (i for i in range(len(probe) - len(probe_plain) + 1) if probe[i : i + len(probe_plain)] == probe_plain), 0
        )
        self.prefix_ids = tuple(probe[:start])

    def _id(self, token: str | None) -> int | None:
        if token is None:
            return None
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise CheckpointError(f"{self.source}: special token {token!r} is not in the vocabulary")
        return token_id

    @classmethod
    def from_pretrained(cls, path: str) -> HFTokenizer:
        """Tokenizer of a checkpoint directory (local or fsspec URL)."""
        try:
            from tokenizers import Tokenizer
        except ImportError as err:  # pragma: no cover - the hf extra installs it
            raise ImportError("HFTokenizer needs the `tokenizers` library: pip install 'spotrl[hf]'") from err
        root = as_path(path)
        tok_path = root / TOKENIZER_FILE
        if not tok_path.exists():
            raise CheckpointError(f"{tok_path}: missing file (only fast tokenizers, tokenizer.json, are supported)")
        with tok_path.open("r", encoding="utf-8") as f:
            text = f.read()
        try:
            tokenizer = Tokenizer.from_str(text)
        except Exception as err:  # noqa: BLE001 - the library raises plain Exceptions
            raise CheckpointError(f"{tok_path}: cannot be read by `tokenizers` ({err})") from None
        config = read_json(root / TOKENIZER_CONFIG, required=False) or {}
        special = read_json(root / SPECIAL_TOKENS_MAP, required=False) or {}
        generation = read_json(root / GENERATION_CONFIG, required=False) or {}

        def token(name):
            return _token_text(config.get(name)) or _token_text(special.get(name))

        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
            template = named.get("default")
        jinja_path = root / CHAT_TEMPLATE_FILE
        if jinja_path.exists():
            with jinja_path.open("r", encoding="utf-8") as f:
                template = f.read()
        return cls(
            tokenizer,
            bos_token=token("bos_token"),
            eos_token=token("eos_token"),
            pad_token=token("pad_token"),
            unk_token=token("unk_token"),
            chat_template=template,
            stop_ids=_as_ids(generation.get("eos_token_id")),
            source=str(path),
        )

    @classmethod
    def for_prompts(cls, path: str, chat_template: bool = True) -> HFTokenizer:
        """The tokenizer a run with `model.path` = `path` encodes prompts with: through the checkpoint's
        chat template when `chat_template` (`model.chat_template`) and it has one."""
        tokenizer = cls.from_pretrained(path)
        tokenizer.chat_prompts = chat_template and tokenizer.has_chat_template
        return tokenizer

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        """Token ids of `text` (special tokens written in it are recognised), without the post-processor's
        additions; `bos`/`eos` add the BOS (when the tokenizer has one) and the stop token."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return ([self.bos_id] if bos and self.bos_id is not None else []) + ids + ([self.eos_id] if eos else [])

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt as transformers' `tokenizer(text)` encodes it: with the prefix its post-processor
        adds (Llama's BOS), unless the text already starts with it (a chat-templated prompt)."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        prefix = list(self.prefix_ids)
        if prefix and ids[: len(prefix)] == prefix:
            return ids
        return prefix + ids

    def decode(self, ids, *, stop_at_eos: bool = True) -> str:
        ids = [int(i) for i in np.asarray(ids).reshape(-1).tolist()]
        if stop_at_eos:
            stops = set(self.stop_ids)
            ids = ids[: next((n for n, i in enumerate(ids) if i in stops), len(ids))]
        return self._tok.decode([i for i in ids if i != self.pad_id], skip_special_tokens=True)

    def encode_batch_left_padded(self, texts: list[str], length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Prompts (see encode_prompt; through `chat_prompt` when `chat_prompts` is set), left-padded to
        `length` (default: the longest): tokens and validity mask."""
        return left_pad([self._prompt_ids(t) for t in texts], texts, self.pad_id, length)

    def _rendered(self, text: str) -> str:
        return self.chat_prompt(text) if self.chat_prompts else text

    def _prompt_ids(self, text: str) -> list[int]:
        return self.encode_prompt(self._rendered(text))

    def prompt_tokens(self, text: str) -> int:
        """The tokens `text` takes as a prompt (what encode_batch_left_padded gives it, before padding)."""
        return len(self._prompt_ids(text))

    def min_prompt_tokens(self, text: str) -> int:
        """A lower bound on prompt_tokens(text) found without tokenizing it (megabytes take seconds to
        tokenize): for a byte-level BPE tokenizer (Qwen2, Llama 3) the rendered text's bytes over the
        most bytes a token holds, since every byte is in exactly one token; 0 for any other tokenizer."""
        if self._byte_level is None:
            return 0
        most, nfc = self._byte_level
        rendered = self._rendered(text)
        return -(-len((unicodedata.normalize("NFC", rendered) if nfc else rendered).encode()) // most)

    @functools.cached_property
    def _byte_level(self) -> tuple[int, bool] | None:
        """(the most bytes one token holds, whether the text is NFC-normalised first) when every byte of
        the text reaches exactly one token, else None."""
        from tokenizers import pre_tokenizers

        spec = json.loads(self._tok.to_str())
        pre = spec.get("pre_tokenizer") or {}
        steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
        # ByteLevel maps each byte to one vocabulary character; a Split that removes nothing only cuts
        keeps_bytes = all(
            s.get("type") == "ByteLevel" or (s.get("type") == "Split" and s.get("behavior") != "Removed") for s in steps
        )
        # with NFC the model sees the NFC text's bytes (normalising the pieces around a special token
        # apart can only leave more of them: composing across the cut is all it skips)
        normalizer = (spec.get("normalizer") or {}).get("type")
        vocab = self._tok.get_vocab(with_added_tokens=False)
        added = list(self._tok.get_added_tokens_decoder().values())
        if not (
            spec.get("model", {}).get("type") == "BPE"
            and keeps_bytes
            and any(s.get("type") == "ByteLevel" for s in steps)
            and normalizer in (None, "NFC")
            and vocab.keys() >= set(pre_tokenizers.ByteLevel.alphabet())  # no byte dropped as unknown
            and not any(t.lstrip or t.rstrip for t in added)  # a special token that swallows whitespace
        ):
            return None
        # a vocabulary entry has one character per byte; a special token matches its own text
        return max([len(t) for t in vocab] + [len(t.content.encode()) for t in added]), normalizer == "NFC"

    # chat

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template)

    def apply_chat_template(
        self,
        messages: list[dict],
        *,
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        tools: list[dict] | None = None,
        **kwargs,
    ) -> str | list[int]:
        """The conversation rendered by the checkpoint's chat template (as transformers renders it)."""
        if not self.chat_template:
            raise CheckpointError(f"{self.source}: no chat template (in {TOKENIZER_CONFIG} or {CHAT_TEMPLATE_FILE})")
        if self._template is None:
            self._template = compile_chat_template(self.chat_template)
        context = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": self.pad_token,
            "unk_token": self.unk_token,
            **kwargs,
        }
        text = self._template.render(
            messages=[dict(m) for m in messages],
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **{k: v for k, v in context.items() if v is not None or k in kwargs},
        )
        return self.encode(text) if tokenize else text

    def chat_prompt(self, user: str, *, system: str | None = None) -> str:
        """A problem's text prompt as the model expects it: through the chat template when there is one."""
        if not self.chat_template:
            return user
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        return self.apply_chat_template(messages, add_generation_prompt=True)
