"""`spotrl curate` and `spotrl verify code` end to end, on files the test writes; counts by hand."""

import json

import datasets
import pandas as pd
import pytest

from spotrl.cli.main import main
from spotrl.curation.manifest import load_curated, read_manifest
from spotrl.curation.pipeline import inputs_sha256
from spotrl.rewards.sandbox import runner as sb

MATH = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have now?", "final": 7},
    {"question": "tom has 3 apples and buys 4 more.  How many apples does he have now?", "final": 7},  # near dup of 0
    {"question": "", "final": 1},  # quarantined: empty prompt
    "{oops",  # quarantined: not JSON
    {"question": "A train travels 60 miles per hour for 2 hours. How far does it go?", "final": 120},  # contaminated
    {"question": "What is the sum of 15 and 27?", "final": "42"},
    {"question": "What is the sum of 15 and 27?", "final": "42"},  # exact dup of 5
    {"question": "Name a prime number greater than 10 and less than 13."},  # quarantined: no answer
    {"question": "What is 9 squared?", "final": 81},
    {"question": "Half of 50 is what number?", "final": 25},
]
TRIVIA = (
    'q,a,topic\n"What is the capital of France?",Paris,geo\n"What is the sum of 15 and 27?",42,math\n'
    '"What is the boiling point of water in Celsius at sea level?",100,science\nbad,row\n'
    '"Which planet is known as the Red Planet?",Mars,space\n'
)
MBPP = [
    {
        "task_id": 1,
        "text": "Write a function add(a, b) that returns the sum of a and b.",
        "test_list": ["assert add(1, 2) == 3"],
    },
    {
        "task_id": 2,
        "text": "Write a function sq(x) returning x squared.",
        "test_list": ["assert sq(3) =="],
    },  # bad tests
    {"task_id": 3, "text": "Write a function neg(x) that returns minus x.", "test_list": ["assert neg(2) == -2"]},
]
EVAL = [
    {
        "problem": "A train travels 60 miles per hour for 2 hours. How far does the train travel in total?",
        "solution": "120",
    }
]
MAPS = [
    "--map",
    "math.question=prompt",
    "--map",
    "math.final=answer",
    "--map",
    "trivia.q=prompt",
    "--map",
    "trivia.a=answer",
    "--map",
    "mbpp.task_id=id",
    "--map",
    "mbpp.text=prompt",
    "--map",
    "mbpp.test_list=tests",
    "--map",
    "heldout.problem=prompt",
    "--map",
    "heldout.solution=answer",
]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "math.jsonl").write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in MATH) + "\n")
    (tmp_path / "trivia.csv").write_text(TRIVIA)
    datasets.Dataset.from_list(MBPP).save_to_disk(str(tmp_path / "mbpp"))
    (tmp_path / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in EVAL))
    return tmp_path


def _curate(files, out, *extra, capsys=None):
    args = [
        "curate",
        str(files / "math.jsonl"),
        str(files / "trivia.csv"),
        str(files / "mbpp"),
        "--out",
        str(out),
        "--eval",
        str(files / "heldout.jsonl"),
        *MAPS,
        *extra,
    ]
    return main(args)


