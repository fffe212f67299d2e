"""The curated data of a run: the problem's built-in prompts, or the config's dataset sources curated.

With `curation.sources`, or a generated problem (`Problem.generated`: reasoning_gym, countdown,
whose rows are written as JSONL sources under RUN/curation/generated/ first), the pipeline
(pipeline.py) writes its product to RUN/curation/ (canonical splits, removed rows, the manifest
with the summary and the hash of the inputs), the rows that fail go to RUN/quarantine.parquet with
the reason (a prompt longer than `model.max_position_embeddings - rollout.max_new_tokens` tokens
among them), and RUN/data gets the prompt rows the trainer reads (`Problem.run_rows`). The
held-out split has `problem.eval_size` rows; the rest is training data.

`inputs_sha256` is what the flow's curate task caches on, next to its inputs: the content of every
source file, the mappings and the options, so curation re-runs when a source file changes even
though the config (which only names the file) did not.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from spotrl.curation.manifest import load_curated
from spotrl.curation.pipeline import CurateOptions, curate
from spotrl.curation.pipeline import inputs_sha256 as pipeline_inputs_sha256
from spotrl.curation.prompt_limit import PromptLimit
from spotrl.curation.schema import to_dataset
from spotrl.curation.sources import SourceError, SourceSpec
from spotrl.curation.store import SPLITS, save_splits
from spotrl.problems import get_problem
from spotrl.problems.spec import GeneratedSource
from spotrl.storage.atomic import atomic_write_text
from spotrl.storage.parquet import read_frame, write_frame
from spotrl.storage.paths import as_path


class CurationError(ValueError):
    """The config's sources cannot make a run's data (nothing kept, too few rows for the splits)."""


def source_specs(curation_cfg) -> tuple[list[SourceSpec], list[SourceSpec]]:
    spec = lambda s: SourceSpec(s.name, s.path, dict(s.map), format=s.format, split=s.split)  # noqa: E731
    return [spec(s) for s in curation_cfg.sources], [spec(s) for s in curation_cfg.eval]


def curate_options(config, generated: list[GeneratedSource] = ()) -> CurateOptions:
    """The pipeline's options for the config's sources, or for a generated problem's `generated` ones."""
    c, problem = config.curation, get_problem(config.problem.name)
    if generated:  # every generated row: the generator sized each source by its weight
        weights = {}
    else:
        weights = {s.name: s.weight for s in c.sources if s.weight is not None}
        if weights:  # a source without a weight among weighted ones contributes nothing: say so by 0
            weights = {s.name: weights.get(s.name, 0.0) for s in c.sources}
    return CurateOptions(
        seed=config.seed,
        ngram=c.ngram,
        eval_size=config.problem.eval_size,
        total=None if generated else c.total,
        weights=weights,
        require=problem.reference_field,
        alphabet=problem.alphabet,
        reference_is_text=problem.reference_is_text,
        prompt_limit=PromptLimit.of_run(config),
    )


def write_generated(config, out) -> tuple[list[SourceSpec], list[GeneratedSource]]:
    """A generated problem's rows (from the run's seed) as JSONL sources under `out`/generated/."""
    generated = get_problem(config.problem.name).generated(config.problem, config.seed)
    specs = []
    for g in generated:
        path = as_path(out) / "generated" / f"{g.name}.jsonl"
        atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in g.records))
        specs.append(SourceSpec(g.name, str(path), format="jsonl"))
    return specs, generated


def inputs_sha256(config) -> str | None:
    """Hash of everything curation reads (None for built-in prompts, which the config fully decides)."""
    if not config.curation.sources:
        return None
    sources, eval_sources = source_specs(config.curation)
    return pipeline_inputs_sha256(sources, eval_sources, curate_options(config))


def cache_key(_task_run_context, inputs: dict) -> str | None:
    """A Prefect cache-key function over the curate task's `config`."""
    try:
        return inputs_sha256(inputs["config"])
    except (SourceError, OSError):
        # unreadable now: never reuse an old result; the task runs and fails with the source's error
        return f"unreadable-{uuid.uuid4().hex}"


def builtin_splits(problem_cfg, seed: int) -> dict:
    """The problem's built-in {"train", "eval"} splits as validated `datasets.Dataset`s of prompt rows."""
    problem = get_problem(problem_cfg.name)
    if problem.builtin_splits is None:
        raise ValueError(f"problem {problem.name!r} has no built-in prompts: name dataset sources in curation.sources")
    train, held_out = problem.builtin_splits(problem_cfg, seed)
    return {"train": to_dataset(train, f"{problem.name}/train"), "eval": to_dataset(held_out, f"{problem.name}/eval")}


def prepare(config, run_dir: str | Path) -> dict:
    """Write RUN/data (and, from sources, RUN/curation and RUN/quarantine.parquet); returns a reference."""
    run_dir = as_path(run_dir)
    if not config.curation.sources and get_problem(config.problem.name).generated is not None:
        sources, generated = write_generated(config, run_dir / "curation")
        return _curate_into_run(config, run_dir, sources, [], curate_options(config, generated), "problem.name")
    if not config.curation.sources:
        manifest = save_splits(run_dir / "data", builtin_splits(config.problem, config.seed))
        return {
            "uri": str(run_dir / "data"),
            "sha256": manifest["sha256"],
            "rows": {k: v["rows"] for k, v in manifest["splits"].items()},
        }

    sources, eval_sources = source_specs(config.curation)
    return _curate_into_run(config, run_dir, sources, eval_sources, curate_options(config), "curation.sources")


def _curate_into_run(config, run_dir, sources, eval_sources, options: CurateOptions, key: str) -> dict:
    """Curate `sources` into RUN/curation, RUN/quarantine.parquet and RUN/data (errors name `key`)."""
    out = run_dir / "curation"
    try:
        summary = curate(sources, out, eval_sources, options)
    except ValueError as err:
        if isinstance(err, SourceError):
            raise
        raise CurationError(
            f"{key}: {err} (the held-out split takes problem.eval_size = {config.problem.eval_size} rows)"
        ) from None
    write_frame(run_dir / "quarantine.parquet", read_frame(out / "quarantine.parquet"))
    if summary["train"] == 0:
        raise CurationError(
            f"{key}: no training rows kept of {summary['read']} read "
            f"({summary['quarantined']} quarantined, see {run_dir / 'quarantine.parquet'})"
        )
    problem = get_problem(config.problem.name)
    splits = {name: to_dataset(problem.run_rows(load_curated(out, name)), f"{out / name}.parquet") for name in SPLITS}
    manifest = save_splits(run_dir / "data", splits)
    counts = {
        k: summary[k] for k in ("read", "quarantined", "duplicates", "contaminated", "not_sampled", "train", "eval")
    }
    return {
        "uri": str(run_dir / "data"),
        "sha256": manifest["sha256"],
        "rows": {k: v["rows"] for k, v in manifest["splits"].items()},
        "inputs_sha256": summary["inputs_sha256"],
        "curation": counts,
        "quarantine_reasons": summary["quarantine_reasons"],
    }
