"""Curation end to end: sources in, a clean, deduplicated, decontaminated, mixed and split dataset out.

    read -> canonical schema, the problem's checks, the prompt's length (bad rows -> quarantine)
         -> exact/normalised dedup -> decontaminate against the held-out eval set -> mix by weight -> train/eval split
         -> write (manifest last)

The train and eval splits share no prompt, exactly or after normalisation (dedup runs first). They
are not n-gram-decontaminated against each other: templated problems (the built-in code problem) share
long n-grams between distinct problems, and removing those would empty the split.

`curate` returns the summary (also stored in the manifest): rows read, quarantined (by reason),
duplicates, contaminated, not sampled, kept, per source. With the same inputs (source contents,
mappings, options) a second call finds the output up to date and rewrites nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from spotrl.curation import manifest as mf
from spotrl.curation.canonical import QUARANTINE_COLUMNS, canonicalize
from spotrl.curation.decontam import NgramIndex, decontaminate
from spotrl.curation.dedup import REMOVED_COLUMNS, drop_duplicates
from spotrl.curation.mixing import mix, split
from spotrl.curation.prompt_limit import PromptLimit
from spotrl.curation.schema import CANONICAL_COLUMNS
from spotrl.curation.sources import SourceError, SourceSpec, read_source


@dataclass(frozen=True)
class CurateOptions:
    seed: int = 0
    ngram: int = 13
    eval_fraction: float = 0.05
    eval_size: int | None = None
    total: int | None = None
    weights: dict = field(default_factory=dict)  # source name -> weight; empty: keep every row
    require: str | None = None  # the field a training problem's verifier needs ("answer" or "tests")
    alphabet: str | None = None  # the characters its tokenizer encodes; rows with others are quarantined
    reference_is_text: bool = True  # the answer is checked against the alphabet too (not a JSON reference)
    prompt_limit: PromptLimit | None = None  # rows whose prompt takes more tokens are quarantined


def curate(
    sources: list[SourceSpec],
    out: str | Path,
    eval_sources: list[SourceSpec] = (),
    options: CurateOptions = CurateOptions(),
    force: bool = False,
) -> dict:
    names = [s.name for s in sources] + [s.name for s in eval_sources]
    if len(set(names)) != len(names):
        raise SourceError(f"source names must be distinct: {names} (name them with NAME=PATH)")
    if not sources:
        raise SourceError("no sources")
    unknown = sorted(set(options.weights) - {s.name for s in sources})
    if unknown:
        raise SourceError(f"--weight for unknown source(s) {unknown}; sources are {[s.name for s in sources]}")
    raws = [read_source(s) for s in sources]
    eval_raws = [read_source(s) for s in eval_sources]
    inputs, inputs_sha256 = _inputs(raws, eval_raws, options)
    if not force and (done := mf.up_to_date(out, inputs_sha256)) is not None:
        return {**done["summary"], "up_to_date": True}

    too_long = options.prompt_limit.checker() if options.prompt_limit is not None else None
    per_source, goods, quarantines, reasons = {}, [], [], {}
    for raw in raws:
        good, bad, kinds = canonicalize(raw, options.require, options.alphabet, options.reference_is_text, too_long)
        goods.append(good)
        quarantines.append(bad.assign(role="train"))
        for kind, n in kinds.items():
            reasons[kind] = reasons.get(kind, 0) + n
        per_source[raw.spec.name] = {"read": raw.rows_read, "quarantined": len(bad), "valid": len(good)}

    eval_prompts, eval_quarantined = [], 0
    for raw in eval_raws:
        good, bad, _ = canonicalize(raw)
        eval_prompts.extend(good["prompt"])
        quarantines.append(bad.assign(role="eval"))
        eval_quarantined += len(bad)

    pool = pd.concat(goods, ignore_index=True)
    pool, removed_dup, dup_counts = drop_duplicates(pool)
    index = NgramIndex(eval_prompts, options.ngram)
    pool, removed_contam = decontaminate(pool, index) if eval_prompts else (pool, _empty_removed())
    frames = {s.name: pool[pool["source"] == s.name] for s in sources}
    mixed, taken = mix(frames, options.weights or None, options.seed, options.total)
    train, held_out = split(mixed, options.seed, options.eval_fraction, options.eval_size)

    for name, counts in per_source.items():
        counts["duplicates"] = _count(removed_dup, name, ("duplicate", "near_duplicate"))
        counts["contaminated"] = _count(removed_contam, name, ("contaminated",))
        counts["not_sampled"] = len(frames[name]) - taken[name]
        counts["train"] = int((train["source"] == name).sum())
        counts["eval"] = int((held_out["source"] == name).sum())
    quarantine = pd.concat(quarantines, ignore_index=True)[list(QUARANTINE_COLUMNS) + ["role"]]
    removed = pd.concat([removed_dup, removed_contam], ignore_index=True)[REMOVED_COLUMNS]
    summary = {
        "read": sum(r.rows_read for r in raws),
        "quarantined": sum(c["quarantined"] for c in per_source.values()),
        "quarantine_reasons": dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        "duplicates": dup_counts,
        "contaminated": len(removed_contam),
        "not_sampled": sum(c["not_sampled"] for c in per_source.values()),
        "kept": len(train) + len(held_out),
        "train": len(train),
        "eval": len(held_out),
        "per_source": per_source,
        "eval_set": {
            "prompts": len(eval_prompts),
            "quarantined": eval_quarantined,
            "ngram": options.ngram,
            "files": [s.path for s in eval_sources],
        },
        "inputs_sha256": inputs_sha256,
    }
    manifest = mf.write_curated(
        out,
        {"train": train[list(CANONICAL_COLUMNS)], "eval": held_out[list(CANONICAL_COLUMNS)]},
        quarantine,
        removed,
        summary,
        inputs,
        inputs_sha256,
    )
    return {**manifest["summary"], "up_to_date": False}


def inputs_sha256(
    sources: list[SourceSpec], eval_sources: list[SourceSpec] = (), options: CurateOptions = CurateOptions()
) -> str:
    """The hash `curate` records as `inputs_sha256` (source contents, mappings, options): what a
    Prefect task caches curation on, so it re-runs only when an input changed."""
    return _inputs([read_source(s) for s in sources], [read_source(s) for s in eval_sources], options)[1]


def _inputs(raws, eval_raws, options: CurateOptions) -> tuple[dict, str]:
    describe = lambda raw: {**raw.spec.describe(), "format": raw.format, "sha256": raw.sha256}  # noqa: E731
    inputs = {
        "sources": [describe(r) for r in raws],
        "eval": [describe(r) for r in eval_raws],
        "options": asdict(options),
    }
    return inputs, mf.inputs_hash(inputs["sources"], inputs["eval"], inputs["options"])


def _empty_removed() -> pd.DataFrame:
    return pd.DataFrame([], columns=REMOVED_COLUMNS)


def _count(removed: pd.DataFrame, source: str, reasons: tuple[str, ...]) -> int:
    if removed.empty:
        return 0
    return int(((removed["source"] == source) & removed["reason"].isin(reasons)).sum())
