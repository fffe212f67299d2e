"""The `spotrl` command line: train, eval, digest, export, report, simulate, curate, verify."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from spotrl.storage.paths import as_path

DEFAULT_RUN_DIR = "runs/tiny"


def _seconds(text: str) -> float:
    """A duration in seconds: a finite number >= 0 (argparse turns the error into exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spotrl", description="Preemptible RL for LLMs on JAX, orchestrated by Prefect."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train with RL as a local Prefect flow run (resumes an unfinished run)")
    train.add_argument(
        "--config",
        help="a shipped preset by name (e.g. qwen2.5-0.5b) or a YAML file (default: tiny, the commented base)",
    )
    train.add_argument(
        "--run-dir",
        default=DEFAULT_RUN_DIR,
        help=f"run directory, local or gs://bucket/prefix (default: {DEFAULT_RUN_DIR})",
    )
    train.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set iterations=10 --set eval.k=4",
    )
    train.add_argument(
        "--verbose", action="store_true", help="show Prefect's own logs, and the traceback of an environment failure"
    )
    train.add_argument(
        "--warm-start-from",
        metavar="RUN_DIR",
        help="start a new run from another run's warm start (same seed/model/problem/warmstart settings); "
        "compare algorithms from one starting policy",
    )
    train.add_argument(
        "--grace-seconds",
        type=_seconds,
        default=25.0,
        help="on SIGTERM, how long the running stage may take to finish before the process exits "
        "(default 25; spot VMs get about 30 s of notice)",
    )

    sub.add_parser(
        "follow",
        help="a process other than 0 of a multi-host trainer: run the trainer's stages process 0 announces "
        "(SPOTRL_NUM_PROCESSES, SPOTRL_PROCESS_ID, SPOTRL_COORDINATOR_ADDRESS or SPOTRL_DISTRIBUTED=auto)",
    )

    ev = sub.add_parser("eval", help="pass@1 and pass@k of the newest published weights")
    ev.add_argument("--run-dir", required=True)
    ev.add_argument("--json", action="store_true", help="print one JSON object")

    digest = sub.add_parser("digest", help="sha256 of the newest published weights")
    digest.add_argument("--run-dir", required=True)

    export = sub.add_parser("export", help="write the newest published weights as a Hugging Face checkpoint")
    export.add_argument("--run-dir", required=True)
    export.add_argument(
        "--out", required=True, help="output directory (local or fsspec URL); must not exist or be empty"
    )
    export.add_argument("--version", type=int, help="weight version (default: LATEST)")
    export.add_argument("--dtype", choices=["float32", "bfloat16"], help="tensor dtype (default: the model's)")

    curate = sub.add_parser(
        "curate", help="curate prompt datasets: schema, quarantine, dedup, decontamination, mixing, splits"
    )
    curate.add_argument(
        "sources",
        nargs="+",
        metavar="SOURCE",
        help="[NAME=]PATH: .jsonl/.json/.parquet/.csv file or saved `datasets` directory, local or gs://",
    )
    curate.add_argument("--out", required=True, help="output directory (train/eval parquet, manifest, quarantine)")
    curate.add_argument(
        "--eval",
        dest="eval_sources",
        action="append",
        default=[],
        metavar="FILE",
        help="held-out evaluation set to decontaminate against (repeatable)",
    )
    curate.add_argument(
        "--map",
        dest="mappings",
        action="append",
        default=[],
        metavar="SOURCE.COL=FIELD",
        help="map a source column to id, prompt, answer or tests (e.g. gsm8k.question=prompt)",
    )
    curate.add_argument(
        "--weight",
        dest="weights",
        action="append",
        default=[],
        metavar="SOURCE=W",
        help="mix sources by weight (default: keep every row)",
    )
    curate.add_argument(
        "--split",
        dest="splits",
        action="append",
        default=[],
        metavar="SOURCE=SPLIT",
        help="split of a saved DatasetDict (default: train)",
    )
    curate.add_argument("--ngram", type=int, default=13, help="n-gram size for decontamination (default 13)")
    curate.add_argument("--seed", type=int, default=0)
    curate.add_argument(
        "--eval-fraction", type=float, default=0.05, help="share of rows in the eval split (default 0.05)"
    )
    curate.add_argument("--eval-size", type=int, help="rows in the eval split (instead of --eval-fraction)")
    curate.add_argument("--total", type=int, help="rows after mixing (default: as many as the weights allow)")
    curate.add_argument(
        "--max-prompt-tokens",
        type=int,
        help="quarantine rows whose prompt takes more tokens (default: what the default run config leaves a "
        "prompt, model.max_position_embeddings minus rollout.max_new_tokens)",
    )
    curate.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="count prompt tokens as a run with model.path=DIR does (its tokenizer.json, through its chat "
        "template); default: one per character, the built-in model's",
    )
    curate.add_argument("--force", action="store_true", help="curate again even if DIR is up to date")
    curate.add_argument("--json", action="store_true", help="print the counts as one JSON object")

    report = sub.add_parser("report", help="the run's curves as PNG plots and one HTML page (RUN/report/)")
    from spotrl.cli.report import add_arguments

    add_arguments(report)

    simulate = sub.add_parser(
        "simulate", help="the fleet simulator: time, cost, idle and lost work for W = 8..1024 rollout workers"
    )
    from spotrl.cli.simulate import add_arguments as add_simulate_arguments

    add_simulate_arguments(simulate)

    verify = sub.add_parser("verify", help="run one candidate through a verifier")
    verify_sub = verify.add_subparsers(dest="verifier", required=True)
    vcode = verify_sub.add_parser(
        "code", help="run a solution against assert tests in the sandbox; prints one JSON object"
    )
    vcode.add_argument("--solution", required=True, help="Python file with the candidate")
    vcode.add_argument("--tests", required=True, help="Python file of assert statements, run after the solution")
    vcode.add_argument("--timeout", type=float, default=10.0, help="wall-clock limit in seconds (default 10)")
    vcode.add_argument("--cpu-seconds", type=int, default=5, help="CPU-time limit (default 5)")
    vcode.add_argument("--memory-mb", type=int, default=512, help="address-space limit (default 512)")
    vcode.add_argument("--retries", type=int, default=2, help="retries of a sandbox failure (default 2)")
    vcode.add_argument(
        "--allow-weak-isolation",
        action="store_true",
        help="run even without namespaces (rlimits and an audit hook only)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {
            "train": _train,
            "follow": _follow,
            "eval": _eval,
            "digest": _digest,
            "export": _export,
            "curate": _curate,
            "report": _report,
            "simulate": _simulate,
            "verify": _verify,
        }[args.command](args)
    except BrokenPipeError:  # `spotrl simulate | head`: the reader left; no traceback, and none at exit's flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports a command killed by SIGPIPE
    except Exception as err:  # noqa: BLE001 - the CLI turns known errors into one clear line
        from spotrl.flows.local_server import LocalServerError
        from spotrl.storage.failures import EXIT_ENVIRONMENT, environment_failure

        if isinstance(err, LocalServerError):
            print(f"spotrl: error: {err}", file=sys.stderr)
            return EXIT_ENVIRONMENT

        failure = environment_failure(err, getattr(args, "run_dir", None))
        if failure is not None:
            if getattr(args, "verbose", False):
                import traceback

                traceback.print_exception(err)
            print(f"spotrl: error: {failure.line()}", file=sys.stderr)
            return EXIT_ENVIRONMENT

        from spotrl.config import ConfigError
        from spotrl.distributed import DistributedError
        from spotrl.flows.rundir import RunDirError
        from spotrl.model.hf.config import CheckpointError as ModelCheckpointError
        from spotrl.storage.checkpoints import CheckpointError
        from spotrl.storage.records import RecordError
        from spotrl.storage.weights import WeightStoreError

        known = (
            ConfigError,
            RunDirError,
            WeightStoreError,
            CheckpointError,
            ModelCheckpointError,
            DistributedError,
            RecordError,
        )
        if isinstance(err, known):
            print(f"spotrl: error: {err}", file=sys.stderr)
            return 2
        raise


