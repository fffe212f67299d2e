"""Calibration from a run's metrics (hand-computed records), and the simulator against a real run."""

from __future__ import annotations

import base64
import json
import shutil

import pytest

from spotrl.config import RunConfig
from spotrl.fleet.calibrate import calibrate, measure, model_from, objective_for, validate
from spotrl.fleet.fleet_model import Network
from spotrl.fleet.sizing import Objective

NO_NETWORK = Network(weight_bytes=0.0)


def record(iteration, tokens, rollout, update, seconds, compilations=0, **timing):
    return {
        "iteration": iteration,
        "rollout_tokens": tokens,
        "seconds": seconds,
        "completion_length_mean": 5.0,
        "timing": {"rollout_seconds": rollout, "update_seconds": update, "compilations": compilations, **timing},
    }


# 2 shards. Steady iterations 2 and 3: 400 tokens, 200 per shard, in 0.5 + 1.5 s of sampling -> 100 tok/s
# per worker; update 0.8 s / 400 tokens -> 0.002 s/token; the rest 1.0 - 0.5 - 0.2 = 0.3 and
# 2.5 - 1.5 - 0.6 = 0.4 -> 0.35 s. Iteration 1 compiled: its 100 tokens per shard take 1 s at the steady
# rate, 3 s measured -> 2 s cold start; its update 2 s, 0.4 s at the steady rate -> 1.6 s, and its rest
# 6 - 3 - 2 = 1 s, 0.65 s more than steady -> the trainer's cold start 2.25 s.
RECORDS = [
    record(3, 300, 1.5, 0.6, 2.5),
    record(1, 200, 3.0, 2.0, 6.0, compilations=5),
    record(2, 100, 0.5, 0.2, 1.0),
]
CONFIG = RunConfig.model_validate({"rollout": {"shards": 2, "prompts_per_iteration": 8, "group_size": 4}})


def test_measure_by_hand():
    m = measure(RECORDS, CONFIG, NO_NETWORK)
    assert (m.iterations, m.steady_iterations) == (3, 2)
    assert m.worker_tokens_per_s == pytest.approx(100)
    assert m.update_s_per_token == pytest.approx(0.002)
    assert m.trainer_overhead_s == pytest.approx(0.35)
    assert m.worker_cold_start_s == pytest.approx(2.0)
    assert m.trainer_cold_start_s == pytest.approx(1.6 + 0.65)
    assert m.tokens_per_iteration == pytest.approx(200)


def test_measure_takes_out_the_modelled_publish_and_bounded_waves():
    # a 0.1 s publish and a 0.05 s pull are modelled on their own: the overhead keeps the rest
    network = Network(weight_bytes=1e8, publish_bytes_per_s=1e9, pull_bytes_per_s=2e9)
    assert measure(RECORDS, CONFIG, network).trainer_overhead_s == pytest.approx(0.35 - 0.15)
    # one worker at a time: two waves of sampling per iteration, 0.3 - 0.5 -> 0 and 0.4 - 1.5 -> 0
    one = CONFIG.model_copy(update={"rollout": CONFIG.rollout.model_copy(update={"workers": 1})})
    assert measure(RECORDS, one, NO_NETWORK).trainer_overhead_s == 0.0
    # the count each iteration ran with (timing.fleet.workers) wins over the config's
    auto = [{**r, "timing": {**r["timing"], "fleet": {"workers": 2}}} for r in RECORDS]
    assert measure(auto, one, NO_NETWORK).trainer_overhead_s == pytest.approx(0.35)


def test_measure_without_records_or_steady_iterations():
    assert measure([], CONFIG, NO_NETWORK) is None
    m = measure([RECORDS[1]], CONFIG, NO_NETWORK)  # only a compiling iteration: it is all there is
    assert m.worker_tokens_per_s == pytest.approx(100 / 3.0) and m.worker_cold_start_s == 0.0