def test_curate_counts_and_outputs(files, capsys):
    out = files / "out"
    assert _curate(files, out, "--eval-size", "2", "--json") == 0
    s = json.loads(capsys.readouterr().out)
    assert s["read"] == 18  # 10 + 5 + 3
    assert s["quarantined"] == 5 and s["quarantine_reasons"] == {
        "prompt: empty or not text": 1,
        "line is not valid JSON": 1,
        "answer/tests: missing": 1,
        "CSV row has the wrong number of fields": 1,
        "tests: not Python with an assert statement": 1,
    }
    assert s["duplicates"] == {"exact": 2, "normalised": 1}  # math 6, trivia 1 (cross-source); math 1
    assert s["contaminated"] == 1 and s["eval_set"]["prompts"] == 1 and s["eval_set"]["ngram"] == 13
    # 18 read - 5 quarantined - 3 duplicates - 1 contaminated = 9: math 4, trivia 3, mbpp 2
    assert (s["kept"], s["train"], s["eval"], s["not_sampled"]) == (9, 7, 2, 0)
    assert s["per_source"]["math"] == {
        "read": 10,
        "quarantined": 3,
        "valid": 7,
        "duplicates": 2,
        "contaminated": 1,
        "not_sampled": 0,
        "train": s["per_source"]["math"]["train"],
        "eval": s["per_source"]["math"]["eval"],
    }
    assert s["per_source"]["math"]["train"] + s["per_source"]["math"]["eval"] == 4
    assert s["per_source"]["trivia"]["duplicates"] == 1 and s["per_source"]["mbpp"]["quarantined"] == 1

    train, held_out = load_curated(out, "train"), load_curated(out, "eval")
    assert len(train) == 7 and len(held_out) == 2
    rows = pd.concat([train, held_out])
    assert "mbpp/1" in set(rows["id"]) and rows.set_index("id").loc["mbpp/1", "tests"] == "assert add(1, 2) == 3"
    assert rows.set_index("id").loc["trivia/0", "answer"] == "Paris"
    assert json.loads(rows.set_index("id").loc["trivia/0", "metadata"]) == {"topic": "geo"}
    quarantine = pd.read_parquet(out / "quarantine.parquet")
    assert sorted(zip(quarantine["source"], quarantine["row"])) == [
        ("math", 2),
        ("math", 3),
        ("math", 7),
        ("mbpp", 1),
        ("trivia", 3),
    ]
    assert "row 7: field 'answer/tests'" in quarantine.set_index(["source", "row"]).loc[("math", 7), "reason"]
    removed = pd.read_parquet(out / "removed.parquet")
    assert sorted(removed["reason"]) == ["contaminated", "duplicate", "duplicate", "near_duplicate"]
    manifest = read_manifest(out)
    assert manifest["summary"]["sha256"] == manifest["sha256"] == s["sha256"]
    assert [src["name"] for src in manifest["inputs"]["sources"]] == ["math", "trivia", "mbpp"]


def test_curate_is_deterministic_and_up_to_date(files, capsys):
    out = files / "out"
    assert _curate(files, out, "--seed", "3") == 0
    first = capsys.readouterr().out
    assert "curated ->" in first and "duplicates: 2 exact, 1 normalised" in first
    assert "contaminated: 1 (13-gram overlap" in first and "quarantined 5 rows" in first
    sha = read_manifest(out)["sha256"]
    from spotrl.cli.curate import build_specs
    from spotrl.cli.main import _parser

    parsed = _parser().parse_args(
        [
            "curate",
            str(files / "math.jsonl"),
            str(files / "trivia.csv"),
            str(files / "mbpp"),
            "--out",
            str(out),
            "--eval",
            str(files / "heldout.jsonl"),
            *MAPS,
            "--seed",
            "3",
        ]
    )
    assert inputs_sha256(*build_specs(parsed)) == read_manifest(out)["inputs_sha256"]  # a cache key, before curating
    mtime = (out / "train.parquet").stat().st_mtime_ns
    assert _curate(files, out, "--seed", "3") == 0
    assert "up to date" in capsys.readouterr().out and (out / "train.parquet").stat().st_mtime_ns == mtime
    assert _curate(files, files / "other", "--seed", "3") == 0 and read_manifest(files / "other")["sha256"] == sha
    assert _curate(files, out, "--seed", "4") == 0  # another seed: another split, curated again
    assert read_manifest(out)["inputs_sha256"] != read_manifest(files / "other")["inputs_sha256"]
    (files / "math.jsonl").write_text(
        (files / "math.jsonl").read_text() + json.dumps({"question": "New one?", "final": 1}) + "\n"
    )
    assert _curate(files, files / "other", "--seed", "3") == 0 and "curated ->" in capsys.readouterr().out


def test_curate_mixes_by_weight(files, capsys):
    out = files / "mixed"
    assert (
        _curate(
            files, out, "--weight", "math=1", "--weight", "trivia=1", "--weight", "mbpp=0", "--eval-size", "0", "--json"
        )
        == 0
    )
    s = json.loads(capsys.readouterr().out)
    # math has 4 usable rows, trivia 3, at equal weight the total is 6: 3 + 3; mbpp's 2 are not taken
    assert (s["per_source"]["math"]["train"], s["per_source"]["trivia"]["train"], s["per_source"]["mbpp"]["train"]) == (
        3,
        3,
        0,
    )
    assert s["not_sampled"] == 3 and s["kept"] == 6


