"""The run config: typed, validated at construction, and the train flow's parameter.

Every field has the value of the built-in tiny preset, and its description is the one source of the
key's documentation (`spotrl/configs/tiny.yaml` is written from both: spotrl/configs/base.py); a
preset or `--set key=value` overrides it (the loader: spotrl/configs/). Unknown keys,
wrong types and impossible values fail here, before any work starts, with the dotted key in the
message. No I/O and no import of the layers above: registries are asked by kind (spotrl/registry.py).
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from spotrl.algorithm_presets import ALGORITHM_PRESETS, ALGORITHMS, merged
from spotrl.config_migrations import renamed_keys, without_added_defaults
from spotrl.registry import registry

# The keys that describe the network itself: with `path` set they come from the checkpoint's
# config.json (the loader completes the section: spotrl.model.hf.config.resolve_model_config); the
# other keys say how to run it.
ARCHITECTURE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "rope_theta",
    "rope_scaling",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_embeddings",
    "qkv_bias",
)


class RopeScaling(BaseModel):
    """Llama 3 rotary-frequency scaling (`"rope_type": "llama3"` in a Hugging Face config).

    Wavelengths shorter than original_max_position_embeddings / high_freq_factor keep their
    frequency, those longer than original_max_position_embeddings / low_freq_factor are divided by
    `factor`, and the ones in between are interpolated smoothly.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    rope_type: Literal["llama3"] = Field("llama3", description="the scaling scheme; only Llama 3's is implemented")
    factor: float = Field(8.0, gt=0, description="long wavelengths are divided by this")
    low_freq_factor: float = Field(
        1.0, gt=0, description="wavelengths above original_max_position_embeddings / low_freq_factor are scaled"
    )
    high_freq_factor: float = Field(
        4.0,
        gt=0,
        description="wavelengths below original_max_position_embeddings / high_freq_factor keep their frequency",
    )
    original_max_position_embeddings: int = Field(
        8192, gt=0, description="the context length the model was pretrained with"
    )

    @model_validator(mode="after")
    def _check_band(self) -> RopeScaling:
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"high_freq_factor ({self.high_freq_factor}) must be greater than low_freq_factor "
                f"({self.low_freq_factor})"
            )
        return self


