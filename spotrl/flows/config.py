"""The run config: typed, validated at construction, and the train flow's parameter.

Every field has the value of the built-in tiny preset (`configs/tiny.yaml`, which documents each
one); a preset or `--set key=value` overrides it. Unknown keys, wrong types and impossible values
fail here, before any work starts, with the dotted key in the message.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from spotrl.model.config import ModelConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TaskConfig(_Section):
    name: Literal["arithmetic", "math", "code"] = Field("arithmetic", description="the verifier and tokenizer; built-in "
                                                       "prompts for arithmetic and code, curation.sources for any")
    train_size: int = Field(20000, gt=0)
    eval_size: int = Field(400, gt=0)
    min_digits: int = Field(2, ge=1, le=4)
    max_digits: int = Field(4, ge=1, le=4)
    verify_workers: int = Field(1, gt=0, description="verifier calls in parallel per reward task (sandboxed code: >1)")

    @model_validator(mode="after")
    def _digits(self):
        if self.min_digits > self.max_digits:
            raise ValueError(f"min_digits ({self.min_digits}) > max_digits ({self.max_digits})")
        return self


class SourceConfig(_Section):
    """A dataset source: JSONL/JSON/Parquet/CSV file or saved `datasets` directory, local or gs://."""

    name: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
    path: str
    map: dict[str, str] = Field(default_factory=dict, description="source column -> id, prompt, answer or tests")
    format: Literal["jsonl", "json", "parquet", "csv", "datasets"] | None = None
    split: str | None = Field(None, description="the split of a saved DatasetDict")
    weight: float | None = Field(None, ge=0, description="mixing weight; none set: every row of every source")

    def __hash__(self) -> int:  # the run config is hashable (a cache key of per-process state); `map` is a dict
        return hash(json.dumps(self.model_dump(mode="json"), sort_keys=True))


class DifficultyConfig(_Section):
    """Pass rates of the training prompts under the current policy; prompts always or never solved
    are left out of the prompt stream (they give group-relative advantages no signal)."""

    every: int = Field(10, gt=0, description="re-estimate before iterations 1, 1 + every, 1 + 2 * every, ...")
    samples: int = Field(8, ge=2, description="completions per prompt for an estimate")
    prompts: int | None = Field(None, gt=0, description="estimate this many training prompts (a seeded subset); "
                                                         "None: all of them")
    drop_never: bool = True
    drop_always: bool = True


class CurationConfig(_Section):
    sources: tuple[SourceConfig, ...] = Field((), description="empty: the task's built-in prompts")
    eval: tuple[SourceConfig, ...] = Field((), description="held-out sets: training prompts sharing "
                                                                       "an n-gram with them are removed")
    ngram: int = Field(13, gt=0, description="decontamination n-gram size, in words")
    total: int | None = Field(None, gt=0, description="rows to mix from the sources by weight (None: as many as "
                                                      "the weights allow)")
    difficulty: DifficultyConfig | None = None

    @model_validator(mode="after")
    def _names(self):
        names = [s.name for s in self.sources + self.eval]
        if len(set(names)) != len(names):
            raise ValueError(f"source names must be distinct: {names}")
        if self.eval and not self.sources:
            raise ValueError("curation.eval decontaminates curation.sources; name the sources too")
        return self


class WarmStartConfig(_Section):
    learning_rate: float = Field(1e-3, gt=0)
    batch_size: int = Field(128, gt=0)
    max_steps: int = Field(1000, ge=0)
    check_every: int = Field(10, gt=0)
    check_prompts: int = Field(256, gt=0)
    # Stop as soon as greedy accuracy on training prompts reaches this: a mediocre policy.
    target_greedy_accuracy: float = Field(0.3, ge=0, le=1)


