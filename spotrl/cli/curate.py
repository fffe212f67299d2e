"""`spotrl curate SOURCE... --out DIR`: the command behind the parser lines in spotrl/cli/main.py.

Exit codes: 0 curated (or already up to date), 1 nothing kept (every row quarantined, duplicate or
contaminated; the quarantine is still written), 2 bad arguments or an unreadable source.
"""

from __future__ import annotations

import json
import sys


def _pairs(values: list[str], flag: str, sep: str = "=") -> list[tuple[str, str]]:
    out = []
    for value in values:
        key, ok, rest = value.partition(sep)
        if not ok or not key or not rest:
            raise ValueError(
                f"{flag} {value!r}: expected {'SOURCE.COLUMN=FIELD' if flag == '--map' else 'SOURCE=VALUE'}"
            )
        out.append((key, rest))
    return out


def build_specs(args):
    """(sources, eval sources, options) from the parsed arguments; ValueError names the bad argument."""
    from spotrl.config import RunConfig
    from spotrl.curation.pipeline import CurateOptions
    from spotrl.curation.prompt_limit import PromptLimit
    from spotrl.curation.sources import SourceSpec, parse_source_arg

    named = [parse_source_arg(a) for a in args.sources]
    eval_named = [parse_source_arg(a) for a in args.eval_sources]
    names = {name for name, _ in named + eval_named}
    mappings: dict[str, dict[str, str]] = {name: {} for name in names}
    for left, field in _pairs(args.mappings, "--map"):
        source, dot, column = left.partition(".")
        if not dot or not column:
            raise ValueError(f"--map {left}={field}: expected SOURCE.COLUMN=FIELD")
        if source not in mappings:
            raise ValueError(f"--map {left}={field}: no source named {source!r} (sources: {', '.join(sorted(names))})")
        mappings[source][column] = field
    splits = dict(_pairs(args.splits, "--split"))
    weights = {}
    for name, value in _pairs(args.weights, "--weight"):
        try:
            weights[name] = float(value)
        except ValueError:
            raise ValueError(f"--weight {name}={value}: not a number") from None
    for name in list(splits) + list(weights):
        if name not in names:
            raise ValueError(f"no source named {name!r} (sources: {', '.join(sorted(names))})")
    spec = lambda name, path: SourceSpec(name, path, mappings[name], split=splits.get(name))  # noqa: E731
    if args.max_prompt_tokens is not None and args.max_prompt_tokens <= 0:
        raise ValueError(f"--max-prompt-tokens {args.max_prompt_tokens}: must be at least 1")
    default = PromptLimit.of_run(RunConfig())
    limit = PromptLimit(
        default.tokens if args.max_prompt_tokens is None else args.max_prompt_tokens,
        f"the default run config's {default.why}" if args.max_prompt_tokens is None else "--max-prompt-tokens",
        args.tokenizer,
    )
    options = CurateOptions(
        seed=args.seed,
        ngram=args.ngram,
        eval_fraction=args.eval_fraction,
        eval_size=args.eval_size,
        total=args.total,
        weights=weights,
        prompt_limit=limit,
    )
    return [spec(n, p) for n, p in named], [spec(n, p) for n, p in eval_named], options


def run(args) -> int:
    from spotrl.curation.pipeline import curate
    from spotrl.curation.sources import SourceError

    try:
        sources, eval_sources, options = build_specs(args)
        summary = curate(sources, args.out, eval_sources, options, force=args.force)
    except (SourceError, ValueError) as err:
        print(f"spotrl curate: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(summary, sort_keys=True) if args.json else report(summary, args.out))
    return 0 if summary["kept"] > 0 else 1


def report(s: dict, out: str) -> str:
    lines = ["up to date (same inputs): nothing rewritten" if s.get("up_to_date") else f"curated -> {out}"]
    cols = ("read", "quarantined", "duplicates", "contaminated", "not_sampled", "train", "eval")
    rows = [("source",) + cols] + [(name,) + tuple(str(c[k]) for k in cols) for name, c in s["per_source"].items()]
    rows.append(
        (
            "total",
            str(s["read"]),
            str(s["quarantined"]),
            str(sum(s["duplicates"].values())),
            str(s["contaminated"]),
            str(s["not_sampled"]),
            str(s["train"]),
            str(s["eval"]),
        )
    )
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols) + 1)]
    lines += [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths)))
        for r in rows
    ]
    lines.append(f"kept {s['kept']} of {s['read']} rows read: {s['train']} train, {s['eval']} eval")
    lines.append(f"duplicates: {s['duplicates']['exact']} exact, {s['duplicates']['normalised']} normalised")
    ev = s["eval_set"]
    if ev["files"]:
        lines.append(
            f"contaminated: {s['contaminated']} ({ev['ngram']}-gram overlap with {ev['prompts']} held-out "
            f"prompts of {', '.join(ev['files'])})"
        )
    else:
        lines.append("contaminated: not checked (no --eval set)")
    if s["quarantine_reasons"]:
        lines.append(f"quarantined {s['quarantined']} rows ({out}/quarantine.parquet):")
        lines += [f"  {n:6d}  {reason}" for reason, n in s["quarantine_reasons"].items()]
    lines.append(f"sha256 {s['sha256']}")
    return "\n".join(lines)