class MeshConfig(BaseModel):
    """Device mesh the parameters are laid out on: fsdp x tp devices (1 x 1: one device, no sharding)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fsdp: int = Field(1, gt=0, description="parameters and the batch split over this many devices")
    tp: int = Field(1, gt=0, description="tensor parallel: attention heads and MLP columns split this many ways")

    @property
    def devices(self) -> int:
        return self.fsdp * self.tp


class ModelConfig(BaseModel):
    """Shape of a decoder-only transformer (Qwen2 / Llama family), and where its weights come from.

    Defaults are the built-in tiny model that trains on two CPU cores. With `path` (a Hugging Face
    checkpoint directory, local or gs://) the config loader (spotrl/configs/) reads the architecture
    keys that are not given from its config.json, and those that are given must agree with it; a
    preset lists them all so that it validates, and its memory estimate is computed, without the
    checkpoint at hand. Validation itself does no I/O: a ModelConfig built directly is checked
    against its checkpoint when the run starts (spotrl/model/hf/loader.py, check_checkpoint).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(16, gt=0, description="token ids; >= the tokenizer's (the character tokenizer has 15)")
    hidden_size: int = Field(96, gt=0, description="width of the residual stream")
    intermediate_size: int = Field(256, gt=0, description="width of the SwiGLU MLP")
    num_layers: int = Field(3, gt=0, description="decoder layers")
    num_heads: int = Field(4, gt=0, description="query heads per layer")
    num_kv_heads: int = Field(
        2, gt=0, description="key/value heads (grouped-query attention: num_heads must be a multiple)"
    )
    head_dim: int | None = Field(None, gt=0, description="null: hidden_size // num_heads")
    rope_theta: float = Field(10000.0, gt=0, description="RoPE base frequency")
    rope_scaling: RopeScaling | None = Field(None, description="null: plain RoPE; Llama 3.1+ checkpoints set it")
    max_position_embeddings: int = Field(32768, gt=0, description="context length the checkpoint declares")
    rms_norm_eps: float = Field(1e-6, gt=0, description="epsilon of the RMSNorm layers")
    tie_embeddings: bool = Field(True, description="the output projection reuses the token embedding")
    qkv_bias: bool = Field(False, description="biases on the query/key/value projections (Qwen2: true)")
    dtype: str = Field(
        "float32",
        pattern="^(float32|bfloat16)$",
        description="float32 | bfloat16: the parameters (a checkpoint's tensors are converted on load)",
    )
    compute_dtype: str | None = Field(
        None,
        pattern="^(float32|bfloat16)$",
        description="dtype of the matmuls and activations; null: dtype. float32 weights with bfloat16 "
        "compute is mixed precision (the optimizer updates float32 master weights)",
    )
    path: str | None = Field(
        None,
        description="Hugging Face checkpoint directory (local or gs://; see qwen2.5-0.5b.yaml): its config.json "
        "gives the architecture keys that are not set (those set must agree), its tokenizer.json replaces the "
        "character tokenizer, generation_config.json's eos ids all stop a completion, and the supervised warm "
        "start is skipped (the checkpoint is the starting policy); a bad checkpoint fails before any work. "
        "null: the built-in model, randomly initialised, and the character tokenizer",
    )
    chat_template: bool = Field(
        True,
        description="render problem prompts through the checkpoint tokenizer's chat template, as a user turn "
        "(when it has one)",
    )
    remat: bool = Field(False, description="recompute each layer's activations in the backward pass (memory for FLOPs)")
    mesh: MeshConfig = Field(
        MeshConfig(), description="devices the parameters are sharded over (fsdp x tp must be the device count)"
    )
    sharding_rules: tuple[tuple[str, tuple[str | None, ...]], ...] | None = Field(
        None,
        description="[regex over a parameter path, [mesh axis or null per dimension]], first match wins; "
        "null: spotrl.model.hf.loader.DEFAULT_RULES (FSDP over 'fsdp', Megatron-style columns and rows over 'tp')",
    )

    @model_validator(mode="after")
    def _check_rules(self) -> ModelConfig:
        import re

        for pattern, axes in self.sharding_rules or ():
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"sharding_rules: {pattern!r} is not a regular expression ({err})") from None
            unknown = set(axes) - {"fsdp", "tp", None}
            if unknown:  # an unknown axis would silently replicate the tensor
                raise ValueError(
                    f"sharding_rules: {pattern!r} names mesh axes {sorted(unknown)} (the mesh has fsdp, tp)"
                )
        return self

    @model_validator(mode="after")
    def _check_heads(self) -> ModelConfig:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads}) "
                "unless head_dim is set"
            )
        return self

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def resolved_compute_dtype(self) -> str:
        return self.compute_dtype or self.dtype


def architecture_mismatches(config: ModelConfig, checkpoint: ModelConfig) -> list[str]:
    """'key: config X, checkpoint Y' for every architecture key on which the two differ."""
    problems = []
    for key in ARCHITECTURE_KEYS:
        ours, theirs = getattr(config, key), getattr(checkpoint, key)
        if key == "head_dim":
            ours, theirs = config.resolved_head_dim, checkpoint.resolved_head_dim
        if ours != theirs:
            problems.append(f"model.{key}: config {ours!r}, checkpoint {theirs!r}")
    return problems


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _registered(*kinds: str):
    """A name field whose value must be registered in the registry of one of `kinds`: the registry
    owns the names (see spotrl.registry: it is imported on first use, config being the bottom layer).
    An unknown name is a ValueError listing the known ones; the JSON schema (Prefect's form for the
    flow's parameters) gets them as its enum."""

    def known() -> list[str]:
        return sorted({name for kind in kinds for name in registry(kind).names()})

    def check(name: str) -> str:
        if name not in known():
            raise ValueError(f"no {' or '.join(kinds)} {name!r}; known: {known()}")
        return name

    return Annotated[str, AfterValidator(check), Field(json_schema_extra=lambda schema: schema.update(enum=known()))]


