"""The longest prompt a run can sample from: the model's context less the completion's tokens.

A rollout feeds the prompt's tokens and then generates up to `rollout.max_new_tokens` more, all of
them positions of the model's context (`model.max_position_embeddings`). Nothing at rollout time
checks the sum: a longer prompt is sampled past the context the model was trained for, and its
batch is padded to it (a 10 MB prompt asks for a KV cache of millions of positions). So curation
quarantines a row whose prompt needs more tokens than the context leaves, counted by the tokenizer
the rollout encodes it with (the checkpoint's tokenizer.json through its chat template, or the
built-in model's one token per character), and names both numbers in the reason.

Counting is cheap for the character tokenizer; a checkpoint's tokenizer takes seconds per megabyte,
so a prompt its lower bound (`HFTokenizer.min_prompt_tokens`) already puts over the limit is not
tokenized, and its reason says "at least".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from spotrl.model.tokenizers import CharTokenizer


@dataclass(frozen=True)
class PromptLimit:
    tokens: int  # the most tokens a prompt may take
    why: str  # where `tokens` comes from, for the quarantine reason
    tokenizer: str | None = None  # checkpoint directory whose tokenizer.json counts; None: one per character
    chat_template: bool = True  # prompts go through the checkpoint's chat template (model.chat_template)

    @classmethod
    def of_run(cls, config) -> PromptLimit:
        """What a run config's model and rollout leave for a prompt."""
        context, new = config.model.max_position_embeddings, config.rollout.max_new_tokens
        return cls(
            context - new,
            f"model.max_position_embeddings {context:,} minus rollout.max_new_tokens {new:,}",
            config.model.path,
            config.model.chat_template,
        )

    def checker(self) -> Callable[[str], str | None]:
        """prompt -> why it is too long, or None (the tokenizer is loaded once, here)."""
        if self.tokenizer is None:
            tokenizer, lower_bound = CharTokenizer(), None  # counting is the cheap bound
        else:
            from spotrl.model.hf.tokenizer import HFTokenizer

            tokenizer = HFTokenizer.for_prompts(self.tokenizer, self.chat_template)
            lower_bound = tokenizer.min_prompt_tokens

        def too_long(prompt: str) -> str | None:
            if lower_bound is not None and (least := lower_bound(prompt)) > self.tokens:
                return self._reason(f"at least {least:,}")
            count = tokenizer.prompt_tokens(prompt)
            return self._reason(f"{count:,}") if count > self.tokens else None

        return too_long

    def _reason(self, count: str) -> str:
        return f"too long for the model's context ({count} tokens; it allows {self.tokens:,}: {self.why})"