def _train(args) -> int:
    from spotrl import distributed
    from spotrl.configs import load_config

    distributed.initialize()  # before any JAX computation; a no-op for one process
    config = load_config(args.config, args.overrides)  # bad config fails before Prefect starts
    if not distributed.is_primary():  # every host runs the same command; process 0 drives the run
        return _follow(args)
    if config.model.path:  # so does a bad checkpoint (headers only, no tensor data read)
        from spotrl.model.hf.loader import check_checkpoint

        check_checkpoint(config.model)
    if not args.verbose:
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from spotrl.flows import rundir
    from spotrl.flows.local_server import local_api_server
    from spotrl.flows.preemption import EXIT_PREEMPTED, Preempted
    from spotrl.flows.train import train

    if not args.verbose:
        from spotrl.cli.console import quiet

        quiet()

    try:
        # the lock first: a second process on this directory is refused at once, before it seeds or
        # writes anything (the flow takes the same lock again: it is this process's already)
        with rundir.exclusive(args.run_dir):
            if args.warm_start_from and not (as_path(args.run_dir) / "checkpoints").exists():
                from spotrl.flows.resume import seed_from_warm_start

                seed_from_warm_start(Path(args.run_dir), config, Path(args.warm_start_from))
            rundir.prepare(args.run_dir, config)  # a mismatching run directory is refused before any work
            with local_api_server():
                result = train(config=config, run_dir=args.run_dir, preemption_grace_seconds=args.grace_seconds)
    except Preempted as stop:
        print(f"spotrl: {stop}", file=sys.stderr)
        return EXIT_PREEMPTED
    from spotrl.flows.artifacts import summary_table

    print(summary_table(result))
    return 0