class ReasoningGymDatasetConfig(_Section):
    """One reasoning-gym generator (checked against reasoning-gym's registry when the run's problem
    is `reasoning_gym`: spotrl/problems/reasoning_gym.py)."""

    name: str = Field(description="a reasoning-gym dataset, e.g. countdown, chain_sum, leg_counting")
    weight: float = Field(1.0, gt=0, description="its share of the generated prompts")
    options: dict[str, Any] = Field(
        default_factory=dict, description="generator options: fields of the dataset's config, e.g. {max_numbers: 4}"
    )

    def __hash__(self) -> int:  # hashable like the run config (`options` is a dict)
        return hash(json.dumps(self.model_dump(mode="json"), sort_keys=True))


class ReasoningGymConfig(_Section):
    datasets: tuple[ReasoningGymDatasetConfig, ...] = Field(
        (),
        description="problem.name reasoning_gym: the generators its train_size + eval_size prompts are drawn from, "
        "mixed by weight, e.g. [{name: chain_sum, weight: 1, options: {min_terms: 2}}]",
    )


class CountdownConfig(_Section):
    """The built-in no-label problem: given numbers and a target, an expression using each number once."""

    numbers: int = Field(3, ge=2, le=6, description="numbers per instance (each used exactly once)")
    min_value: int = Field(1, ge=1, description="smallest number")
    max_value: int = Field(9, ge=1, description="largest number")
    min_target: int = Field(1, ge=1, description="smallest target")
    max_target: int = Field(99, ge=1, description="largest target")

    @model_validator(mode="after")
    def _ranges(self):
        if self.min_value > self.max_value:
            raise ValueError(f"min_value ({self.min_value}) > max_value ({self.max_value})")
        if self.min_target > self.max_target:
            raise ValueError(f"min_target ({self.min_target}) > max_target ({self.max_target})")
        return self


class ProblemConfig(_Section):
    name: _registered("problem") = Field(
        "arithmetic",
        description="a problem in spotrl.problems: the verifier and tokenizer; built-in prompts for "
        "arithmetic, code and countdown, generated ones for reasoning_gym, curation.sources for any",
    )
    train_size: int = Field(
        20000, gt=0, description="built-in problems: training prompts generated from the seed (never a held-out one)"
    )
    eval_size: int = Field(400, gt=0, description="built-in problems: held-out prompts (never trained on)")
    min_digits: int = Field(2, ge=1, le=4, description="arithmetic: fewest digits per operand")
    max_digits: int = Field(4, ge=1, le=4, description="arithmetic: most digits per operand")
    verify_workers: int = Field(
        1,
        gt=0,
        description="verifier calls in parallel (threads) when a reward task scores a shard or a difficulty "
        "estimate scores its samples; >1 for verifiers that wait on other processes, like the code sandbox",
    )
    reasoning_gym: ReasoningGymConfig = Field(
        ReasoningGymConfig(), description="problem.name reasoning_gym: its datasets and generator options"
    )
    countdown: CountdownConfig = Field(CountdownConfig(), description="problem.name countdown: instance sizes")

    @model_validator(mode="after")
    def _digits(self):
        if self.min_digits > self.max_digits:
            raise ValueError(f"min_digits ({self.min_digits}) > max_digits ({self.max_digits})")
        return self


