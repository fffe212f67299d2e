"""What the benchmark scripts share: the issue-7 model, best-of-N timing, and running a worker in a child.

Imports nothing heavy: a transformers worker must import torch before jax (torch imported after
jax runs several times slower on these two cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from spotrl.config import ModelConfig

# Qwen2-shaped (q/k/v biases), vocab 512, hidden 256, MLP 768, 4 layers, 8 heads, 2 KV heads, tied, float32
CONFIG = ModelConfig(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=768,
    num_layers=4,
    num_heads=8,
    num_kv_heads=2,
    tie_embeddings=True,
    qkv_bias=True,
    dtype="float32",
    rope_theta=1_000_000.0,
)


def time_best(fn, repeats: int) -> tuple[float, float]:
    """(first call seconds, best of `repeats` further calls)."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return first, best


def run_child(script: str, *args: str, env: dict | None = None, cwd: str | None = None) -> dict:
    """Run `script` with `args` in a fresh process (no XLA thread pools competing with torch's);
    returns the JSON object its last stdout line holds."""
    cmd = [sys.executable, os.path.abspath(script), *args]
    done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env=env, cwd=cwd)
    return json.loads(done.stdout.strip().splitlines()[-1])
