"""Duplicates, decontamination, mixing and splits, with counts worked out by hand."""

import pandas as pd
import pytest

from spotrl.curation.decontam import NgramIndex, decontaminate, words
from spotrl.curation.dedup import drop_duplicates, normalise_prompt
from spotrl.curation.mixing import allocate, mix, split


def _frame(prompts, source="s"):
    return pd.DataFrame(
        {"id": [f"{source}/{i}" for i in range(len(prompts))], "prompt": prompts, "source": [source] * len(prompts)}
    )


def test_normalisation():
    assert normalise_prompt("What is 2+2 ?") == normalise_prompt("  what IS 2 + 2?")
    assert normalise_prompt("ﬁve") == normalise_prompt("FIVE")  # NFKC ligature, case folding
    assert normalise_prompt("2+2") != normalise_prompt("2-2")
    assert normalise_prompt("a\tb\n c") == "a b c"


def test_exact_and_normalised_duplicates_counted_separately():
    prompts = [
        "What is 2 + 2?",  # 0 kept
        "What is 2 + 2?",  # 1 exact duplicate of 0
        "what is 2+2 ?",  # 2 normalised duplicate of 0
        "What is 3 + 3?",  # 3 kept
        "WHAT IS 3 + 3 ?",  # 4 normalised duplicate of 3
        "what is 2+2 ?",  # 5 exact text of 2 (which was itself a near duplicate): counted exact
        "What is 2 + 3?",  # 6 kept
    ]
    kept, removed, counts = drop_duplicates(_frame(prompts))
    assert kept["id"].tolist() == ["s/0", "s/3", "s/6"]
    assert counts == {"exact": 2, "normalised": 2}
    assert list(zip(removed["id"], removed["reason"], removed["detail"])) == [
        ("s/1", "duplicate", "s/0"),
        ("s/2", "near_duplicate", "s/0"),
        ("s/4", "near_duplicate", "s/3"),
        ("s/5", "duplicate", "s/0"),
    ]


def test_first_source_wins_across_sources():
    frame = pd.concat([_frame(["Solve x + 1 = 2."], "a"), _frame(["solve x+1=2.", "Other."], "b")], ignore_index=True)
    kept, removed, counts = drop_duplicates(frame)
    assert kept["id"].tolist() == ["a/0", "b/1"] and removed["id"].tolist() == ["b/0"]


def test_ngram_decontamination_counts():
    eval_prompts = [
        "Natalia sold clips to 48 of her friends in April and then half as many in May",  # 16 words
        "Compute 17 times 23",  # 3 words: shorter than n
    ]
    index = NgramIndex(eval_prompts, n=5)
    train = _frame(
        [
            "natalia SOLD clips to 48 of her classmates",  # shares "natalia sold clips to 48": contaminated
            "Tom sold clips to 48 people",  # shares only "sold clips to 48" (4 words): clean at n=5
            "As many in May as in June",  # shares only "as many in may" (4 words): clean at n=5
            "First, compute 17 times 23, then add one",  # contains the whole short eval prompt: contaminated
            "compute 17 times",  # 3 words (< n), contiguous inside an eval prompt: contaminated
            "times 17 compute",  # same words, not contiguous: clean
            "",  # no words: clean
            "then half as many in May",  # "then half as many in" / "half as many in may": contaminated
        ]
    )
    kept, removed = decontaminate(train, index)
    assert removed["id"].tolist() == ["s/0", "s/3", "s/4", "s/7"]
    assert removed["detail"].tolist() == [
        "natalia sold clips to 48",
        "compute 17 times 23",
        "compute 17 times",
        "then half as many in",
    ]
    assert len(kept) == 4
    at_4 = decontaminate(train, NgramIndex(eval_prompts, n=4))[1]  # the two 4-word overlaps count too
    assert at_4["id"].tolist() == ["s/0", "s/1", "s/2", "s/3", "s/4", "s/7"]
    with pytest.raises(ValueError):
        NgramIndex(eval_prompts, n=0)


def test_words_ignore_punctuation_and_case():
    assert words("Hello, WORLD! 3.5") == ("hello", "world", "3", "5")


def test_allocation_by_weight():
    sizes = {"a": 100, "b": 50, "c": 10}
    assert allocate(sizes, {"a": 1, "b": 1}) == {"a": 50, "b": 50, "c": 0}  # b limits the total to 100
    assert allocate(sizes, {"a": 2, "b": 1}, total=30) == {"a": 20, "b": 10, "c": 0}
    assert allocate(sizes, {"a": 1, "b": 1, "c": 1}, total=10) == {"a": 4, "b": 3, "c": 3}  # largest remainders
    with pytest.raises(ValueError, match="at most 30"):
        allocate(sizes, {"a": 1, "b": 1, "c": 1}, total=31)
    with pytest.raises(ValueError, match="unknown"):
        allocate(sizes, {"z": 1})


def test_mix_is_deterministic_and_keeps_source_order():
    frames = {"a": _frame([f"a{i}" for i in range(20)], "a"), "b": _frame([f"b{i}" for i in range(10)], "b")}
    mixed, counts = mix(frames, {"a": 3, "b": 1}, seed=5, total=12)
    assert counts == {"a": 9, "b": 3} and len(mixed) == 12
    again, _ = mix(frames, {"a": 3, "b": 1}, seed=5, total=12)
    assert mixed["id"].tolist() == again["id"].tolist()
    other, _ = mix(frames, {"a": 3, "b": 1}, seed=6, total=12)
    assert mixed["id"].tolist() != other["id"].tolist()
    a_ids = [int(i.split("/")[1]) for i in mixed["id"] if i.startswith("a/")]
    assert a_ids == sorted(a_ids)
    everything, counts = mix(frames, None, seed=5)
    assert len(everything) == 30 and counts == {"a": 20, "b": 10}


def test_split_is_deterministic_exact_and_stable():
    frame = _frame([f"p{i}" for i in range(200)])
    train, held_out = split(frame, seed=1, eval_fraction=0.1)
    assert len(held_out) == 20 and len(train) == 180
    assert not set(train["id"]) & set(held_out["id"])
    again_train, again_eval = split(frame.sample(frac=1, random_state=3), seed=1, eval_fraction=0.1)
    assert set(again_eval["id"]) == set(held_out["id"])  # row order does not matter
    assert set(split(frame, seed=2, eval_fraction=0.1)[1]["id"]) != set(held_out["id"])
    assert len(split(frame, seed=1, eval_size=7)[1]) == 7