class SourceConfig(_Section):
    """A dataset source: JSONL/JSON/Parquet/CSV file or saved `datasets` directory, local or gs://."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$",
        description="the source's name in the manifest, quarantine reasons and --map/--weight",
    )
    path: str = Field(description="a file or saved `datasets` directory, local or gs://")
    map: dict[str, str] = Field(default_factory=dict, description="source column -> id, prompt, answer or tests")
    format: Literal["jsonl", "json", "parquet", "csv", "datasets"] | None = Field(
        None, description="null: from the file name"
    )
    split: str | None = Field(None, description="the split of a saved DatasetDict")
    weight: float | None = Field(None, ge=0, description="mixing weight; none set: every row of every source")

    def __hash__(self) -> int:  # the run config is hashable (a cache key of per-process state); `map` is a dict
        return hash(json.dumps(self.model_dump(mode="json"), sort_keys=True))


class DifficultyConfig(_Section):
    """Pass rates of the training prompts under the current policy; prompts always or never solved
    are left out of the prompt stream (they give group-relative advantages no signal)."""

    every: int = Field(10, gt=0, description="re-estimate before iterations 1, 1 + every, 1 + 2 * every, ...")
    samples: int = Field(8, ge=2, description="completions per prompt for an estimate")
    prompts: int | None = Field(
        None, gt=0, description="estimate this many training prompts (a seeded subset); null: all of them"
    )
    drop_never: bool = Field(True, description="leave out prompts no sample solved")
    drop_always: bool = Field(True, description="leave out prompts every sample solved")


class CurationConfig(_Section):
    sources: tuple[SourceConfig, ...] = Field(
        (),
        description="dataset sources, each with a name, path (local or gs://), map (source column -> id, prompt, "
        "answer or tests), format, split and weight; empty: the problem's built-in prompts",
    )
    eval: tuple[SourceConfig, ...] = Field(
        (), description="held-out sets: training prompts sharing an n-gram with them are removed"
    )
    ngram: int = Field(13, gt=0, description="decontamination n-gram size, in words")
    total: int | None = Field(
        None, gt=0, description="rows to mix from the sources by weight (null: as many as the weights allow)"
    )
    difficulty: DifficultyConfig | None = Field(
        None, description="null: no difficulty filter; else pass-rate estimates filter the prompt stream"
    )

    @model_validator(mode="after")
    def _names(self):
        names = [s.name for s in self.sources + self.eval]
        if len(set(names)) != len(names):
            raise ValueError(f"source names must be distinct: {names}")
        if self.eval and not self.sources:
            raise ValueError("curation.eval decontaminates curation.sources; name the sources too")
        return self


class WarmStartConfig(_Section):
    learning_rate: float = Field(1e-3, gt=0, description="AdamW learning rate of the supervised warm start")
    batch_size: int = Field(128, gt=0, description="examples per supervised step")
    max_steps: int = Field(1000, ge=0, description="supervised steps at most (0: no warm start)")
    check_every: int = Field(10, gt=0, description="measure greedy accuracy every this many steps")
    check_prompts: int = Field(256, gt=0, description="training prompts the greedy accuracy is measured on")
    target_greedy_accuracy: float = Field(
        0.3,
        ge=0,
        le=1,
        description="stop once greedy accuracy reaches this: a mediocre policy leaves RL something to learn",
    )


class RolloutConfig(_Section):
    prompts_per_iteration: int = Field(64, gt=0, description="prompts sampled per RL iteration")
    group_size: int = Field(8, ge=2, description="completions per prompt (the GRPO group)")
    max_new_tokens: int = Field(8, gt=0, description="completion length limit, in tokens")
    temperature: float = Field(1.0, gt=0, description="sampling temperature")
    top_k: int = Field(0, ge=0, description="sample from the k most likely tokens (0: all)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass (1: all)")
    shards: int = Field(1, gt=0, description="rollout work split into this many parallel tasks")
    plan: Literal["lpt", "equal"] = Field(
        "lpt",
        description="how a round's prompts are split over the shards: lpt (by predicted cost, longest first, "
        "to the least-loaded shard) or equal (in order, equal counts); the rollouts are the same either way",
    )
    task_runner: Literal["threads", "ray"] = Field(
        "threads", description="where rollout shards run: this process's thread pool, or Ray workers (prefect-ray)"
    )
    ray_address: str | None = Field(
        None, description="a Ray cluster (ray://host:10001 or auto); null starts a local Ray"
    )
    pull_timeout_seconds: float = Field(
        300.0, gt=0, description="how long a worker waits for a weight version that is not published yet"
    )
    max_staleness: int = Field(
        0,
        ge=0,
        description="k: iteration i samples with weights i-1-k; k >= 1 overlaps "
        "generation with the previous updates (0: on-policy)",
    )
    workers: Annotated[int, Field(gt=0)] | Literal["auto"] | None = Field(
        None,
        description="rollout workers: shards running at once (null: all shards at once; a number: at most "
        "that many; auto: the cost-aware policy picks before each iteration from the run's measurements "
        "and `fleet`); on Ray also the capacity asked of the autoscaler",
    )


class FleetConfig(_Section):
    """Prices, preemptions and the objective of `rollout.workers: auto` and of `spotrl simulate`."""

    spot_price_per_hour: float = Field(1.0, ge=0, description="a rollout worker-hour on spot capacity")
    on_demand_price_per_hour: float = Field(3.0, ge=0, description="a rollout worker-hour on on-demand capacity")
    trainer_price_per_hour: float = Field(24.0, ge=0, description="an hour of the trainer (all its accelerators)")
    spot: bool = Field(True, description="rollout workers run on spot capacity (spot price, preemptible)")
    preemptions_per_hour: float = Field(
        0.05, ge=0, description="expected preemptions per spot worker-hour (Poisson; the simulator and the policy)"
    )
    preemption_notice_seconds: float = Field(
        30.0, ge=0, description="warning before a preemption: a shard ending within it is kept"
    )
    objective: Literal["min_cost", "min_time"] = Field(
        "min_cost",
        description="min_cost: least cost per iteration within the deadline; min_time: least time within the budget",
    )
    deadline_seconds: float | None = Field(
        None, gt=0, description="min_cost: iteration time allowed (null: deadline_slack over the fastest choice)"
    )
    deadline_slack: float = Field(
        0.1, ge=0, description="min_cost without deadline_seconds: up to (1 + this) x the fastest iteration"
    )
    budget_per_iteration: float | None = Field(
        None, gt=0, description="min_time: cost per iteration allowed, in the price's currency (null: no limit)"
    )
    max_workers: int = Field(1024, gt=0, description="auto: the most rollout workers (and at most rollout.shards)")
    cold_start_seconds: float | None = Field(
        None,
        ge=0,
        description="a new worker's process start and compilation (null: measured, the first iteration's excess)",
    )
    weight_pull_bytes_per_s: float = Field(1.25e9, gt=0, description="weight store -> one rollout worker")
    weight_publish_bytes_per_s: float = Field(2.5e9, gt=0, description="trainer -> weight store")
    store_bytes_per_s: float | None = Field(
        None, gt=0, description="the weight store's total egress, shared by workers pulling at once (null: no limit)"
    )


class KLConfig(_Section):
    """KL to the frozen reference policy (the warm-start weights, version 0)."""

    coef: float = Field(0.0, ge=0, description="0 disables it (no reference forward pass)")
    estimator: _registered("KL estimator") = Field(
        "k3", description="k1, k2 or k3 (Schulman's estimators of KL(pi || ref))"
    )
    in_reward: bool = Field(
        False, description="subtract coef * KL from per-token rewards instead of adding it to the loss"
    )


class DynamicSamplingConfig(_Section):
    """DAPO: drop groups whose rewards are all equal; generate more prompts until the batch is full."""

    enabled: bool = Field(False, description="on: groups without reward variance are dropped and replaced")
    max_rounds: int = Field(4, ge=0, description="extra generation rounds per iteration at most")


class OverlongConfig(_Section):
    """DAPO's soft overlong penalty, in tokens: 0 up to max_tokens - cache_tokens, then linear to -penalty."""

    enabled: bool = Field(False, description="on: completions near max_tokens are penalised")
    max_tokens: int | None = Field(None, gt=0, description="default: rollout.max_new_tokens")
    cache_tokens: int = Field(2, ge=0, description="the penalty ramps over this many tokens before max_tokens")
    penalty: float = Field(1.0, ge=0, description="the penalty at max_tokens")


