"""Supervised warm start: teacher-forced training on reference completions until the policy is mediocre.

RL needs a policy that sometimes succeeds (else every group has reward 0 and no signal) and often
fails (else nothing is left to learn). Accuracy jumps within a few dozen steps on the built-in problem,
so the stop is a measured threshold on greedy accuracy, not a fixed step count.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from spotrl.evaluation.evaluate import greedy_accuracy
from spotrl.model import sequences
from spotrl.rl.train_step import build_sft_step, make_optimizer
from spotrl.rng import derive_numpy_rng
from spotrl.rollout.completions import LoadedPolicy


def supervised_warm_start(
    policy,
    tokenizer,
    verifier: str,
    prompts: list[str],
    answers: list[str],
    targets: list[str],
    cfg,
    *,
    seed: int,
    max_new_tokens: int,
    report=None,
):
    """Returns (params as nnx.State, info) after training until greedy accuracy >= cfg.target_greedy_accuracy.

    `report(step, fields)` is told each greedy-accuracy check (default: a printed line)."""
    report = report or _print_check
    # a copy: the step donates its inputs, and the policy's initial state serves as a template later
    state = jax.tree.map(jnp.copy, policy.init_state)
    rng = derive_numpy_rng(seed, "warmstart")
    check_prompts, check_answers = _check_set(rng, prompts, answers, cfg.check_prompts)
    accuracy, steps = 0.0, 0
    training = supervised_steps(policy.graphdef, state, tokenizer, prompts, targets, cfg, rng, max_new_tokens)
    for steps, state, loss in training if cfg.max_steps else ():
        if steps % cfg.check_every == 0:
            accuracy = greedy_accuracy(
                LoadedPolicy(policy.graphdef, state, tokenizer), verifier, check_prompts, check_answers, max_new_tokens
            )
            report(steps, {"loss": f"{float(loss):.3f}", "greedy accuracy": f"{accuracy:.1%}"})
            if accuracy >= cfg.target_greedy_accuracy:
                break
        if steps >= cfg.max_steps:
            break
    return state, {"steps": steps, "greedy_accuracy": accuracy}


def supervised_steps(graphdef, params, tokenizer, prompts, targets, cfg, rng, max_new_tokens: int):
    """Supervised steps for ever on batches of `cfg.batch_size` (prompt, target) rows drawn with `rng`,
    AdamW at `cfg.learning_rate` from a fresh state: yields (steps done, params, loss) after each.

    The warm start, and continued supervised training on the labels (the baseline RL is measured
    against, benchmarks/learning.py). `params` and each yielded params are donated to the next
    step: copy one to keep it past the next iteration of the generator.
    """
    tx = make_optimizer(cfg.learning_rate, 0.0, 0.9, 0.999, 1.0)
    opt_state = tx.init(params)
    step_fn = build_sft_step(graphdef, tx)
    for step in itertools.count(1):
        rows = rng.integers(0, len(prompts), size=cfg.batch_size)
        prompt_tokens, prompt_valid = tokenizer.encode_batch_left_padded([prompts[i] for i in rows])
        target_tokens, target_lengths = sequences.encode_completions(
            tokenizer, [targets[i] for i in rows], max_new_tokens
        )
        params, opt_state, loss = step_fn(
            params, opt_state, *supervised_rows(prompt_tokens, prompt_valid, target_tokens, target_lengths)
        )
        yield step, params, loss


def supervised_rows(prompt_tokens, prompt_valid, completion_tokens, completion_lengths):
    """(tokens, valid, target_mask) of prompts followed by completions for the supervised step:
    the loss is on the completion tokens up to and including the stop token, never on the prompt."""
    tokens, valid = sequences.join(prompt_tokens, prompt_valid, completion_tokens, completion_lengths)
    target_mask = np.concatenate([np.zeros_like(prompt_valid, bool), valid[:, np.shape(prompt_tokens)[1] :]], axis=1)
    return tokens, valid, target_mask


def _print_check(step: int, fields: dict) -> None:
    print(f"warm start step {step}: " + ", ".join(f"{k} {v}" for k, v in fields.items()), flush=True)


def _check_set(rng, prompts, answers, size: int) -> tuple[list, list]:
    check = rng.choice(len(prompts), size=min(size, len(prompts)), replace=False)
    return [prompts[i] for i in check], [answers[i] for i in check]


def pretrained_start(
    policy,
    tokenizer,
    verifier: str,
    prompts: list[str],
    answers: list[str],
    targets: list[str],
    cfg,
    *,
    seed: int,
    max_new_tokens: int,
    report=None,
):
    """The starting point of a run from a pretrained checkpoint: its own parameters, no supervised steps
    (`targets`, the reference completions, are not used: the signature is supervised_warm_start's).

    The supervised warm start exists because a randomly initialised model never earns a reward, so
    RL would have no signal; a pretrained checkpoint is already the policy to improve, and fitting
    it to the problem's reference answers first would be a different experiment (SFT, then RL). Its
    greedy accuracy on the same check prompts is still measured and reported.
    """
    check_prompts, check_answers = _check_set(derive_numpy_rng(seed, "warmstart"), prompts, answers, cfg.check_prompts)
    accuracy = greedy_accuracy(
        LoadedPolicy(policy.graphdef, policy.init_state, tokenizer),
        verifier,
        check_prompts,
        check_answers,
        max_new_tokens,
    )
    # a copy: the RL step donates its inputs, and the initial state serves as a template later
    return jax.tree.map(jnp.copy, policy.init_state), {"steps": 0, "greedy_accuracy": accuracy}
