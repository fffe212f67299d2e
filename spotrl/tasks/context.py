"""Per-process state of a run: its stores, the policy's static parts, and memos.

The memos hold what a long-lived worker would keep in memory (the train state after the last update,
pulled weight versions, the datasets) so that steady-state iterations do not reload from storage.
They are only a cache: every task can rebuild what it needs from the run directory, which is what
happens after a kill.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections import OrderedDict

import jax
import jax.numpy as jnp
from flax import nnx

from spotrl import distributed
from spotrl.config import RunConfig
from spotrl.curation.store import load_split
from spotrl.model.critic import Critic
from spotrl.model.hf.loader import build_policy
from spotrl.model.memory import memory_estimate, memory_summary
from spotrl.problems import get_problem
from spotrl.rl.train_step import make_optimizer
from spotrl.rollout.sampler import SamplingParams
from spotrl.storage.checkpoints import CheckpointStore
from spotrl.storage.lease import worker_id
from spotrl.storage.paths import AnyPath, as_path
from spotrl.storage.weights import WeightStore


class _LRU(OrderedDict):
    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def put(self, key, value) -> list:
        """Insert; returns the keys evicted to stay within `size`."""
        self[key] = value
        self.move_to_end(key)
        evicted = []
        while len(self) > self.size:
            evicted.append(self.popitem(last=False)[0])
        return evicted


@dataclasses.dataclass
class RunContext:
    run_dir: AnyPath  # a local Path, or a RemotePath for gs://
    config: RunConfig

    def __post_init__(self):
        cfg = self.config
        # model.path: a Hugging Face checkpoint and its tokenizer, checked before anything loads;
        # otherwise the built-in model with its problem's character tokenizer
        self.problem_spec = get_problem(cfg.problem.name)
        self.policy, self.tokenizer = build_policy(cfg.model, cfg.seed, self.problem_spec.tokenizer())
        self.optimizer = make_optimizer(**cfg.optimizer.model_dump())
        value = cfg.algorithm.value
        self.critic_graphdef = self.critic_init_state = self.critic_optimizer = None
        if value.head != "none":
            critic = Critic(cfg.model, separate=value.head == "separate", rngs=nnx.Rngs(cfg.seed + 1))
            self.critic_graphdef, self.critic_init_state = nnx.split(critic)
            self.critic_optimizer = make_optimizer(
                value.learning_rate, 0.0, cfg.optimizer.b1, cfg.optimizer.b2, cfg.optimizer.grad_clip
            )
        # the reference policy of a KL term is the warm-start policy: weight version 0, kept forever
        self.reference_version = 0 if cfg.algorithm.kl.coef > 0 else None
        pinned = () if self.reference_version is None else (self.reference_version,)
        self.weights = WeightStore(self.run_dir / "weights", keep=cfg.weights.keep, pinned=pinned)
        self.checkpoints = CheckpointStore(self.run_dir / "checkpoints", keep=cfg.checkpoint.keep)
        self.train_states = _LRU(2)  # iteration -> {"params", "opt_state"}
        self.pulled = _LRU(2 + cfg.rollout.max_staleness)  # weights version -> nnx.State
        self._pull_lock = threading.Lock()  # rollout shards pull from worker threads
        self.worker_id = worker_id()  # host:pid, the holder of its weight leases
        self._splits = {}

    @property
    def data_dir(self) -> AnyPath:
        return self.run_dir / "data"

    def split(self, name: str):
        if name not in self._splits:
            self._splits[name] = load_split(self.data_dir, name)
        return self._splits[name]

    def sampling(self, temperature: float) -> SamplingParams:
        r = self.config.rollout
        return SamplingParams(
            max_new_tokens=r.max_new_tokens,
            stop_token=self.tokenizer.eos_id,
            pad_token=self.tokenizer.pad_id,
            temperature=temperature,
            top_k=r.top_k,
            top_p=r.top_p,
            stop_tokens=self.tokenizer.stop_ids,
        )

    def memory_summary(self) -> str:
        """The run's memory estimate, for the log at start."""
        cfg = self.config
        longest = self.problem_spec.longest_prompt
        if longest is not None:  # no prompt of the problem is longer than this one
            prompt_tokens = self.tokenizer.encode_batch_left_padded([longest])[0].shape[1]
        else:
            prompt_tokens = 512  # an assumption, said in the summary
        estimate = memory_estimate(
            cfg.model,
            rollout_rows=cfg.rollout.prompts_per_iteration * cfg.rollout.group_size,
            minibatches=cfg.algorithm.minibatches,
            prompt_tokens=prompt_tokens,
            new_tokens=cfg.rollout.max_new_tokens,
            reference=cfg.algorithm.kl.coef > 0,
        )
        return memory_summary(cfg.model, estimate, prompt_tokens)

    def initial_train_state(self, params) -> dict:
        """The RL train state around `params`: fresh optimizer, and a fresh critic for PPO (a separate
        critic's trunk starts from `params`, the warm-start policy)."""
        state = {"params": params, "opt_state": self.optimizer.init(params)}
        if self.critic_graphdef is not None:
            critic = jax.tree.map(lambda x: x, self.critic_init_state)
            if "trunk" in critic:
                nnx.replace_by_pure_dict(critic["trunk"], nnx.to_pure_dict(jax.tree.map(jnp.copy, params)))
            state.update(critic=critic, critic_opt_state=self.critic_optimizer.init(critic))
        return self.policy.place(state)

    def state_template(self) -> dict:
        return self.initial_train_state(self.policy.init_state)

    def train_state(self, iteration: int, *, consume: bool) -> dict:
        """The train state after `iteration`, from memory or from its sealed checkpoint.

        `consume=True` takes it out of the memo: the train step donates its buffers, so a state that
        is updated must not stay behind. Otherwise it is (re)placed in the memo for later readers.
        """
        state = self.train_states.pop(iteration, None)
        if state is None:
            state, _ = self.checkpoints.restore(iteration, self.state_template())
        if not consume:
            self.train_states.put(iteration, state)
        return state

    def pull(self, version: int):
        """Weights of a published version as nnx.State, verified, loaded once per process."""
        with self._pull_lock:
            if version not in self.pulled:
                self.weights.wait_for(version, timeout=self.config.rollout.pull_timeout_seconds)
                leases = distributed.is_primary()  # the other processes of a multi-host trainer write nothing
                if leases:
                    self.weights.hold(version, self.worker_id)  # retention keeps it while this worker uses it
                params = self.weights.load(version, self.policy.template())
                for evicted in self.pulled.put(version, self.policy.to_state(params)):
                    if leases:
                        self.weights.release(evicted, self.worker_id)
            return self.pulled[version]


@functools.lru_cache(maxsize=4)
def get_context(run_dir: str, config: RunConfig) -> RunContext:
    return RunContext(as_path(run_dir), config)
