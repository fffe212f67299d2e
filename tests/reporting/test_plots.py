"""make_report and `spotrl report`: PNGs that decode, one self-contained HTML page, on records written by
hand and on a real (smoke) run of the train flow."""

import argparse
import base64
import io
import json
import re
from pathlib import Path

import matplotlib.image
import pytest

from spotrl.cli import report as report_cli
from spotrl.reporting import plots
from spotrl.reporting import tensorboard as tb

FULL_PANELS = {"reward", "pass_at_k", "loss", "kl_entropy", "throughput", "staleness"}


def metric(i: int, **extra) -> dict:
    return {
        "iteration": i,
        "reward_mean": 0.1 * i,
        "shaped_reward_mean": 0.1 * i - 0.01,
        "loss": 1.0 / i,
        "clip_frac": 0.01 * i,
        "entropy": 2.0 - 0.05 * i,
        "kl": 0.001 * i,
        "tokens_per_s": 1000.0 + i,
        "seconds": 1.5,
        "timing": {"rollout_seconds": 0.5, "update_seconds": 0.75},
        **extra,
    }


def write_run(run_dir: Path, metrics: list[dict], evals: list[dict] = (), config: str | None = "seed: 7\n") -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    if evals:
        (run_dir / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    if config is not None:
        (run_dir / "config.yaml").write_text(config)
    return run_dir


def check_report(index: Path, panels: set[str], evals: list[dict]) -> str:
    """Every PNG decodes, as a file and as the data URI embedded in index.html; the eval rows are there."""
    page = index.read_text()
    assert {p.stem for p in index.parent.glob("*.png")} == panels
    for name in panels:
        image = matplotlib.image.imread(index.parent / f"{name}.png")
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
        assert f'href="{name}.png"' in page
    uris = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(uris) == len(panels)
    for data in uris:
        assert matplotlib.image.imread(io.BytesIO(base64.b64decode(data)), format="png").ndim == 3
    assert "<script" not in page and "http://" not in page and "https://" not in page
    rows = re.findall(r"<tr><td>(.*?)</td><td>(.*?)</td>", page)
    assert rows == [(str(e["iteration"]), str(e["weights_version"])) for e in evals]
    return page


def test_every_panel_and_the_eval_table(tmp_path):
    evals = [{"iteration": i, "weights_version": i, "pass_at_1": 0.25, "pass_at_k": 0.5, "k": 4} for i in (0, 5, 10)]
    metrics = [metric(i, staleness=1, importance_ratio_min=0.9, importance_ratio_max=1.1) for i in range(1, 11)]
    run_dir = write_run(tmp_path / "run", metrics, evals, config="model:\n  hidden_size: 64\n<b>: x\n")
    index = plots.make_report(run_dir)
    assert index == run_dir / "report" / "index.html"
    page = check_report(index, FULL_PANELS, evals)
    assert "<td>25.0%</td><td>50.0%</td>" in page
    assert "hidden_size: 64" in page and "&lt;b&gt;: x" in page  # the config, escaped


def test_one_iteration_and_no_eval_yet(tmp_path):
    run_dir = write_run(tmp_path / "run", [metric(1)], config=None)
    index = plots.make_report(run_dir, out=tmp_path / "elsewhere")
    assert index == tmp_path / "elsewhere" / "index.html"
    page = check_report(index, {"reward", "loss", "kl_entropy", "throughput"}, [])
    assert "No evaluation yet" in page


def test_a_panel_whose_keys_are_all_missing_is_left_out(tmp_path):
    metrics = [{"iteration": i, "reward_mean": 0.5, "loss": 0.1} for i in (1, 2)]  # a partial run, few keys
    metrics.append({"iteration": 3, "reward_mean": 0.6, "timing": {"rollout_seconds": 1.0}, "seconds": 2.0})
    index = plots.make_report(write_run(tmp_path / "run", metrics))
    check_report(index, {"reward", "loss", "throughput"}, [])
    table = plots.series_table(metrics, [])
    (throughput,) = [p for p in plots.present_panels(table) if p.name == "throughput"]
    assert [label for label, _, _ in throughput.axes[0].series] == ["rollout", "rest"]
    assert table["derived"]["rest_seconds"] == [(3, 1.0)]


def test_cli_prints_the_page_and_refuses_a_directory_without_metrics(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    args = argparse.Namespace(run_dir=str(empty), out=None)
    assert report_cli.run(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(empty / "metrics.jsonl") in err

    run_dir = write_run(tmp_path / "run", [metric(1), metric(2)])
    parser = argparse.ArgumentParser()
    report_cli.add_arguments(parser)
    assert report_cli.run(parser.parse_args(["--run-dir", str(run_dir), "--tensorboard"])) == 0
    assert capsys.readouterr().out.strip() == str(run_dir / "report" / "index.html")
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    tb.reset()


@pytest.mark.slow
def test_report_and_tensorboard_of_a_real_run(smoke_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from spotrl.flows import rundir

    evals = rundir.read_records(smoke_run, "eval")
    assert (smoke_run / "report" / "index.html").is_file()  # the flow made it at its end
    check_report(plots.make_report(smoke_run), FULL_PANELS, evals)

    # the flow wrote every point as it went: a later sync (a new process) finds nothing to add
    assert list((smoke_run / "tensorboard").glob("events.out.tfevents.*"))
    tb.reset(smoke_run)
    assert tb.sync_tensorboard(smoke_run) == 0
    tb.reset(smoke_run)
    accumulator = EventAccumulator(str(smoke_run / "tensorboard"))
    accumulator.Reload()
    metrics = rundir.read_records(smoke_run, "metrics")
    for tag, key in (
        ("train/reward_mean", "reward_mean"),
        ("train/loss", "loss"),
        ("train/tokens_per_s", "tokens_per_s"),
    ):
        got = [(e.step, e.value) for e in accumulator.Scalars(tag)]
        assert [s for s, _ in got] == [m["iteration"] for m in metrics]
        assert [v for _, v in got] == pytest.approx([m[key] for m in metrics], rel=1e-6)
    rollout = [e.value for e in accumulator.Scalars("train/timing/rollout_seconds")]
    assert rollout == pytest.approx([m["timing"]["rollout_seconds"] for m in metrics], rel=1e-6)
    assert [e.step for e in accumulator.Scalars("eval/pass_at_1")] == [e["iteration"] for e in evals]
