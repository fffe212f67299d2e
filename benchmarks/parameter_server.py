"""Parameter server and off-policy rollouts: store throughput, staleness overlap, Ray fan-out.

1. publish + pull of a weight version (checksums, manifest, LATEST flip, verified load) against a
   plain copy of the same bytes (write the file, read it back), on a local directory and on gs://
   (a local GCS emulator): ratio = plain seconds / ours (1.0 means no overhead).
2. Iteration wall time with rollout.max_staleness=1 against 0, same config, same warm start
   (median over iterations after the first few, which compile).
3. The same config with rollouts fanned out over a local Ray (rollout.shards workers).

    python benchmarks/parameter_server.py [--megabytes 64] [--iterations 30]

Prints figures, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from spotrl.chaos import run_attempt  # noqa: E402
from spotrl.flows.testing import harness_server, isolate_prefect  # noqa: E402
from spotrl.ports import free_port  # noqa: E402
from spotrl.storage.records import read_jsonl  # noqa: E402


def _params(megabytes: int) -> dict:
    rng = np.random.default_rng(0)
    n = megabytes * 2**20 // 4 // 8
    return {f"layer_{i}": {"kernel": rng.standard_normal(n, dtype=np.float32)} for i in range(8)}


def _store_throughput(root: str, params: dict, repeats: int = 3) -> dict:
    from safetensors.numpy import save

    from spotrl.storage.pytrees import flatten
    from spotrl.storage.weights import WeightStore

    store = WeightStore(root, keep=2)
    data = save(dict(flatten(params)))
    ours, plain = [], []
    for r in range(repeats):
        started = time.perf_counter()
        store.publish(r, params)
        store.load(r, params)
        ours.append(time.perf_counter() - started)
        started = time.perf_counter()
        target = f"{store.path}/plain_{r}.bin"
        store.fs.pipe_file(target, data)
        assert len(store.fs.cat_file(target)) == len(data)
        plain.append(time.perf_counter() - started)
    best_ours, best_plain = min(ours), min(plain)
    return {
        "megabytes": round(len(data) / 2**20, 1),
        "publish_pull_s": round(best_ours, 3),
        "plain_copy_s": round(best_plain, 3),
        "ratio_plain_over_ours": round(best_plain / best_ours, 3),
        "publish_pull_MB_per_s": round(len(data) / 2**20 / best_ours, 1),
    }


def _emulator():
    port = free_port()
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("gcp-storage-emulator")), "start", "--port", str(port), "--in-memory"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.environ.update(STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{port}", GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false")
    import gcsfs

    for _ in range(100):
        try:
            gcsfs.GCSFileSystem(skip_instance_cache=True).mkdir("bench")
            return process
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.3)
    raise RuntimeError("the GCS emulator did not start")


def _median_iteration_seconds(run_dir: Path, skip: int = 3) -> float:
    return statistics.median(m["seconds"] for m in read_jsonl(run_dir / "metrics.jsonl")[skip:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--megabytes", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=30)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="spotrl-bench-ps-"))
    figures = {}

    params = _params(args.megabytes)
    figures["store_local"] = _store_throughput(str(home / "weights"), params)
    emulator = _emulator()
    try:
        figures["store_gcs_emulator"] = _store_throughput("gs://bench/weights", params)
    finally:
        emulator.terminate()
    print(json.dumps(figures), flush=True)

    isolate_prefect(home / "prefect")
    base = [f"iterations={args.iterations}", "rollout.shards=2", "eval.prompts=16", "eval.every=0"]
    with harness_server() as api_url:
        env = {**os.environ, "PREFECT_API_URL": api_url}
        warm = home / "warm"
        assert run_attempt(warm, base[1:] + ["iterations=0"], env=env).returncode == 0
        timings = {}
        for name, extra in (("k0", []), ("k1", ["rollout.max_staleness=1"]), ("ray", ["rollout.task_runner=ray"])):
            run_dir = home / name
            started = time.perf_counter()
            attempt = run_attempt(run_dir, base + extra, env=env, extra_args=["--warm-start-from", str(warm)])
            assert attempt.returncode == 0, attempt.output
            timings[name] = {
                "median_iteration_s": round(_median_iteration_seconds(run_dir), 3),
                "wall_s": round(time.perf_counter() - started, 1),
            }
            print(name, timings[name], flush=True)
    figures["iteration"] = timings
    figures["k1_speedup_over_k0"] = round(timings["k0"]["median_iteration_s"] / timings["k1"]["median_iteration_s"], 3)
    figures["ray_over_threads_iteration_ratio"] = round(
        timings["ray"]["median_iteration_s"] / timings["k0"]["median_iteration_s"], 3
    )
    shutil.rmtree(home, ignore_errors=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
