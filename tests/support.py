"""What tests share besides fixtures: the tiny run's overrides, a GCS bucket on the emulator, a real ENOSPC.

Imported as `from support import ...` (tests/ is on sys.path, as for conftest.py); fixtures stay in
conftest.py.
"""

from __future__ import annotations

import yaml

from spotrl.configs import preset_path

# A run small enough to learn arithmetic in a few iterations: the algorithm presets and the Ray
# fan-out train on it.
LEARNING_OVERRIDES = [
    "model.hidden_size=64",
    "model.intermediate_size=128",
    "model.num_layers=2",
    "problem.min_digits=1",
    "problem.max_digits=2",
    "problem.train_size=32",
    "problem.eval_size=16",
    "warmstart.check_prompts=32",
    "warmstart.batch_size=32",
    "rollout.prompts_per_iteration=32",
    "rollout.group_size=8",
    "algorithm.minibatches=2",
    "eval.n=4",
    "eval.k=2",
    "eval.prompts=16",
    "optimizer.learning_rate=1e-3",
]


def _dotted(node: dict, prefix: str = "") -> list[str]:
    """A nested mapping as `--set` overrides: {"model": {"num_layers": 2}} -> ["model.num_layers=2"]."""
    out = []
    for key, value in node.items():
        out += _dotted(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}={value}"]
    return out


# the shipped `smoke` preset as overrides: two RL iterations of a 2-layer model, the whole flow in seconds
TINY_OVERRIDES = _dotted(yaml.safe_load(preset_path("smoke").read_text()))


def make_bucket(fs, name: str) -> str:
    """Create a bucket on the emulator (once); returns its gs:// URL."""
    if not fs.exists(name):
        fs.mkdir(name)
    return f"gs://{name}"


def full_device_error() -> OSError:
    """A real ENOSPC, from the kernel: a write to /dev/full."""
    try:
        with open("/dev/full", "wb") as full:  # every write fails with ENOSPC
            full.write(b"x")
    except OSError as err:
        return err
    raise AssertionError("/dev/full accepted a write")
