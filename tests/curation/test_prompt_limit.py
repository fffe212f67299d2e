"""A prompt longer than the model's context leaves room for is quarantined, counted in the tokens the
rollout encodes it to; the curated split is what it would be without that row."""

import json

import pandas as pd
import pytest

from spotrl.configs import build_config
from spotrl.curation.manifest import load_curated, read_manifest
from spotrl.curation.pipeline import CurateOptions, curate
from spotrl.curation.prompt_limit import PromptLimit
from spotrl.curation.sources import SourceSpec

GOOD = [{"id": str(i), "prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(8)]
LONG = {"id": "long", "prompt": "What is 1 + 1? " * 200, "answer": "2"}  # 3,000 characters


def test_of_run_leaves_the_context_less_the_completion():
    config = build_config(None, ["model.max_position_embeddings=4096", "rollout.max_new_tokens=1024"])
    limit = PromptLimit.of_run(config)
    assert (limit.tokens, limit.tokenizer, limit.chat_template) == (3072, None, True)
    assert limit.why == "model.max_position_embeddings 4,096 minus rollout.max_new_tokens 1,024"


def test_the_built_in_tokenizer_counts_bos_and_one_token_per_character():
    too_long = PromptLimit(10, "the test's limit").checker()
    assert too_long("x" * 9) is None  # BOS + 9 = 10 tokens
    assert too_long("x" * 10) == "too long for the model's context (11 tokens; it allows 10: the test's limit)"


def test_a_checkpoint_tokenizer_counts_the_chat_prompt_and_decides_a_huge_prompt_by_its_bound(tmp_path):
    pytest.importorskip("tokenizers")
    from hf_fixtures import write_qwen_tokenizer

    from spotrl.model.hf.tokenizer import HFTokenizer

    write_qwen_tokenizer(tmp_path)
    tok = HFTokenizer.for_prompts(str(tmp_path))
    prompt = "What is 12 + 34?"
    fits = tok.prompt_tokens(prompt)
    assert fits > len(tok.encode(prompt))  # the chat template's system turn and markers count too
    assert PromptLimit(fits, "x", str(tmp_path)).checker()(prompt) is None
    assert PromptLimit(fits - 1, "x", str(tmp_path)).checker()(prompt) == (
        f"too long for the model's context ({fits:,} tokens; it allows {fits - 1:,}: x)"
    )
    # 1 MB is seconds of tokenizing; its bytes over the longest token's already exceed the limit
    reason = PromptLimit(1000, "x", str(tmp_path)).checker()("What is 1 + 1? " * 70_000)
    assert reason.startswith("too long for the model's context (at least ") and "it allows 1,000" in reason


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return SourceSpec("qa", str(path))


def test_the_long_row_is_quarantined_with_the_reason_and_the_split_is_as_without_it(tmp_path):
    options = CurateOptions(seed=1, eval_size=2, prompt_limit=PromptLimit(100, "the test's limit"))
    with_long = _write(tmp_path / "with_long.jsonl", GOOD[:3] + [LONG] + GOOD[3:])
    summary = curate([with_long], tmp_path / "a", options=options)
    assert summary["quarantine_reasons"] == {"prompt: too long for the model's context": 1}
    assert (summary["quarantined"], summary["train"], summary["eval"]) == (1, 6, 2)
    quarantine = pd.read_parquet(tmp_path / "a" / "quarantine.parquet")
    assert quarantine[["row", "fields"]].values.tolist() == [[3, "prompt"]]
    assert quarantine["reason"][0] == (
        "row 3: field 'prompt': too long for the model's context (3,001 tokens; it allows 100: the test's limit)"
    )
    assert json.loads(quarantine["record"][0]) == LONG
    kept = pd.concat([load_curated(tmp_path / "a", "train"), load_curated(tmp_path / "a", "eval")])
    assert sorted(kept["id"]) == sorted(f"qa/{r['id']}" for r in GOOD)

    # rows that fit are curated as without a limit: the same splits, the same content hash
    without = _write(tmp_path / "good.jsonl", GOOD)
    curate([without], tmp_path / "b", options=options)
    curate([without], tmp_path / "c", options=CurateOptions(seed=1, eval_size=2))
    hashes = {read_manifest(tmp_path / d)["sha256"] for d in "abc"}
    assert len(hashes) == 1
    assert read_manifest(tmp_path / "b")["inputs_sha256"] != read_manifest(tmp_path / "c")["inputs_sha256"]
