"""`spotrl simulate [--run-dir RUN] [--set KEY=VALUE ...]`: the fleet simulator over fleet sizes and policies.

With --run-dir the fleet model is calibrated on that run's measurements (spotrl/fleet/calibrate.py),
checked against the run's own mean iteration time (printed), and the plots go to RUN/report/
next to what `spotrl report` writes; without it the model is the built-in long-tailed example
(spotrl/fleet/fleet_model.py). `--set` overrides any model number after calibration, e.g.
`--set workload.prompts=1024 --set worker.sequence_tokens_per_s=30 --set market.spot=false`.
Prints the table of time per iteration, cost per iteration, idle fraction and work lost to
preemptions for W = 8, 64, 256, 1024 under each policy (fixed, cost_aware, async_k1, async_k2).

Exit codes: 0 done; 2 no usable run directory, or a bad --set key (one line on stderr).
"""

from __future__ import annotations

import dataclasses
import json
import sys


def add_arguments(parser) -> None:
    parser.add_argument("--run-dir", help="calibrate on this run directory (default: the built-in example)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a fleet model number, e.g. worker.tokens_per_s=2500 or market.preemptions_per_hour=0.1",
    )
    parser.add_argument("--iterations", type=int, default=10, help="iterations simulated per row (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--sizes", default="8,64,256,1024", help="fleet sizes W, comma separated (default 8,64,256,1024)"
    )
    parser.add_argument("--out", help="where to write the plot and JSON (default RUN/report with --run-dir)")
    parser.add_argument("--json", action="store_true", help="also print the rows as one JSON object")


def run(args) -> int:
    from spotrl.fleet.fleet_model import LONG_TAILED, as_dict, with_overrides
    from spotrl.fleet.sweep import format_table, sweep, target_check, write_outputs
    from spotrl.storage.paths import as_path

    extra: dict = {}
    title = "fleet simulation: built-in long-tailed example"
    model = LONG_TAILED
    if args.run_dir:
        from spotrl.fleet.calibrate import calibrate, validate

        try:
            calibration = calibrate(args.run_dir)
        except (FileNotFoundError, ValueError) as err:
            print(f"spotrl simulate: error: {err}", file=sys.stderr)
            return 2
        extra["measured"] = dataclasses.asdict(calibration.measured)
        try:
            check = validate(calibration, args.seed)
        except ValueError as err:  # a staleness the simulator's policies do not cover: no replay
            print(f"calibrated on {args.run_dir}; not replayed: {err}")
        else:
            print(
                f"calibrated on {args.run_dir}: {calibration.measured.iterations} iterations; simulated as it "
                f"ran, {check.predicted_seconds:.3f} s per iteration against {check.actual_seconds:.3f} s "
                f"measured (error {check.error:.1%})"
            )
            extra["validation"] = dataclasses.asdict(check)
        # a fleet gives each worker its own shard: the run's fixed shard count does not carry over
        model = dataclasses.replace(
            calibration.model, workload=dataclasses.replace(calibration.model.workload, shards=None)
        )
        title = f"fleet simulation calibrated on {as_path(args.run_dir).name}"
    try:
        model = with_overrides(model, dict(_pair(item) for item in args.overrides))
        sizes = tuple(int(s) for s in args.sizes.split(",") if s)
    except (KeyError, ValueError) as err:
        print(f"spotrl simulate: error: {err.args[0] if err.args else err}", file=sys.stderr)
        return 2
    results = sweep(model, sizes, iterations=args.iterations, seed=args.seed)
    print(format_table(results))
    check = target_check(results)
    print(
        f"cost_aware at W={check['fleet_size']} (uses {check['cost_aware_workers']:.0f}): "
        f"{check['cost_saving']:.1%} cheaper than fixed W={check['fleet_size']}, "
        f"{check['time_ratio']:.2f}x its time per iteration"
    )
    extra.update(model=as_dict(model), target=check, iterations=args.iterations, seed=args.seed)
    out = args.out or (str(as_path(args.run_dir) / "report") if args.run_dir else None)
    if out:
        print(write_outputs(results, out, title, extra))
        if args.run_dir and not args.out:  # the run's report page shows the plot from now on
            from spotrl.reporting.plots import make_report

            print(make_report(args.run_dir))
    if args.json:
        from spotrl.fleet.sweep import as_rows

        print(json.dumps({"rows": as_rows(results), "target": check}, sort_keys=True))
    return 0


def _pair(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep:
        raise ValueError(f"--set {item!r}: expected KEY=VALUE")
    return key.strip(), value.strip()