def test_curate_quarantines_prompts_longer_than_the_limit(tmp_path, capsys):
    rows = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(4)]
    rows += [{"prompt": "x" * 40_000, "answer": "1"}, {"prompt": "y" * 60, "answer": "1"}]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["curate", str(tmp_path / "qa.jsonl"), "--eval-size", "1", "--json"]
    # by default the limit is what the default run config leaves a prompt, counted one token per character
    assert main(args + ["--out", str(tmp_path / "default")]) == 0
    assert json.loads(capsys.readouterr().out)["quarantine_reasons"] == {"prompt: too long for the model's context": 1}
    assert pd.read_parquet(tmp_path / "default" / "quarantine.parquet")["reason"].tolist() == [
        "row 4: field 'prompt': too long for the model's context (40,001 tokens; it allows 32,760: the default run "
        "config's model.max_position_embeddings 32,768 minus rollout.max_new_tokens 8)"
    ]
    assert main(args + ["--out", str(tmp_path / "tight"), "--max-prompt-tokens", "50"]) == 0
    assert json.loads(capsys.readouterr().out)["train"] == 3
    reasons = pd.read_parquet(tmp_path / "tight" / "quarantine.parquet")["reason"].tolist()
    assert (
        reasons[1]
        == "row 5: field 'prompt': too long for the model's context (61 tokens; it allows 50: --max-prompt-tokens)"
    )


def test_curate_errors(files, capsys):
    assert main(["curate", str(files / "math.jsonl"), "--out", str(files / "o"), "--map", "math.questoin=prompt"]) == 2
    assert "no column 'questoin'" in capsys.readouterr().err
    assert main(["curate", str(files / "math.jsonl"), "--out", str(files / "o"), "--map", "gsm8k.q=prompt"]) == 2
    assert "no source named 'gsm8k'" in capsys.readouterr().err
    assert main(["curate", str(files / "nope.jsonl"), "--out", str(files / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["curate", str(files / "math.jsonl"), "--out", str(files / "o"), "--max-prompt-tokens", "0"]) == 2
    assert "--max-prompt-tokens 0: must be at least 1" in capsys.readouterr().err
    assert main(["curate", str(files / "math.jsonl"), "--out", str(files / "o"), "--tokenizer", str(files)]) == 2
    assert f"{files / 'tokenizer.json'}: missing file" in capsys.readouterr().err
    (files / "bad.jsonl").write_text("{oops\n" + json.dumps({"prompt": "", "answer": "1"}) + "\n")
    assert main(["curate", str(files / "bad.jsonl"), "--out", str(files / "o")]) == 1  # nothing kept
    assert pd.read_parquet(files / "o" / "quarantine.parquet")["row"].tolist() == [0, 1]


# ------------------------------------------------------------------------------------ verify code


def _verify(tmp_path, solution, tests, *extra):
    (tmp_path / "sol.py").write_text(solution)
    (tmp_path / "tests.py").write_text(tests)
    return main(
        ["verify", "code", "--solution", str(tmp_path / "sol.py"), "--tests", str(tmp_path / "tests.py"), *extra]
    )


def test_verify_code_prints_one_json_object_and_exit_code(tmp_path, capsys):
    tests = "assert add(1, 2) == 3\nassert add(2, 2) == 4\n"
    assert _verify(tmp_path, "def add(a, b):\n    return a + b\n", tests) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["status"], out["reward"], out["tests_passed"], out["tests_total"]) == ("passed", 1.0, 2, 2)
    assert _verify(tmp_path, "def add(a, b):\n    return 0\n", tests) == 1
    assert json.loads(capsys.readouterr().out)["status"] == "failed"
    assert _verify(tmp_path, "while True:\n    pass\n", tests, "--timeout", "1", "--cpu-seconds", "5") == 1
    assert json.loads(capsys.readouterr().out)["status"] == "timeout"
    assert _verify(tmp_path, "x = bytearray(2 ** 33)\n", tests, "--memory-mb", "256") == 1
    assert json.loads(capsys.readouterr().out)["status"] == "limit"
    assert _verify(tmp_path, "def add(a, b):\n    return a + b\n", "assert add(1, 2) ==\n") == 2
    assert "not valid Python" in capsys.readouterr().err


def test_verify_code_reports_a_sandbox_failure_as_error(tmp_path, capsys, monkeypatch):
    broken = tmp_path / "broken_harness.py"
    broken.write_text("raise SystemExit(4)\n")
    monkeypatch.setattr(sb, "HARNESS", broken)
    assert _verify(tmp_path, "def add(a, b):\n    return a + b\n", "assert add(1, 2) == 3\n", "--retries", "1") == 3
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "error" and out["reward"] is None and out["attempts"] == 2
