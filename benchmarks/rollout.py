"""Rollout throughput: our sampler with and without shared-prefix prefill against transformers.

    python benchmarks/rollout.py [--repeats N] [--skip-transformers]

Model: Qwen2-shaped (q/k/v biases), vocab 512, hidden 256, MLP 768, 4 layers, 8 heads, 2 KV
heads, tied embeddings, float32, random init. Workloads:
  (a) 16 prompts x 8 samples, 64-token prompts, exactly 64 new tokens
  (b) 4 prompts x 16 samples, 384-token prompts, 32 new tokens
Sampling at temperature 1 without top-k / top-p, no stop token (every row generates all its
tokens). Throughput is generated tokens per second (rows x new tokens / seconds), best of
`--repeats` timed runs after one warm-up run; the warm-up's extra time is reported as compile time.

The reference is Hugging Face transformers `generate` on torch (CPU, 2 threads), loaded from our
weights written by `export_checkpoint`, with the static KV cache and the default dynamic one (the
faster one counts). It runs in a child process of its own: in the process that has run XLA, torch
on the same two cores runs several times slower, which would flatter our figures. torch and
transformers come from the `bench` extra.

The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

if "--transformers-worker" in sys.argv:
    import torch  # noqa: F401  before jax: torch imported after jax runs several times slower here

import jax
import numpy as np
from common import CONFIG, run_child
from common import time_best as _time
from flax import nnx

from spotrl.model.compiles import CompileCounter
from spotrl.model.hf.export import export_checkpoint
from spotrl.model.transformer import Transformer
from spotrl.rollout.sampler import SamplingParams, generate, generate_groups

WORKLOADS = {
    "a": dict(prompts=16, group=8, prompt_len=64, new=64),
    "b": dict(prompts=4, group=16, prompt_len=384, new=32),
}
STOP = CONFIG.vocab_size  # never sampled: every row generates exactly `new` tokens


def _prompts(w: dict, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(
        2, CONFIG.vocab_size, size=(w["prompts"], w["prompt_len"]), dtype=np.int32
    )


def bench_ours(graphdef, state, w: dict, shared: bool, repeats: int) -> dict:
    prompts = _prompts(w, 0)
    params = SamplingParams(max_new_tokens=w["new"], stop_token=STOP, temperature=1.0)
    rows = w["prompts"] * w["group"]
    if shared:
        valid = np.ones(prompts.shape, bool)

        def run():
            return jax.block_until_ready(
                generate_groups(graphdef, state, prompts, valid, jax.random.key(0), params, w["group"])
            )
    else:
        rep = np.repeat(prompts, w["group"], axis=0)
        valid = np.ones(rep.shape, bool)

        def run():
            return jax.block_until_ready(generate(graphdef, state, rep, valid, jax.random.key(0), params))

    with CompileCounter() as compiles:
        first, best = _time(run, repeats)
    out = run()
    assert int(np.asarray(out.lengths).min()) == w["new"], "every row must generate all its tokens"
    return {
        "tok_s": rows * w["new"] / best,
        "seconds": best,
        "compile_s": max(first - best, 0.0),
        "compilations": compiles.count,
    }


def bench_transformers(path: str, w: dict, repeats: int) -> dict:
    import torch
    import transformers

    torch.set_num_threads(2)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor(np.repeat(_prompts(w, 0), w["group"], axis=0), dtype=torch.long)
    mask = torch.ones_like(ids)
    results = {}
    for cache in ("static", "dynamic"):
        kwargs = dict(
            max_new_tokens=w["new"],
            min_new_tokens=w["new"],
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            eos_token_id=None,
            pad_token_id=0,
        )
        if cache == "static":
            kwargs["cache_implementation"] = "static"

        def run():
            torch.manual_seed(0)
            with torch.inference_mode():
                out = model.generate(ids, attention_mask=mask, **kwargs)
            assert out.shape[1] == ids.shape[1] + w["new"]

        try:
            _, best = _time(run, repeats)
        except Exception as e:  # a transformers version without the static cache for this model
            print(f"transformers {cache} cache failed: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        results[cache] = ids.shape[0] * w["new"] / best
    best_cache = max(results, key=results.get)
    return {"tok_s": results[best_cache], "cache": best_cache, "by_cache": results}


def transformers_in_child(path: str, name: str, repeats: int) -> dict:
    """bench_transformers in a fresh process (no XLA thread pools competing with torch's)."""
    return run_child(__file__, "--transformers-worker", path, "--workload", name, "--repeats", str(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--transformers-worker", metavar="CHECKPOINT", help=argparse.SUPPRESS)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.transformers_worker:
        print(json.dumps(bench_transformers(args.transformers_worker, WORKLOADS[args.workload], args.repeats)))
        return

    model = Transformer(CONFIG, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    print(
        f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPUs; model "
        f"{sum(x.size for x in jax.tree.leaves(state)) / 1e6:.2f}M parameters"
    )
    figures: dict = {}
    tmp = tempfile.TemporaryDirectory()
    if not args.skip_transformers:
        export_checkpoint(nnx.to_pure_dict(state), CONFIG, tmp.name, overwrite=True)
    for name, w in WORKLOADS.items():
        label = (
            f"({name}) {w['prompts']} prompts x {w['group']} samples, {w['prompt_len']}-token prompts, {w['new']} new"
        )
        print(label)
        shared = bench_ours(graphdef, state, w, True, args.repeats)
        plain = bench_ours(graphdef, state, w, False, args.repeats)
        print(
            f"  ours, shared prefill:   {shared['tok_s']:9.0f} tok/s  ({shared['seconds']:.3f} s; compile "
            f"{shared['compile_s']:.2f} s, {shared['compilations']} compilations)"
        )
        print(
            f"  ours, repeated prompts: {plain['tok_s']:9.0f} tok/s  ({plain['seconds']:.3f} s; compile "
            f"{plain['compile_s']:.2f} s, {plain['compilations']} compilations)"
        )
        speedup = shared["tok_s"] / plain["tok_s"]
        print(f"  shared prefill speed-up: {speedup:.2f}x")
        figures.update(
            {
                f"ours_shared_tok_s_{name}": round(shared["tok_s"], 1),
                f"ours_plain_tok_s_{name}": round(plain["tok_s"], 1),
                f"shared_prefill_speedup_{name}": round(speedup, 3),
                f"compile_s_shared_{name}": round(shared["compile_s"], 2),
                f"compile_s_plain_{name}": round(plain["compile_s"], 2),
            }
        )
        if not args.skip_transformers:
            ref = transformers_in_child(tmp.name, name, args.repeats)
            by_cache = ", ".join(f"{k} {v:.0f}" for k, v in ref["by_cache"].items())
            print(f"  transformers generate:  {ref['tok_s']:9.0f} tok/s  (best: {ref['cache']} cache; {by_cache})")
            print(
                f"  ours / transformers: {shared['tok_s'] / ref['tok_s']:.2f}x (shared prefill), "
                f"{plain['tok_s'] / ref['tok_s']:.2f}x (repeated prompts)"
            )
            figures.update(
                {
                    f"transformers_tok_s_{name}": round(ref["tok_s"], 1),
                    f"transformers_cache_{name}": ref["cache"],
                    f"vs_transformers_{name}": round(shared["tok_s"] / ref["tok_s"], 3),
                    f"vs_transformers_plain_{name}": round(plain["tok_s"] / ref["tok_s"], 3),
                }
            )
    tmp.cleanup()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
