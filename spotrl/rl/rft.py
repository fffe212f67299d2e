"""Rejection-sampling fine-tuning ("expert iteration"): `algorithm.name: rft`.

The iteration's rollouts (G completions per prompt, sampled and scored by the same stages as every
algorithm) are filtered to the verified ones (verifier reward >= `algorithm.rft.min_reward`), and
the policy takes the warm start's supervised step on them: cross-entropy on the kept completions'
tokens, nothing else. No advantage, no ratio, no reference policy. This is the baseline every RL
paper compares with (Anthony et al. 2017; Yuan et al. 2023): what RL adds over it is learning from
the failed samples too, and weighting the successes by how surprising they were.
"""

from __future__ import annotations

import jax
import numpy as np

from spotrl.rl.batch import TrainingBatch
from spotrl.rl.train_step import build_sft_step
from spotrl.rl.warmstart import supervised_rows
from spotrl.rng import minibatch_rng


def verified_rows(rewards, real_rows: int, min_reward: float) -> np.ndarray:
    """Indices of the rows to train on: real rows (not the padding past `real_rows`) whose reward
    is at least `min_reward`."""
    rewards = np.asarray(rewards, np.float64)[:real_rows]
    return np.flatnonzero(rewards >= min_reward)


def rft_steps(
    step_fn,
    state: dict,
    *,
    tokens,
    valid,
    target_mask,
    keep: np.ndarray,
    batch_size: int,
    epochs: int,
    rng: np.random.Generator,
):
    """Supervised steps on the rows `keep` of (tokens, valid, target_mask): each epoch a permutation
    of them in batches of `batch_size` rows; the last batch of an epoch is filled with rows whose
    target mask is cleared (one compiled shape, and they add nothing to the loss). No kept row: no
    step. Returns (train state, per-step losses)."""
    params, opt_state = state["params"], state["opt_state"]
    losses = []
    for _ in range(epochs):
        order = rng.permutation(keep)
        for start in range(0, len(order), batch_size):
            take = order[start : start + batch_size]
            rows = np.concatenate([take, np.full(batch_size - len(take), take[0])])
            mask = np.asarray(target_mask)[rows].copy()
            mask[len(take) :] = False
            params, opt_state, loss = step_fn(params, opt_state, tokens[rows], valid[rows], mask)
            losses.append(loss)
    return {**state, "params": params, "opt_state": opt_state}, [float(x) for x in jax.device_get(losses)]


def rft_update(
    config, iteration: int, state: dict, batch: TrainingBatch, *, tokenizer, graphdef, optimizer
) -> tuple[dict, dict]:
    """(train state, metrics) after the RFT update on an iteration's scored rollouts: the verified
    completions, trained on for `algorithm.epochs` passes in batches of the RL minibatch's size.

    The optimizer is the run's (`optimizer.*`): its state carries over from iteration to iteration
    and is checkpointed like an RL update's."""
    a, frame = config.algorithm, batch.frame
    rewards = frame["task_reward"] if "task_reward" in frame else frame["reward"]  # the verifier's, unshaped
    keep = verified_rows(rewards.to_numpy(), batch.real_rows, a.rft.min_reward)
    prompt_tokens, prompt_valid = tokenizer.encode_batch_left_padded(frame["prompt"].tolist())
    tokens, valid, target_mask = supervised_rows(
        prompt_tokens, prompt_valid, np.stack(frame["tokens"].to_numpy()), frame["length"].to_numpy()
    )
    state, losses = rft_steps(
        build_sft_step(graphdef, optimizer),
        state,
        tokens=tokens,
        valid=valid,
        target_mask=target_mask,
        keep=keep,
        batch_size=len(frame) // a.minibatches,
        epochs=a.epochs,
        rng=minibatch_rng(config.seed, iteration),
    )
    metrics = {
        "kept_rows": len(keep),
        "kept_fraction": len(keep) / max(batch.real_rows, 1),
        "optimizer_steps": len(losses),
    }
    if losses:  # the supervised cross-entropy; an iteration where nothing verified has none
        metrics["loss"] = float(np.mean(losses))
    return state, metrics