def _follow(args) -> int:
    """Run the trainer stages process 0's flow announces (spotrl/tasks/spmd.py) until it stops."""
    from spotrl import distributed
    from spotrl.distributed import DistributedError
    from spotrl.tasks import spmd, stages  # noqa: F401 - importing the stages registers them

    if distributed.initialize() is None:
        raise DistributedError(
            "spotrl follow: not a multi-process run (set SPOTRL_NUM_PROCESSES, SPOTRL_PROCESS_ID and "
            "SPOTRL_COORDINATOR_ADDRESS, or SPOTRL_DISTRIBUTED=auto)"
        )
    if distributed.is_primary():
        raise DistributedError("spotrl follow: this is process 0, which runs the flow (`spotrl train`)")
    spmd.follow()
    return 0


def _eval(args) -> int:
    from spotrl.flows import rundir
    from spotrl.storage.weights import WeightStore
    from spotrl.tasks.stages import evaluate

    config = rundir.read_config(args.run_dir)
    store = WeightStore(as_path(args.run_dir) / "weights")
    version = store.resolve(None)
    ref = {"version": version, "sha256": store.digest(version)}
    result = evaluate.fn(config, str(as_path(args.run_dir).resolve()), ref, version)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(
            f"weights v{version}: pass@1 {result['pass_at_1']:.1%}  pass@{result['k']} {result['pass_at_k']:.1%}"
            f"  ({result['prompts']} held-out prompts, n={result['n']})"
        )
    return 0


def _digest(args) -> int:
    from spotrl.storage.weights import WeightStore

    store = WeightStore(as_path(args.run_dir) / "weights")
    print(store.verified_digest())
    return 0


def _export(args) -> int:
    from flax import nnx

    from spotrl.flows import rundir
    from spotrl.model.hf.config import CheckpointError
    from spotrl.model.hf.export import export_checkpoint
    from spotrl.model.policy import abstract_model
    from spotrl.problems import get_problem
    from spotrl.storage.weights import WeightStore

    config = rundir.read_config(args.run_dir)
    store = WeightStore(as_path(args.run_dir) / "weights")
    version = store.resolve(args.version)
    params = store.load(version, nnx.to_pure_dict(abstract_model(config.model)[1]))
    # a run from a checkpoint keeps its tokenizer files; the built-in model gets the character tokenizer's
    tokenizer = (
        {"tokenizer_from": config.model.path}
        if config.model.path
        else {"tokenizer": get_problem(config.problem.name).tokenizer()}
    )
    try:
        out = export_checkpoint(params, config.model, args.out, dtype=args.dtype, **tokenizer)
    except (CheckpointError, FileExistsError, ValueError) as err:
        print(f"spotrl: error: {err}", file=sys.stderr)
        return 2
    print(f"weights v{version} of {args.run_dir} -> {out}")
    return 0


def _curate(args) -> int:
    from spotrl.cli.curate import run

    return run(args)


def _report(args) -> int:
    from spotrl.cli.report import run

    return run(args)


def _simulate(args) -> int:
    from spotrl.cli.simulate import run

    return run(args)


def _verify(args) -> int:
    from spotrl.cli.verify import run_code

    return run_code(args)


if __name__ == "__main__":
    sys.exit(main())