class ValueConfig(_Section):
    """PPO's critic: a value head on the policy's trunk ("shared") or on a trunk of its own ("separate")."""

    head: Literal["none", "shared", "separate"] = Field(
        "none", description="none (no critic) | shared (a head on the policy's trunk) | separate (a trunk of its own)"
    )
    coef: float = Field(0.5, gt=0, description="weight of the value loss")
    clip: float | None = Field(0.2, gt=0, description="value clipping range around the old values (null: none)")
    gamma: float = Field(1.0, gt=0, le=1, description="discount of GAE")
    lam: float = Field(0.95, ge=0, le=1, description="lambda of GAE")
    learning_rate: float = Field(1e-3, gt=0, description="learning rate of a separate critic")


class RFTConfig(_Section):
    """Rejection-sampling fine-tuning (`algorithm.name: rft`, spotrl/rl/rft.py): the supervised step
    on the iteration's verified completions, `epochs` passes in batches of the RL minibatch's size."""

    min_reward: float = Field(1.0, description="keep a completion whose verifier reward is >= this (1: correct)")


class AlgorithmConfig(_Section):
    name: Literal[ALGORITHMS] = Field(
        "grpo",
        description="preset of the parts below: grpo, dr_grpo, dapo, rloo, reinforce_pp, gspo or ppo; "
        "or rft (rejection-sampling fine-tuning, the supervised step on the verified completions)",
    )
    advantage: _registered("advantage estimator", "per-token advantage estimator") = Field(
        "grpo", description="advantage estimator (spotrl/rl/advantages.py)"
    )
    advantage_eps: float = Field(
        1e-4, gt=0, description="added to the std before dividing: A = (r - mean) / (std + eps) (TRL's 1e-4)"
    )
    advantage_std: Literal["sample", "population"] = Field(
        "sample",
        description="the std advantages are divided by (GRPO's group std, REINFORCE++ and PPO's batch std): "
        "sample (ddof 1, as verl and TRL) or population (ddof 0)",
    )
    ratio_level: Literal["token", "sequence"] = Field(
        "token", description="importance ratio per token, or one per sequence (GSPO)"
    )
    clip_low: float = Field(0.2, gt=0, lt=1, description="ratio clipped below at 1 - clip_low")
    clip_high: float = Field(0.2, gt=0, description="ratio clipped above at 1 + clip_high (DAPO: clip-higher)")
    dual_clip: float | None = Field(
        3.0, gt=1, description="objective bounded below by dual_clip * A for A < 0 (verl's default 3; null: off)"
    )
    aggregation: _registered("loss aggregation") = Field(
        "token_mean", description="how token losses become the loss (spotrl/rl/losses.py)"
    )
    norm_constant: float | None = Field(
        None, gt=0, description="seq_mean_token_sum_norm's divisor; default max_new_tokens"
    )
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus weight (0: none)")
    kl: KLConfig = Field(KLConfig(), description="KL penalty to the reference policy")
    dynamic_sampling: DynamicSamplingConfig = Field(DynamicSamplingConfig(), description="DAPO's dynamic sampling")
    overlong: OverlongConfig = Field(OverlongConfig(), description="DAPO's soft overlong penalty")
    value: ValueConfig = Field(ValueConfig(), description="PPO's critic")
    rft: RFTConfig = Field(RFTConfig(), description="rejection-sampling fine-tuning (name rft)")
    importance_cap: float = Field(
        2.0,
        gt=0,
        description="truncated importance weight min(pi_prox / pi_behaviour, cap) "
        "on stale rollouts (rollout.max_staleness >= 1)",
    )
    old_logprobs: Literal["auto", "recompute", "sampler"] = Field(
        "auto",
        description="the logprobs the importance ratio is taken against: recompute (a forward pass of the "
        "trainer's weights over the rollouts), sampler (the behaviour logprobs the sampler recorded, no pass), "
        "auto (sampler where the two can differ only by float rounding: on-policy, float32, the trainer's "
        "devices, no critic; recompute otherwise)",
    )
    minibatches: int = Field(4, gt=0, description="optimizer steps per epoch over an iteration's rollouts")
    epochs: int = Field(1, gt=0, description="passes over an iteration's rollouts")
    micro_batches: int = Field(
        1,
        gt=0,
        description="gradient accumulation: each minibatch's gradient is "
        "summed over this many micro-batches (less activation memory)",
    )

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("name", "grpo") in ALGORITHM_PRESETS:
            return merged(ALGORITHM_PRESETS[data.get("name", "grpo")], data)
        return data

    @model_validator(mode="after")
    def _rft_parts(self):
        if self.name == "rft" and (self.value.head != "none" or self.kl.coef > 0):
            raise ValueError(
                "name 'rft' takes value.head 'none' and kl.coef 0 (it trains with the supervised loss only)"
            )
        return self

    @model_validator(mode="after")
    def _parts_fit(self):
        if (self.advantage == "gae") != (self.value.head != "none"):
            raise ValueError("advantage 'gae' and a value head (value.head 'shared' or 'separate') go together")
        if self.kl.in_reward and self.advantage not in registry("per-token advantage estimator"):
            raise ValueError(
                f"kl.in_reward needs per-token returns: advantage one of "
                f"{registry('per-token advantage estimator').names()}, not {self.advantage!r}"
            )
        if self.norm_constant is not None and self.aggregation != "seq_mean_token_sum_norm":
            raise ValueError("norm_constant only applies to aggregation 'seq_mean_token_sum_norm'")
        return self


