"""What a task name decides: the tokenizer's alphabet, the field its verifier checks, the built-in
prompt generator, and the completions a supervised warm start trains on.

The run's prompt rows (RUN/data, `schema.PROMPT_SCHEMA`) carry in `answer` the reference the task's
verifier receives: the answer for `arithmetic` and `math`, the tests (Python asserts) for `code`.
`target`, when present, is the completion a warm start teaches (the reference solution of a built-in
code problem); rows without one are not used by the warm start.
"""

from __future__ import annotations

import json
import string

import pandas as pd

from spotrl.model.tokenizers import CharTokenizer

TASKS = ("arithmetic", "math", "code")
ARITHMETIC_ALPHABET = "0123456789+="
# Code and math text: printable ASCII with newline and tab (no \r, \v, \f: they carry no meaning
# in a prompt and would only be a way to write the same text twice).
TEXT_ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n\t"
REFERENCE_FIELD = {"arithmetic": "answer", "math": "answer", "code": "tests"}


def alphabet(task: str) -> str:
    return ARITHMETIC_ALPHABET if task == "arithmetic" else TEXT_ALPHABET


PROMPT_BUCKET = 128  # text prompts are left-padded to a multiple of this many tokens


class BucketedCharTokenizer(CharTokenizer):
    """Text prompts vary in length, and every new padded length is a new shape to jit-compile
    (sampler, scoring, train step): a few lengths instead of one per batch."""

    def encode_batch_left_padded(self, texts, length=None):
        if length is None:
            longest = max(len(t) for t in texts) + 1  # + BOS
            length = -(-longest // PROMPT_BUCKET) * PROMPT_BUCKET
        return super().encode_batch_left_padded(texts, length)


def tokenizer(task: str) -> CharTokenizer:
    if task == "arithmetic":  # prompts of one length: nothing to bucket
        return CharTokenizer(alphabet(task))
    return BucketedCharTokenizer(alphabet(task))


def _target(task: str, answer, metadata) -> str | None:
    if task == "arithmetic":
        from spotrl.problems.arithmetic import completion_text

        return completion_text(answer) if isinstance(answer, str) else None
    if task == "math":
        return answer if isinstance(answer, str) else None
    from spotrl.problems.code import completion_text

    try:
        reference = json.loads(metadata).get("reference") if isinstance(metadata, str) else None
    except ValueError:
        reference = None
    return completion_text(reference) if isinstance(reference, str) else None


def run_rows(task: str, canonical: pd.DataFrame) -> pd.DataFrame:
    """Canonical curated rows as the run's prompt rows (id, prompt, answer = the verifier's reference,
    source, target)."""
    field = REFERENCE_FIELD[task]
    targets = [_target(task, a, m) for a, m in zip(canonical["answer"], canonical["metadata"])]
    return pd.DataFrame({"id": canonical["id"].astype(object), "prompt": canonical["prompt"].astype(object),
                         "answer": canonical[field].astype(object), "source": canonical["source"].astype(object),
                         "target": pd.Series(targets, dtype=object, index=canonical.index)}).reset_index(drop=True)


def builtin_splits(task_cfg, seed: int) -> dict:
    """The built-in task's {"train", "eval"} splits as `datasets.Dataset`s of run rows."""
    from spotrl.problems import arithmetic
    from spotrl.problems import code as codetask
    from spotrl.curation.schema import to_dataset

    t = task_cfg
    if t.name == "arithmetic":
        train, held_out = arithmetic.make_splits(seed, t.train_size, t.eval_size, t.min_digits, t.max_digits)
        return {"train": train, "eval": held_out}
    if t.name == "code":
        train, held_out = codetask.make_splits(seed, t.train_size, t.eval_size)
        return {"train": to_dataset(run_rows("code", train), "code/train"),
                "eval": to_dataset(run_rows("code", held_out), "code/eval")}
    raise ValueError(f"task {t.name!r} has no built-in prompts: name dataset sources in curation.sources")


def warm_start_examples(task: str, split) -> tuple[list[str], list[str], list[str]]:
    """(prompts, verifier references, target completions) of the rows a warm start can learn from."""
    if "target" not in split.column_names:  # the built-in arithmetic rows: the target is the answer reversed
        from spotrl.problems.arithmetic import completion_text

        return list(split["prompt"]), list(split["answer"]), [completion_text(a) for a in split["answer"]]
    rows = [(p, a, t) for p, a, t in zip(split["prompt"], split["answer"], split["target"]) if t is not None]
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
