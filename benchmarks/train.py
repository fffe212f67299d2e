"""Train-step throughput against transformers on torch, and MFU against XLA's measured matmul peak.

    python benchmarks/train.py [--repeats N] [--skip-transformers]

Workload (c): the model of benchmarks/common.py (Qwen2-shaped, vocab 512, hidden 256, MLP 768,
4 layers, 8 heads, 2 KV heads, tied embeddings, float32, random init), batch 32 x 128 tokens,
forward + backward + AdamW (lr 1e-4, gradient clipping at 1.0 on both sides). Throughput is
trained tokens per second (32 * 128 / seconds per step), best of `--repeats` timed steps after
one warm-up step (its extra time is reported as compile time).

Ours, three steps:
  - `lm`: next-token cross-entropy over every token (our supervised step, build_sft_step): the same
    loss as transformers' `model(ids, labels=ids).loss`, so this is the like-for-like ratio;
  - `rl`: the RL step the trainer runs (build_rl_step, GRPO loss on the last 64 tokens of each row,
    with the entropy it reports), on the same 32 x 128 tokens;
  - `rl_micro4`: the same RL step accumulating 4 micro-batches of 8 rows (the same update).
The reference is transformers' Qwen2ForCausalLM with torch.optim.AdamW on torch (CPU, 2 threads),
loaded from our weights written by `export_checkpoint`, in a child process of its own (see
benchmarks/rollout.py for why). Its first loss must equal our first loss on the same tokens: a
check that both sides train the same model.

MFU = achieved FLOP/s / peak, with training FLOPs per token = 6 * (matmul weights, counting the
tied output projection) + 12 * layers * seq_len * heads * head_dim (attention scores and values,
forward and backward; PaLM's formula), and the peak the best FLOP/s of a jitted float32 matmul
(n = 512, 1024, 2048) measured in this same run.

The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

if "--transformers-worker" in sys.argv:
    import torch  # noqa: F401  before jax: torch imported after jax runs several times slower here

import jax
import jax.numpy as jnp
import numpy as np
from common import CONFIG, run_child, time_best
from flax import nnx

from spotrl.model.compiles import CompileCounter
from spotrl.model.hf.export import export_checkpoint
from spotrl.model.transformer import Transformer
from spotrl.rl.losses import LossSpec
from spotrl.rl.train_step import RLBatch, build_rl_step, build_sft_step, make_optimizer

BATCH, SEQ, COMPLETION = 32, 128, 64
LR = 1e-4


def _tokens(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, CONFIG.vocab_size, size=(BATCH, SEQ), dtype=np.int32)


def flops_per_token() -> int:
    c = CONFIG
    hd = c.resolved_head_dim
    q, kv = c.num_heads * hd, c.num_kv_heads * hd
    per_layer = c.hidden_size * (2 * q + 2 * kv) + 3 * c.hidden_size * c.intermediate_size
    matmul_weights = c.num_layers * per_layer + c.vocab_size * c.hidden_size  # + the tied output projection
    return 6 * matmul_weights + 12 * c.num_layers * SEQ * q


def matmul_peak(repeats: int) -> dict:
    """Best float32 FLOP/s of a jitted square matmul, over a few sizes."""
    best = {}
    for n in (512, 1024, 2048):
        a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
        b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
        mm = jax.jit(jnp.matmul)
        _, seconds = time_best(lambda: mm(a, b).block_until_ready(), max(repeats, 3))
        best[n] = 2 * n**3 / seconds
    return {"flops": max(best.values()), "by_size": {n: round(f / 1e9, 1) for n, f in best.items()}}


def bench_ours(graphdef, state, kind: str, repeats: int) -> dict:
    tx = make_optimizer(LR, 0.0, 0.9, 0.999, 1.0)
    tokens = jnp.asarray(_tokens())
    valid = jnp.ones(tokens.shape, bool)
    params = jax.tree.map(jnp.copy, state)
    holder = {"params": params, "opt_state": tx.init(params)}
    if kind == "lm":
        step = build_sft_step(graphdef, tx)

        def run():
            holder["params"], holder["opt_state"], loss = step(
                holder["params"], holder["opt_state"], tokens, valid, valid
            )
            return jax.block_until_ready(loss)
    else:
        rng = np.random.default_rng(1)
        batch = RLBatch(
            tokens,
            valid,
            jnp.asarray(rng.normal(-6.2, 0.5, (BATCH, COMPLETION)), jnp.float32),
            jnp.asarray(rng.normal(0, 1, BATCH), jnp.float32),
        )
        step = build_rl_step(graphdef, tx, LossSpec(), 1.0, micro_batches=4 if kind == "rl_micro4" else 1)

        def run():
            new, metrics = step({"params": holder["params"], "opt_state": holder["opt_state"]}, batch)
            holder.update(new)
            return jax.block_until_ready(metrics["loss"])

    start = time.perf_counter()
    first_loss = float(run())  # the loss before any update (compared with torch's for the lm step)
    first = time.perf_counter() - start
    with CompileCounter() as compiles:  # after the first step: must stay 0
        _, best = time_best(run, repeats)
    return {
        "tok_s": BATCH * SEQ / best,
        "seconds": best,
        "compile_s": max(first - best, 0.0),
        "steady_compilations": compiles.count,
        "first_loss": first_loss,
    }


def bench_transformers(path: str, repeats: int) -> dict:
    import torch
    import transformers

    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), weight_decay=0.0)
    ids = torch.tensor(_tokens(), dtype=torch.long)
    losses = []

    def run():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))

    _, best = time_best(run, repeats)
    return {
        "tok_s": BATCH * SEQ / best,
        "seconds": best,
        "first_loss": losses[0],
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--transformers-worker", metavar="CHECKPOINT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.transformers_worker:
        print(json.dumps(bench_transformers(args.transformers_worker, args.repeats)))
        return

    graphdef, state = nnx.split(Transformer(CONFIG, rngs=nnx.Rngs(0)))
    print(
        f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPUs; model "
        f"{sum(x.size for x in jax.tree.leaves(state)) / 1e6:.2f}M parameters; batch {BATCH} x {SEQ} tokens"
    )
    peak = matmul_peak(args.repeats)
    fpt = flops_per_token()
    print(
        f"XLA float32 matmul peak: {peak['flops'] / 1e9:.1f} GFLOP/s (by size: {peak['by_size']}); "
        f"training FLOPs per token: {fpt / 1e6:.2f} M"
    )
    figures: dict = {"matmul_peak_gflops": round(peak["flops"] / 1e9, 1), "train_flops_per_token": fpt}
    ours = {}
    for kind in ("lm", "rl", "rl_micro4"):
        r = bench_ours(graphdef, state, kind, args.repeats)
        ours[kind] = r
        mfu = r["tok_s"] * fpt / peak["flops"]
        print(
            f"  ours {kind:10s} {r['tok_s']:9.0f} tok/s  ({r['seconds']:.3f} s/step; compile {r['compile_s']:.2f} s; "
            f"{r['steady_compilations']} compilations in the timed steps; MFU {mfu:.1%})"
        )
        figures.update(
            {
                f"ours_{kind}_tok_s": round(r["tok_s"], 1),
                f"mfu_{kind}": round(mfu, 4),
                f"compile_s_{kind}": round(r["compile_s"], 2),
            }
        )
    figures["mfu"] = figures["mfu_lm"]
    figures["steady_state_compilations"] = sum(r["steady_compilations"] for r in ours.values())
    if not args.skip_transformers:
        with tempfile.TemporaryDirectory() as tmp:
            export_checkpoint(nnx.to_pure_dict(state), CONFIG, tmp, overwrite=True)
            ref = run_child(__file__, "--transformers-worker", tmp, "--repeats", str(args.repeats))
        ref_mfu = ref["tok_s"] * fpt / peak["flops"]
        loss_diff = abs(ref["first_loss"] - ours["lm"]["first_loss"])
        print(
            f"  transformers     {ref['tok_s']:9.0f} tok/s  ({ref['seconds']:.3f} s/step; attention "
            f"{ref['attn_implementation']}; MFU {ref_mfu:.1%} of XLA's peak)"
        )
        print(
            f"  first loss: ours {ours['lm']['first_loss']:.6f}, transformers {ref['first_loss']:.6f} "
            f"(|diff| {loss_diff:.1e}: the same model)"
        )
        print(
            f"  ours / transformers: {ours['lm']['tok_s'] / ref['tok_s']:.2f}x (lm step), "
            f"{ours['rl']['tok_s'] / ref['tok_s']:.2f}x (RL step)"
        )
        figures.update(
            {
                "transformers_tok_s": round(ref["tok_s"], 1),
                "transformers_mfu": round(ref_mfu, 4),
                "vs_transformers": round(ours["lm"]["tok_s"] / ref["tok_s"], 3),
                "vs_transformers_rl": round(ours["rl"]["tok_s"] / ref["tok_s"], 3),
                "first_loss_abs_diff": float(f"{loss_diff:.3g}"),
            }
        )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