class RolloutConfig(_Section):
    prompts_per_iteration: int = Field(64, gt=0)
    group_size: int = Field(8, ge=2)
    max_new_tokens: int = Field(8, gt=0)
    temperature: float = Field(1.0, gt=0)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    shards: int = Field(1, gt=0, description="rollout work split into this many parallel tasks")
    task_runner: Literal["threads", "ray"] = Field("threads", description="where rollout shards run: this process's "
                                                                         "thread pool, or Ray workers (prefect-ray)")
    ray_address: str | None = Field(None, description="a Ray cluster (ray://host:10001 or auto); None starts a local Ray")
    pull_timeout_seconds: float = Field(300.0, gt=0, description="how long a worker waits for a weight version "
                                                                  "that is not published yet")
    max_staleness: int = Field(0, ge=0, description="k: iteration i samples with weights i-1-k; k >= 1 overlaps "
                                                     "generation with the previous updates (0: on-policy)")


class KLConfig(_Section):
    """KL to the frozen reference policy (the warm-start weights, version 0)."""

    coef: float = Field(0.0, ge=0, description="0 disables it (no reference forward pass)")
    estimator: Literal["k1", "k2", "k3"] = "k3"
    in_reward: bool = Field(False, description="subtract coef * KL from per-token rewards instead of adding it to the loss")


class DynamicSamplingConfig(_Section):
    """DAPO: drop groups whose rewards are all equal; generate more prompts until the batch is full."""

    enabled: bool = False
    max_rounds: int = Field(4, ge=0, description="extra generation rounds per iteration at most")


class OverlongConfig(_Section):
    """DAPO's soft overlong penalty, in tokens: 0 up to max_tokens - cache_tokens, then linear to -penalty."""

    enabled: bool = False
    max_tokens: int | None = Field(None, gt=0, description="default: rollout.max_new_tokens")
    cache_tokens: int = Field(2, ge=0)
    penalty: float = Field(1.0, ge=0)


class ValueConfig(_Section):
    """PPO's critic: a value head on the policy's trunk ("shared") or on a trunk of its own ("separate")."""

    head: Literal["none", "shared", "separate"] = "none"
    coef: float = Field(0.5, gt=0)
    clip: float | None = Field(0.2, gt=0)
    gamma: float = Field(1.0, gt=0, le=1)
    lam: float = Field(0.95, ge=0, le=1)
    learning_rate: float = Field(1e-3, gt=0)


