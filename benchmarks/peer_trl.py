"""spotrl against Hugging Face TRL's GRPOTrainer on the same work, side by side, from one warm start.

    python benchmarks/peer_trl.py [--iterations 200] [--torch-threads 2] [--set KEY=VALUE] [--out DIR]

The default config (with any --set). One warm start, made once by the train flow (`iterations=0`);
then, one after another on the same machine:
  spotrl  `spotrl train --warm-start-from` it for `--iterations` iterations (the flow under its private
          server, as a user runs it); its RL time is the sum of the iterations' `seconds`;
  trl     the warm start exported (`spotrl export`) and trained by `trl.GRPOTrainer` in a child process (torch
          only, `--torch-threads`, default 2: faster than 1 here, 0.74 vs 0.63 iterations/s over 30 s) for the
          same wall-clock seconds, on the same work: the same training prompts in the same order (the rows
          spotrl's iterations 1, 2, ... sample), group size, completion length, temperature, AdamW (learning
          rate, betas, weight decay, gradient-norm clip, constant schedule), token-level ratio clipped to [1 -
          clip_low, 1 + clip_high] with the dual clip (TRL's `delta`), the token mean over each optimizer
          step's rows (TRL's `bnpo`), group-std advantages with eps 1e-4, no KL, and `minibatches` optimizer
          steps per generation batch; spotrl's verifier is its reward function. Its iterations are generation
          batches (`minibatches` steps each).
Both sides' final weights are then evaluated by one harness, the run's own evaluation (the
`evaluate` stage's function: `eval.prompts` held-out prompts, `eval.n` samples each, pass@1 and
pass@`eval.k`): TRL's saved model is read by spotrl's Hugging Face loader and published as a weight
version of a run directory seeded from the same warm start.

Prints a table and one JSON object as the last line: iterations per second of both, their ratio
(spotrl / trl: > 1 means spotrl is faster), and held-out pass@1 / pass@k of the warm start and both.
Needs the `bench` extra (torch, transformers, trl).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import run_child  # noqa: E402


def _trl_worker(args) -> dict:
    """The TRL arm, in its own process: torch must not share the cores with XLA's thread pools."""
    import torch  # before jax: torch imported after jax runs several times slower here (common.py)

    torch.set_num_threads(args.torch_threads)
    import numpy as np
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from spotrl.curation.batches import rollout_rows
    from spotrl.flows import rundir
    from spotrl.rewards.score import score
    from spotrl.tasks.context import RunContext

    warm = Path(args.warm_start)
    config = rundir.read_config(warm)
    ctx = RunContext(warm, config)
    r, a, o = config.rollout, config.algorithm, config.optimizer
    train = ctx.split("train").to_pandas()
    iterations = args.iterations_cap
    order = np.concatenate(
        [
            rollout_rows(config.seed, i, 0, np.arange(len(train)), r.prompts_per_iteration)
            for i in range(1, iterations + 1)
        ]
    )
    data = Dataset.from_dict(
        {"prompt": train["prompt"].iloc[order].tolist(), "answer": train["answer"].iloc[order].tolist()}
    )
    verifier, eos = ctx.problem_spec.verifier, ctx.tokenizer.eos_id

    def reward(prompts, completions, completion_ids, answer, **_) -> list[float]:
        stopped = [eos in ids for ids in completion_ids]
        return [float(x) for x in score(verifier, list(completions), stopped, list(answer))]

    class Budget(TrainerCallback):
        """Stops at the first generation batch boundary past `seconds` of training."""

        def on_train_begin(self, *_, **__):
            self.started = time.perf_counter()

        def on_step_end(self, _args, state, control, **__):
            if state.global_step % a.minibatches == 0 and time.perf_counter() - self.started >= args.seconds:
                control.should_training_stop = True

    rows = r.prompts_per_iteration * r.group_size
    grpo = GRPOConfig(
        output_dir=str(Path(args.out) / "trl-output"),
        per_device_train_batch_size=rows // a.minibatches,
        steps_per_generation=a.minibatches,
        gradient_accumulation_steps=1,
        num_generations=r.group_size,
        num_iterations=a.epochs,
        max_completion_length=r.max_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        learning_rate=o.learning_rate,
        adam_beta1=o.b1,
        adam_beta2=o.b2,
        weight_decay=o.weight_decay,
        max_grad_norm=o.grad_clip,
        lr_scheduler_type="constant",
        warmup_steps=0,
        epsilon=a.clip_low,
        epsilon_high=a.clip_high,
        delta=a.dual_clip,
        loss_type="bnpo",
        scale_rewards="group",
        beta=0.0,
        max_steps=iterations * a.minibatches,
        shuffle_dataset=False,
        use_cpu=True,
        bf16=False,
        seed=config.seed,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    model = AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.hf, padding_side="left")
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=grpo,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Budget()],
    )
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    final = Path(args.out) / "trl-final"
    trainer.model.save_pretrained(final)
    steps = trainer.state.global_step
    return {"seconds": seconds, "optimizer_steps": steps, "iterations": steps / a.minibatches, "final": str(final)}


