"""`spotrl report --run-dir DIR [--out DIR] [--tensorboard]`: the curves of a run as PNGs and one HTML page.

Writes DIR/report/ (or --out): one PNG per panel and index.html, which embeds them (one file that
opens anywhere), the resolved config and the eval table; prints the path of index.html.

`run(args)` expects on `args` (an argparse Namespace; `add_arguments` declares them):
    run_dir      str: the run directory, local or gs://bucket/prefix
    out          str | None: where to write the report (default RUN/report)
    tensorboard  bool, optional (default False): also append the records missing from RUN/tensorboard;
                 not while the run is training (the train flow writes them itself)

Exit codes: 0 written; 2 no metrics.jsonl in the run directory, or an unreadable store (one line on stderr).
"""

from __future__ import annotations

import sys


def add_arguments(parser) -> None:
    parser.add_argument("--run-dir", required=True, help="the run directory (local or gs://bucket/prefix)")
    parser.add_argument("--out", default=None, help="where to write the report (default RUN_DIR/report)")
    parser.add_argument(
        "--tensorboard",
        action="store_true",
        help="also append what RUN_DIR/tensorboard lacks (not while the run is training)",
    )


def run(args) -> int:
    from spotrl.reporting.plots import make_report
    from spotrl.storage.paths import StorageError

    try:
        index = make_report(args.run_dir, getattr(args, "out", None))
        if getattr(args, "tensorboard", False):
            from spotrl.reporting.tensorboard import sync_tensorboard

            sync_tensorboard(args.run_dir)
    except (FileNotFoundError, StorageError) as err:
        print(f"spotrl report: error: {err}", file=sys.stderr)
        return 2
    print(index)
    return 0