ALGORITHMS = ("grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "gspo", "ppo")

# Each preset is only a choice of parts. The field defaults of AlgorithmConfig are GRPO's (with the
# token-mean aggregation verl and DAPO use); a preset overrides some of them, and any key set
# explicitly in a config file or with --set overrides the preset.
ALGORITHM_PRESETS: dict[str, dict] = {
    "grpo": {},
    "dr_grpo": {"advantage": "dr_grpo", "aggregation": "seq_mean_token_sum_norm"},
    "dapo": {"clip_high": 0.28, "dynamic_sampling": {"enabled": True}, "overlong": {"enabled": True}},
    "rloo": {"advantage": "rloo"},
    "reinforce_pp": {"advantage": "reinforce_pp", "kl": {"coef": 0.01, "estimator": "k1", "in_reward": True}},
    "gspo": {"ratio_level": "sequence", "clip_low": 3e-4, "clip_high": 4e-4, "aggregation": "seq_mean_token_mean"},
    "ppo": {"advantage": "gae", "value": {"head": "shared"}},
}


def _merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        merged[key] = _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


class AlgorithmConfig(_Section):
    name: Literal[ALGORITHMS] = "grpo"
    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"] = "grpo"
    advantage_eps: float = Field(1e-4, gt=0)
    ratio_level: Literal["token", "sequence"] = "token"
    clip_low: float = Field(0.2, gt=0, lt=1, description="ratio clipped below at 1 - clip_low")
    clip_high: float = Field(0.2, gt=0, description="ratio clipped above at 1 + clip_high (DAPO: clip-higher)")
    dual_clip: float | None = Field(None, gt=1, description="objective bounded below by dual_clip * A for A < 0")
    aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = "token_mean"
    norm_constant: float | None = Field(None, gt=0, description="seq_mean_token_sum_norm's divisor; default max_new_tokens")
    entropy_coef: float = Field(0.0, ge=0)
    kl: KLConfig = KLConfig()
    dynamic_sampling: DynamicSamplingConfig = DynamicSamplingConfig()
    overlong: OverlongConfig = OverlongConfig()
    value: ValueConfig = ValueConfig()
    importance_cap: float = Field(2.0, gt=0, description="truncated importance weight min(pi_prox / pi_behaviour, cap) "
                                                         "on stale rollouts (rollout.max_staleness >= 1)")
    minibatches: int = Field(4, gt=0)
    epochs: int = Field(1, gt=0)
    micro_batches: int = Field(1, gt=0, description="gradient accumulation: each minibatch's gradient is "
                                                    "summed over this many micro-batches (less activation memory)")

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("name", "grpo") in ALGORITHM_PRESETS:
            return _merge(ALGORITHM_PRESETS[data.get("name", "grpo")], data)
        return data

    def loss_spec(self, max_new_tokens: int):
        from spotrl.model.train_step import LossSpec

        norm = self.norm_constant
        if self.aggregation == "seq_mean_token_sum_norm" and norm is None:
            norm = float(max_new_tokens)  # Dr.GRPO: a constant, the generation budget
        return LossSpec(
            ratio_level=self.ratio_level, clip_low=self.clip_low, clip_high=self.clip_high, dual_clip=self.dual_clip,
            aggregation=self.aggregation, norm_constant=norm, kl_coef=0.0 if self.kl.in_reward else self.kl.coef,
            kl_estimator=self.kl.estimator, entropy_coef=self.entropy_coef,
            value_coef=self.value.coef if self.value.head != "none" else 0.0, value_clip=self.value.clip,
        )

    def advantage_spec(self, group_size: int):
        from spotrl.model.update import AdvantageSpec

        return AdvantageSpec(
            estimator=self.advantage, group_size=group_size, eps=self.advantage_eps,
            kl_in_reward_coef=self.kl.coef if self.kl.in_reward else 0.0, kl_estimator=self.kl.estimator,
            gamma=self.value.gamma, lam=self.value.lam,
        )

    @model_validator(mode="after")
    def _parts_fit(self):
        if (self.advantage == "gae") != (self.value.head != "none"):
            raise ValueError("advantage 'gae' and a value head (value.head 'shared' or 'separate') go together")
        if self.kl.in_reward and self.advantage not in ("reinforce_pp", "reinforce_pp_baseline", "gae"):
            raise ValueError(f"kl.in_reward needs per-token returns: advantage 'reinforce_pp' or 'gae', not {self.advantage!r}")
        if self.norm_constant is not None and self.aggregation != "seq_mean_token_sum_norm":
            raise ValueError("norm_constant only applies to aggregation 'seq_mean_token_sum_norm'")
        return self


class OptimizerConfig(_Section):
    learning_rate: float = Field(3e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    b1: float = Field(0.9, ge=0, lt=1)
    b2: float = Field(0.999, ge=0, lt=1)
    grad_clip: float = Field(1.0, ge=0)


class EvalConfig(_Section):
    n: int = Field(16, gt=0, description="samples per held-out prompt")
    k: int = Field(8, gt=0)
    prompts: int = Field(400, gt=0)
    temperature: float = Field(1.0, gt=0)
    every: int = Field(0, ge=0, description="also evaluate every this many iterations (0: start and end only)")

    @field_validator("k")
    @classmethod
    def _k_le_n(cls, k: int, info: ValidationInfo) -> int:
        n = info.data.get("n")
        if n is not None and k > n:
            raise ValueError(f"k ({k}) must be <= eval.n ({n}): pass@k needs at least k samples")
        return k


class CheckpointConfig(_Section):
    keep: int = Field(3, gt=0)


class WeightsConfig(_Section):
    keep: int = Field(3, gt=0)


class RunConfig(_Section):
    seed: int = 0
    iterations: int = Field(200, ge=0)
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    curation: CurationConfig = CurationConfig()
    warmstart: WarmStartConfig = WarmStartConfig()
    rollout: RolloutConfig = RolloutConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    weights: WeightsConfig = WeightsConfig()

    @model_validator(mode="after")
    def _cross_checks(self):
        batch = self.rollout.prompts_per_iteration * self.rollout.group_size
        if batch % self.algorithm.minibatches:
            raise ValueError(
                f"algorithm.minibatches ({self.algorithm.minibatches}) must divide the rollout batch "
                f"(rollout.prompts_per_iteration * rollout.group_size = {batch})"
            )
        if (batch // self.algorithm.minibatches) % self.algorithm.micro_batches:
            raise ValueError(f"algorithm.micro_batches ({self.algorithm.micro_batches}) must divide the minibatch "
                             f"({batch // self.algorithm.minibatches} rows)")
        if self.rollout.shards > self.rollout.prompts_per_iteration:
            raise ValueError(
                f"rollout.shards ({self.rollout.shards}) > rollout.prompts_per_iteration "
                f"({self.rollout.prompts_per_iteration}): a shard would have no prompts"
            )
        if self.weights.keep < self.rollout.max_staleness + 1:
            raise ValueError(f"weights.keep ({self.weights.keep}) must be >= rollout.max_staleness + 1 "
                             f"({self.rollout.max_staleness + 1}): stale rollouts need those versions")
        from spotrl.curation import taskspec
        from spotrl.curation.arithmetic import distinct_problems

        if self.task.name == "math" and not self.curation.sources:
            raise ValueError("task.name 'math' has no built-in prompts: name dataset sources in curation.sources")
        capacity = distinct_problems(self.task.min_digits, self.task.max_digits)
        if self.task.name == "arithmetic" and not self.curation.sources and \
                self.task.train_size + self.task.eval_size > capacity:
            raise ValueError(f"task.train_size + task.eval_size ({self.task.train_size + self.task.eval_size}) > the "
                             f"{capacity} distinct problems with {self.task.min_digits}..{self.task.max_digits} digits")
        overlong = self.algorithm.overlong
        if overlong.enabled and (overlong.max_tokens or self.rollout.max_new_tokens) <= overlong.cache_tokens:
            raise ValueError("algorithm.overlong.cache_tokens must be smaller than its max_tokens")
        vocab = taskspec.tokenizer(self.task.name).vocab_size
        if self.model.vocab_size < vocab:
            raise ValueError(f"model.vocab_size ({self.model.vocab_size}) < the task tokenizer's {vocab} tokens")
        if self.eval.prompts > self.task.eval_size:
            raise ValueError(f"eval.prompts ({self.eval.prompts}) > task.eval_size ({self.task.eval_size})")
        return self

    def digest(self) -> str:
        """Content hash of the config: the identity of a run."""
        return hashlib.sha256(json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]


class ConfigError(ValueError):
    """A config that cannot run; the message names each offending dotted key."""


def _format(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        lines.append(f"  {key}: {msg}")
    return "invalid config:\n" + "\n".join(lines)


def parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"--set expects dotted.key=value, got {item!r}")
    key, raw = item.split("=", 1)
    return key.strip().split("."), yaml.safe_load(raw)


def build_config(data: dict | None = None, overrides: list[str] = ()) -> RunConfig:
    """A validated RunConfig from a dict (a preset) and `dotted.key=value` overrides."""
    data = json.loads(json.dumps(data or {}))
    for item in overrides:
        path, value = parse_override(item)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {part!r} is not a section")
        node[path[-1]] = value
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format(err)) from None


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    data = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping, not {type(data).__name__}")
    try:
        return build_config(data, overrides)
    except ConfigError as err:
        raise ConfigError(f"{path or 'defaults'}: {err}") from None


def config_diff(a: RunConfig, b: RunConfig) -> list[str]:
    """Dotted keys whose values differ between two configs."""

    def flat(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flat(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}", v

    fa, fb = dict(flat(a.model_dump(mode="json"))), dict(flat(b.model_dump(mode="json")))
    return sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))
