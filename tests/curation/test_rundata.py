"""Curation as the train flow's curate stage: dataset sources named in the run config become the
run's data (bad rows in RUN/quarantine.parquet), the stage caches on the content of the sources,
and difficulty curation filters the prompt stream with estimates persisted in the run directory."""

import json

import pandas as pd
import pytest

from spotrl.config import ConfigError
from spotrl.configs import build_config
from spotrl.storage.parquet import read_frame

# Hand-made arithmetic-problem source: 11 lines, 3 bad, 1 exact duplicate, 1 contaminated (below).
LINES = [
    {"q": "0012+0345=", "a": 357},
    {"q": "0020+0030=", "a": "50"},
    {"q": "0100+0200=", "a": "300"},
    {"q": "0012+0345=", "a": "357"},  # exact duplicate of line 0
    {"q": "0007+0008=", "t": "assert 1 == 1"},  # tests but no answer: the arithmetic verifier needs one
    {"q": "12 plus 30=", "a": "42"},  # letters and spaces: not in the problem's alphabet
    None,  # not JSON
    {"q": "0001+0001=", "a": "2"},
    {"q": "0040+0002=", "a": "42"},
    {"q": "0099+0001=", "a": "100"},  # also in the held-out eval set: contaminated
    {"q": "0050+0050=", "a": "100"},
]
CSV = "question,result\n0011+0011=,22\n0013+0013=,26\n0014+0014=,28\n0015+0015=,30\n"
EVAL = '{"prompt": "0099+0001=", "answer": "100"}\n'


def write_sources(root):
    root.mkdir(parents=True, exist_ok=True)
    (root / "a.jsonl").write_text("".join(("{not json" if x is None else json.dumps(x)) + "\n" for x in LINES))
    (root / "b.csv").write_text(CSV)
    (root / "heldout.jsonl").write_text(EVAL)
    return root


def source_overrides(root, eval_size=2):
    sources = [
        {"name": "a", "path": str(root / "a.jsonl"), "map": {"q": "prompt", "a": "answer", "t": "tests"}},
        {"name": "b", "path": str(root / "b.csv"), "map": {"question": "prompt", "result": "answer"}},
    ]
    return [
        f"curation.sources={json.dumps(sources)}",
        f"curation.eval={json.dumps([{'name': 'heldout', 'path': str(root / 'heldout.jsonl')}])}",
        "curation.ngram=2",
        f"problem.eval_size={eval_size}",
        f"eval.prompts={eval_size}",
    ]


def test_sources_become_the_run_data_with_bad_rows_quarantined(tmp_path, tiny_config):
    from spotrl.curation.rundata import prepare
    from spotrl.curation.store import load_split

    config = build_config(tiny_config.model_dump(mode="json"), source_overrides(write_sources(tmp_path / "src")))
    run = tmp_path / "run"
    ref = prepare(config, run)
    # 11 + 4 rows read; lines 4, 5, 6 quarantined; line 3 a duplicate; line 9 contaminated: 10 kept
    assert ref["curation"] == {
        "read": 15,
        "quarantined": 3,
        "duplicates": {"exact": 1, "normalised": 0},
        "contaminated": 1,
        "not_sampled": 0,
        "train": 8,
        "eval": 2,
    }
    quarantine = read_frame(run / "quarantine.parquet")
    assert quarantine["row"].tolist() == [4, 5, 6] and set(quarantine["source"]) == {"a"}
    reasons = quarantine["reason"].tolist()
    assert reasons[0] == "row 4: field 'answer': missing (the problem's verifier needs it)"
    assert reasons[1].startswith("row 5: field 'prompt': characters not in the problem's tokenizer alphabet (' ', 'l'")
    assert reasons[2].startswith("row 6: line is not valid JSON")
    assert json.loads(quarantine["record"][0]) == LINES[4]  # nothing of a bad row is lost

    train, held_out = load_split(run / "data", "train"), load_split(run / "data", "eval")
    rows = {r["prompt"]: r for r in train.to_list() + held_out.to_list()}
    expected = {x["q"]: str(x["a"]) for i, x in enumerate(LINES) if i in (0, 1, 2, 7, 8, 10)}
    expected.update({line.split(",")[0]: line.split(",")[1] for line in CSV.splitlines()[1:]})
    assert {p: r["answer"] for p, r in rows.items()} == expected
    assert all(r["target"] == r["answer"][::-1] for r in rows.values())  # the warm start's reversed digits
    assert rows["0012+0345="]["id"] == "a/0" and rows["0011+0011="]["source"] == "b"
    assert (
        ref["rows"] == {"train": 8, "eval": 2}
        and ref["sha256"] == json.loads((run / "data/manifest.json").read_text())["sha256"]
    )


def test_a_prompt_longer_than_the_context_leaves_is_quarantined_naming_the_config_keys(tmp_path, tiny_config):
    from spotrl.curation.rundata import prepare

    src = write_sources(tmp_path / "src")
    with (src / "a.jsonl").open("a") as f:  # line 11: 101 characters, 102 tokens with BOS
        f.write(json.dumps({"q": "0001+" * 20 + "=", "a": "20"}) + "\n")
    overrides = source_overrides(src) + ["model.max_position_embeddings=64", "rollout.max_new_tokens=8"]
    ref = prepare(build_config(tiny_config.model_dump(mode="json"), overrides), tmp_path / "run")
    assert ref["quarantine_reasons"]["prompt: too long for the model's context"] == 1
    quarantine = read_frame(tmp_path / "run" / "quarantine.parquet")
    assert quarantine["row"].tolist() == [4, 5, 6, 11]  # the others as without a limit (the test above)
    assert quarantine["reason"].tolist()[3] == (
        "row 11: field 'prompt': too long for the model's context (102 tokens; it allows 56: "
        "model.max_position_embeddings 64 minus rollout.max_new_tokens 8)"
    )
    assert ref["rows"] == {"train": 8, "eval": 2}


