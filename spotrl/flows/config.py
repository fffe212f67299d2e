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
from spotrl.model.tokenizer import CharTokenizer


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TaskConfig(_Section):
    name: Literal["arithmetic"] = "arithmetic"
    train_size: int = Field(20000, gt=0)
    eval_size: int = Field(400, gt=0)
    min_digits: int = Field(2, ge=1, le=4)
    max_digits: int = Field(4, ge=1, le=4)

    @model_validator(mode="after")
    def _digits(self):
        if self.min_digits > self.max_digits:
            raise ValueError(f"min_digits ({self.min_digits}) > max_digits ({self.max_digits})")
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


class AlgorithmConfig(_Section):
    name: Literal["grpo"] = "grpo"
    clip_eps: float = Field(0.2, gt=0, lt=1)
    advantage_eps: float = Field(1e-4, gt=0)
    minibatches: int = Field(4, gt=0)
    epochs: int = Field(1, gt=0)


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
        if self.rollout.shards > self.rollout.prompts_per_iteration:
            raise ValueError(
                f"rollout.shards ({self.rollout.shards}) > rollout.prompts_per_iteration "
                f"({self.rollout.prompts_per_iteration}): a shard would have no prompts"
            )
        vocab = CharTokenizer().vocab_size
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