def test_model_from_a_config_and_measurements():
    fleet = {"spot_price_per_hour": 2.0, "trainer_price_per_hour": 10.0, "cold_start_seconds": 42.0}
    config = RunConfig.model_validate({**CONFIG.model_dump(), "fleet": fleet})
    model = model_from(config, measure(RECORDS, config, NO_NETWORK), 1e6, lengths=(3, 4, 5))
    assert (model.workload.prompts, model.workload.group_size, model.workload.shards) == (8, 4, 2)
    assert model.workload.lengths.samples == (3, 4, 5) and model.workload.lengths.max_tokens == 8
    assert (model.worker.tokens_per_s, model.worker.cold_start_s) == (pytest.approx(100), 42.0)
    assert (model.market.spot_per_hour, model.market.trainer_per_hour, model.network.weight_bytes) == (2, 10, 1e6)
    assert objective_for(config.fleet) == Objective("min_cost", None, 0.1, None)


def test_rollout_workers_config():
    assert RunConfig().rollout.workers is None
    assert RunConfig.model_validate({"rollout": {"workers": "auto"}}).rollout.workers == "auto"
    for bad in (0, "many"):
        with pytest.raises(ValueError, match="rollout.workers"):
            RunConfig.model_validate({"rollout": {"workers": bad}})
    with pytest.raises(ValueError, match="fleet.deadline_seconds"):
        RunConfig.model_validate({"fleet": {"deadline_seconds": -1}})
    # keys that keep their default leave a config's identity as it was; a set one changes it
    assert RunConfig.model_validate({"rollout": {"workers": 4}}).digest() != RunConfig().digest()


@pytest.mark.slow
def test_simulator_predicts_the_runs_iteration_time_within_15_percent(smoke_run, tmp_path, capsys):
    """Calibrated on a real run (the smoke preset, two iterations), simulated as it ran."""
    calibration = calibrate(smoke_run)
    assert calibration.measured.iterations == 2
    assert len(calibration.model.workload.lengths.samples) == 2 * 8 * 4  # every completion of both iterations
    check = validate(calibration)
    print(f"validation: predicted {check.predicted_seconds:.3f} s, measured {check.actual_seconds:.3f} s")
    assert check.error < 0.15, check

    from spotrl.cli.main import main

    run = tmp_path / "run"  # a copy: the shared run's report/ is checked by the report's own test
    shutil.copytree(smoke_run, run)
    assert main(["simulate", "--run-dir", str(run), "--iterations", "2", "--json"]) == 0
    out = capsys.readouterr().out
    assert "error" in out and (run / "report" / "fleet_simulation.png").stat().st_size > 10_000
    rows = json.loads(out.strip().splitlines()[-1])["rows"]
    assert sorted({(r["fleet_size"], r["policy"]) for r in rows}) == sorted(
        (w, p) for w in (8, 64, 256, 1024) for p in ("fixed", "cost_aware", "async_k1", "async_k2")
    )
    saved = json.loads((run / "report" / "fleet_simulation.json").read_text())
    assert saved["validation"]["error"] == pytest.approx(check.error)
    # the run's report page now shows the plot, embedded as the PNG's own bytes
    page = (run / "report" / "index.html").read_text()
    png = base64.b64encode((run / "report" / "fleet_simulation.png").read_bytes()).decode()
    assert 'href="fleet_simulation.png"' in page and png in page


def test_simulate_cli_without_a_run(tmp_path, capsys):
    from spotrl.cli.main import main

    args = ["simulate", "--sizes", "8,64", "--iterations", "2", "--out", str(tmp_path)]
    assert main([*args, "--set", "workload.prompts=64"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.split()[0] in ("8", "64") for line in lines if line.strip()) == 8
    assert (tmp_path / "fleet_simulation.png").exists()
    assert main([*args, "--set", "worker.speed=1"]) == 2
    assert "worker.speed" in capsys.readouterr().err
    assert main(["simulate", "--run-dir", str(tmp_path / "none")]) == 2