def _publish_trl(warm: Path, run_dir: Path, final: str) -> None:
    """TRL's final weights as version 1 of a run directory seeded from the warm start."""
    from spotrl.flows import rundir
    from spotrl.flows.resume import seed_from_warm_start
    from spotrl.model.hf.loader import load_params
    from spotrl.tasks.context import RunContext

    config = rundir.read_config(warm)
    seed_from_warm_start(run_dir, config, warm)
    ctx = RunContext(run_dir, config)
    ctx.weights.publish(1, load_params(final, config.model), {"trained_by": "trl.GRPOTrainer"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=200, help="spotrl's RL iterations")
    parser.add_argument("--torch-threads", type=int, default=2, help="TRL's torch threads (2 was its fastest here)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default=None, help="where the runs go (default: a temporary directory)")
    parser.add_argument("--worker", choices=["trl"], help=argparse.SUPPRESS)
    parser.add_argument("--warm-start", help=argparse.SUPPRESS)
    parser.add_argument("--hf", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--iterations-cap", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "trl":
        print(json.dumps(_trl_worker(args)))
        return

    from learning import _evaluate

    from spotrl.chaos import run_attempt
    from spotrl.storage.records import read_jsonl

    out = Path(args.out or tempfile.mkdtemp(prefix="spotrl-peer-trl-"))
    out.mkdir(parents=True, exist_ok=True)
    warm, ours, theirs, hf = out / "warm-start", out / "spotrl", out / "trl", out / "warm-start-hf"

    def train(run_dir: Path, overrides: list[str], extra: list[str] = ()) -> None:
        attempt = run_attempt(run_dir, args.overrides + overrides, extra_args=list(extra), timeout=24 * 3600)
        if attempt.returncode != 0:
            raise RuntimeError(f"{run_dir}: spotrl train exited with {attempt.returncode}:\n{attempt.output[-3000:]}")

    if not (warm / "weights").exists():
        train(warm, ["iterations=0"])
    if not hf.exists():
        from spotrl.cli.main import main as spotrl_main

        spotrl_main(["export", "--run-dir", str(warm), "--out", str(hf), "--version", "0"])
    train(ours, [f"iterations={args.iterations}"], ["--warm-start-from", str(warm)])
    metrics = read_jsonl(ours / "metrics.jsonl")
    our_seconds = sum(m["seconds"] for m in metrics)

    trl = run_child(
        __file__,
        *("--worker", "trl", "--warm-start", str(warm), "--hf", str(hf), "--out", str(out)),
        *("--seconds", str(our_seconds), "--iterations-cap", str(4 * args.iterations)),
        *("--torch-threads", str(args.torch_threads)),
    )
    _publish_trl(warm, theirs, trl["final"])

    results = {
        "warm start": _evaluate(warm, [0])[0],
        "spotrl": _evaluate(ours, [args.iterations])[args.iterations],
        "trl": _evaluate(theirs, [1])[1],
    }
    rates = {"spotrl": len(metrics) / our_seconds, "trl": trl["iterations"] / trl["seconds"]}
    seconds = {"spotrl": our_seconds, "trl": trl["seconds"]}
    done = {"spotrl": len(metrics), "trl": trl["iterations"]}
    k = results["warm start"]["k"]
    print(f"\n{'':12}{'RL seconds':>11}{'iterations':>11}{'iter/s':>8}{'pass@1':>9}{f'pass@{k}':>9}")
    for name, result in results.items():
        timing = f"{seconds[name]:>11.1f}{done[name]:>11.1f}{rates[name]:>8.2f}" if name in rates else " " * 30
        print(f"{name:12}{timing}{result['pass_at_1']:>9.1%}{result['pass_at_k']:>9.1%}")
    print(
        json.dumps(
            {
                "spotrl_over_trl_iterations_per_s": round(rates["spotrl"] / rates["trl"], 3),
                "iterations_per_s": rates,
                "rl_seconds": seconds,
                "iterations": done,
                "pass_at_1": {name: r["pass_at_1"] for name, r in results.items()},
                "pass_at_k": {name: r["pass_at_k"] for name, r in results.items()},
                "k": k,
                "torch_threads": args.torch_threads,
                "out": str(out),
            }
        )
    )


if __name__ == "__main__":
    main()