def test_source_config_errors_name_the_key(tmp_path, tiny_config):
    base = tiny_config.model_dump(mode="json")
    with pytest.raises(ConfigError, match="curation.sources.0.weight"):
        build_config(base, ['curation.sources=[{"name": "a", "path": "x.jsonl", "weight": -1}]'])
    with pytest.raises(ConfigError, match="problem.name 'math' has no built-in prompts"):
        build_config(base, ["problem.name=math"])
    with pytest.raises(ConfigError, match="model.vocab_size"):
        build_config(base, ["problem.name=code"])


def test_stream_drops_never_and_always_solved_prompts_and_keeps_unestimated_ones():
    from spotrl.curation.curriculum import estimate_iteration, stream_pool

    estimates = pd.DataFrame(
        {
            "id": ["a", "b", "c", "e"],
            "samples": [4] * 4,
            "successes": [0, 4, 2, 1],
            "pass_rate": [0.0, 1.0, 0.5, 0.25],
            "version": [3] * 4,
        }
    )
    ids = ["a", "b", "c", "d", "e", "f"]  # a never solved, b always; d and f not estimated
    rows, counts = stream_pool(ids, estimates, True, True, min_rows=2)
    assert rows.tolist() == [2, 3, 4, 5]
    assert counts == {"estimated": 4, "never_solved": 1, "always_solved": 1, "stream_rows": 4}
    assert stream_pool(ids, estimates, False, True, 2)[0].tolist() == [0, 2, 3, 4, 5]
    assert stream_pool(ids, estimates, True, False, 2)[0].tolist() == [1, 2, 3, 4, 5]
    rows, counts = stream_pool(ids, estimates, True, True, min_rows=5)  # too few left for an iteration: all
    assert rows.tolist() == [0, 1, 2, 3, 4, 5] and counts["filter_skipped"]
    assert [estimate_iteration(i, 3) for i in range(1, 8)] == [1, 1, 1, 4, 4, 4, 7]


@pytest.mark.slow
def test_curate_stage_is_a_cache_hit_until_a_source_file_changes(prefect_harness, tmp_path, tiny_config):
    from prefect import flow

    from spotrl.tasks import stages

    src = write_sources(tmp_path / "src")
    config = build_config(tiny_config.model_dump(mode="json"), source_overrides(src))
    run = tmp_path / "run"
    curate = stages.curate.with_options(result_storage=run / "prefect-results")

    @flow
    def curate_once():
        return curate(config, str(run), return_state=True)

    first, second = curate_once(), curate_once()
    assert (first.name, second.name) == ("Completed", "Cached")
    assert second.result() == first.result()
    with (src / "b.csv").open("a") as f:  # same path, same config: only the content changed
        f.write("0016+0016=,32\n")
    third = curate_once()
    assert third.name == "Completed"
    assert third.result()["curation"]["read"] == 16 and third.result()["rows"] == {"train": 9, "eval": 2}
    assert (
        "0016+0016="
        in read_frame(run / "data" / "train.parquet")["prompt"].tolist()
        + read_frame(run / "data" / "eval.parquet")["prompt"].tolist()
    )


@pytest.mark.slow
def test_difficulty_estimates_filter_the_prompt_stream(prefect_harness, tmp_path, tiny_config):
    from spotrl.curation.store import load_split
    from spotrl.flows.train import train
    from spotrl.storage.rollouts import find_shard
    from spotrl.tasks import stages

    config = build_config(
        tiny_config.model_dump(mode="json"),
        ["problem.train_size=40", 'curation.difficulty={"every": 1, "samples": 4, "prompts": 32}'],
    )  # samples = group_size
    run = tmp_path / "run"
    train(config=config, run_dir=str(run))
    train_ids = load_split(run / "data", "train")["id"]
    r = config.rollout
    for iteration in (1, 2):
        path = run / "difficulty" / f"iter_{iteration:06d}.parquet"
        estimates = read_frame(path)
        assert len(estimates) == 32 and set(estimates["version"]) == {iteration - 1}  # sampled with v(i-1)
        assert (estimates["samples"] == 4).all()
        assert (estimates["pass_rate"] == estimates["successes"] / 4).all()
        dropped = set(estimates["id"][(estimates["pass_rate"] == 0) | (estimates["pass_rate"] == 1)])
        stream = set(train_ids) - dropped
        assert len(stream) >= r.prompts_per_iteration  # so the filter applies (the 8 unestimated rows at least)
        sampled = pd.concat(
            [read_frame(find_shard(run / "rollouts", iteration, s, "rollouts")) for s in range(r.shards)]
        )
        assert set(sampled["prompt_id"]) <= stream and len(sampled) == r.prompts_per_iteration * r.group_size
    # made again (as after a kill that lost the file): the same bytes
    path = run / "difficulty" / "iter_000002.parquet"
    before = path.read_bytes()
    ref = stages.difficulty.fn(config, str(run), 2, 1)
    assert path.read_bytes() == before
    path.unlink()
    assert stages.difficulty.fn(config, str(run), 2, 1)["sha256"] == ref["sha256"] and path.read_bytes() == before