class OptimizerConfig(_Section):
    learning_rate: float = Field(3e-4, gt=0, description="AdamW learning rate of the RL updates")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    b1: float = Field(0.9, ge=0, lt=1, description="AdamW first-moment decay")
    b2: float = Field(0.999, ge=0, lt=1, description="AdamW second-moment decay")
    grad_clip: float = Field(1.0, ge=0, description="global gradient-norm clip (0: none)")


class EvalConfig(_Section):
    n: int = Field(16, gt=0, description="samples per held-out prompt")
    k: int = Field(8, gt=0, description="the k of pass@k (<= n)")
    prompts: int = Field(400, gt=0, description="held-out prompts evaluated")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of the evaluation")
    every: int = Field(0, ge=0, description="also evaluate every this many iterations (0: start and end only)")

    @field_validator("k")
    @classmethod
    def _k_le_n(cls, k: int, info: ValidationInfo) -> int:
        n = info.data.get("n")
        if n is not None and k > n:
            raise ValueError(f"k ({k}) must be <= eval.n ({n}): pass@k needs at least k samples")
        return k


class CheckpointConfig(_Section):
    keep: int = Field(3, gt=0, description="sealed checkpoints kept (older ones are pruned)")


class WeightsConfig(_Section):
    keep: int = Field(3, gt=0, description="weight versions kept (besides any a worker holds a lease on)")


