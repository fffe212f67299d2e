"""The algorithm presets: what `algorithm.name` stands for, as a choice of the algorithm's parts.

The field defaults of spotrl.config.AlgorithmConfig are GRPO's (with the token-mean aggregation
verl and DAPO use); a preset overrides some of them, and any key set explicitly in a config file or
with --set overrides the preset (AlgorithmConfig merges them when it validates). The run presets,
whole configs in YAML, are another thing: spotrl/configs/. No I/O and no import of spotrl.
"""

from __future__ import annotations

ALGORITHM_PRESETS: dict[str, dict] = {
    "grpo": {},
    "dr_grpo": {"advantage": "dr_grpo", "aggregation": "seq_mean_token_sum_norm"},
    "dapo": {"clip_high": 0.28, "dynamic_sampling": {"enabled": True}, "overlong": {"enabled": True}},
    "rloo": {"advantage": "rloo"},
    "reinforce_pp": {"advantage": "reinforce_pp", "kl": {"coef": 0.01, "estimator": "k1", "in_reward": True}},
    "gspo": {"ratio_level": "sequence", "clip_low": 3e-4, "clip_high": 4e-4, "aggregation": "seq_mean_token_mean"},
    "ppo": {"advantage": "gae", "value": {"head": "shared"}},
    "rft": {},  # not a policy gradient: of the parts, only rft, epochs and minibatches apply
}
ALGORITHMS = tuple(ALGORITHM_PRESETS)  # the names `algorithm.name` accepts


def merged(base: dict, override: dict) -> dict:
    """`override` over `base`, section by section: a nested dict merges into the dict it replaces."""
    out = dict(base)
    for key, value in override.items():
        out[key] = merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out