class RunConfig(_Section):
    seed: int = Field(0, description="every random choice derives from (seed, stream, iteration, shard)")
    iterations: int = Field(200, ge=0, description="RL iterations after the warm start")
    model: ModelConfig = Field(
        ModelConfig(),
        description="the network (a Qwen2/Llama-shaped decoder; by default 306k parameters, trained on 2 CPU "
        "cores) and where its weights come from",
    )
    problem: ProblemConfig = Field(ProblemConfig(), description="what the policy learns to solve, and its verifier")
    curation: CurationConfig = Field(
        CurationConfig(), description="prompt datasets: sources, decontamination, mixing, difficulty"
    )
    warmstart: WarmStartConfig = Field(
        WarmStartConfig(),
        description="the supervised warm start: it stops once the policy is mediocre, not perfect (skipped with "
        "model.path)",
    )
    rollout: RolloutConfig = Field(
        RolloutConfig(), description="generation: prompts, samples, sampling, fan-out, staleness"
    )
    algorithm: AlgorithmConfig = Field(
        AlgorithmConfig(), description="the RL algorithm: advantage, loss, clipping, KL, minibatches"
    )
    optimizer: OptimizerConfig = Field(
        OptimizerConfig(), description="AdamW of the RL updates (optax, after global-norm clipping)"
    )
    eval: EvalConfig = Field(
        EvalConfig(), description="held-out pass@k (the unbiased estimator, from n samples per prompt)"
    )
    checkpoint: CheckpointConfig = Field(CheckpointConfig(), description="train-state checkpoints")
    weights: WeightsConfig = Field(WeightsConfig(), description="published weight versions")
    fleet: FleetConfig = Field(
        FleetConfig(), description="rollout fleet: prices, preemptions, the objective of rollout.workers=auto"
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        """Old names of keys read as the new ones (spotrl/config_migrations.py)."""
        return renamed_keys(data)

    @model_validator(mode="after")
    def _cross_checks(self):
        batch = self.rollout.prompts_per_iteration * self.rollout.group_size
        if batch % self.algorithm.minibatches:
            raise ValueError(
                f"algorithm.minibatches ({self.algorithm.minibatches}) must divide the rollout batch "
                f"(rollout.prompts_per_iteration * rollout.group_size = {batch})"
            )
        if (batch // self.algorithm.minibatches) % self.algorithm.micro_batches:
            raise ValueError(
                f"algorithm.micro_batches ({self.algorithm.micro_batches}) must divide the minibatch "
                f"({batch // self.algorithm.minibatches} rows)"
            )
        if self.rollout.shards > self.rollout.prompts_per_iteration:
            raise ValueError(
                f"rollout.shards ({self.rollout.shards}) > rollout.prompts_per_iteration "
                f"({self.rollout.prompts_per_iteration}): a shard would have no prompts"
            )
        if self.weights.keep < self.rollout.max_staleness + 1:
            raise ValueError(
                f"weights.keep ({self.weights.keep}) must be >= rollout.max_staleness + 1 "
                f"({self.rollout.max_staleness + 1}): stale rollouts need those versions"
            )
        if self.algorithm.old_logprobs == "sampler" and self.rollout.max_staleness > 0:
            raise ValueError(
                "algorithm.old_logprobs 'sampler' needs rollout.max_staleness 0: stale rollouts are corrected "
                "with the trainer's logprobs (use recompute or auto)"
            )
        problem = registry("problem")[self.problem.name]
        if problem.check_config is not None:  # what only this problem needs (built-in prompts, sources)
            problem.check_config(self)
        overlong = self.algorithm.overlong
        if overlong.enabled and (overlong.max_tokens or self.rollout.max_new_tokens) <= overlong.cache_tokens:
            raise ValueError("algorithm.overlong.cache_tokens must be smaller than its max_tokens")
        vocab = problem.tokenizer().vocab_size
        if self.model.vocab_size < vocab:
            raise ValueError(f"model.vocab_size ({self.model.vocab_size}) < the problem tokenizer's {vocab} tokens")
        if self.eval.prompts > self.problem.eval_size:
            raise ValueError(f"eval.prompts ({self.eval.prompts}) > problem.eval_size ({self.problem.eval_size})")
        return self

    def digest(self) -> str:
        """Content hash of the config: the identity of a run. Keys added after runs existed count only
        when they differ from their default (spotrl/config_migrations.py, ADDED_KEYS), so a config that
        leaves them alone keeps the identity it had before they were added."""
        data = without_added_defaults(self.model_dump(mode="json"), RunConfig.model_construct().model_dump(mode="json"))
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


class ConfigError(ValueError):
    """A config that cannot run; the message names each offending dotted key."""


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
