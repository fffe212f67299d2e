"""The model presets in configs/: each validates without its checkpoint (every architecture key is
written out, so nothing is read from the placeholder gs:// path), has the parameter count its model
card states, and an estimated memory per device that fits one 95 GiB accelerator (TPU v5p) on its mesh."""

import pytest

from spotrl.config import ConfigError, RunConfig
from spotrl.configs import PRESETS_DIR, load_config, with_preset
from spotrl.model.memory import count_params, estimate_memory, memory_estimate, memory_summary

CONFIGS = PRESETS_DIR

# preset -> (parameters on the model card, architecture, devices)
PRESETS = {
    "qwen2.5-0.5b": (0.49e9, "qwen2", 1),
    "qwen2.5-1.5b": (1.54e9, "qwen2", 4),
    "qwen2.5-7b": (7.61e9, "qwen2", 8),
    "qwq-32b": (32.5e9, "qwen2", 32),
    "llama3.2-1b": (1.23e9, "llama", 4),
    "llama3.1-8b": (8.03e9, "llama", 8),
}


def test_every_preset_is_listed():
    # tiny, smoke and countdown (tests/problems/test_countdown.py) are the built-in model's
    assert {p.stem for p in CONFIGS.glob("*.yaml")} - {"tiny", "smoke", "countdown"} == set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_validates_and_fits(name):
    card_params, arch, devices = PRESETS[name]
    config = load_config(CONFIGS / f"{name}.yaml")  # no I/O: the placeholder bucket does not exist
    m = config.model
    assert m.path.startswith("gs://") and m.dtype == "bfloat16" and m.remat
    assert m.qkv_bias == (arch == "qwen2") and (m.rope_scaling is not None) == (arch == "llama")
    assert m.mesh.devices == devices
    assert abs(count_params(m) - card_params) / card_params < 0.01
    r = config.rollout
    estimate = memory_estimate(
        m,
        rollout_rows=r.prompts_per_iteration * r.group_size,
        minibatches=config.algorithm.minibatches,
        prompt_tokens=256,
        new_tokens=r.max_new_tokens,
        reference=False,
    )
    assert estimate["per_device"] < 95 * 2**30
    # the state (params, grads, two AdamW moments, a pulled copy) is 5 copies of the bf16 weights
    state = sum(estimate[k] for k in ("params", "grads", "optimizer", "reference"))
    assert state == 5 * 2 * count_params(m)
    rows, seq = r.prompts_per_iteration * r.group_size // config.algorithm.minibatches, 256 + r.max_new_tokens
    without_remat = estimate_memory(m, batch=rows, seq_len=seq, remat=False)["activations"]
    assert estimate["activations"] < without_remat  # model.remat is what the estimate assumes
    assert f"over {devices}" in memory_summary(m, estimate, 256)


def test_sharding_rules_are_checked_at_start():
    from spotrl.config import ConfigError
    from spotrl.configs import build_config

    with pytest.raises(ConfigError, match=r"model: .*'down_proj' names mesh axes \['dp'\]"):
        build_config({"model": {"sharding_rules": [["down_proj", ["dp", None]]]}})
    with pytest.raises(ConfigError, match="is not a regular expression"):
        build_config({"model": {"sharding_rules": [["(", []]]}})


def test_a_deployments_config_overrides_its_preset_only_where_it_sets_keys():
    assert with_preset(None, RunConfig(iterations=3)) == RunConfig(iterations=3)
    assert with_preset("smoke", RunConfig()) == load_config("smoke")  # no key set: the preset as it is
    given = RunConfig.model_validate({"iterations": 3, "model": {"num_layers": 3}, "eval": {"k": 4}})
    merged = with_preset("smoke", given)
    assert merged == load_config("smoke", ["iterations=3", "model.num_layers=3", "eval.k=4"])
    assert merged.model.hidden_size == 32 and merged.eval.n == 4  # the preset's, beside the keys given
    with pytest.raises(ConfigError, match="no preset 'smok'"):
        with_preset("smok", RunConfig())
    with pytest.raises(ConfigError, match=r"smoke.yaml with the given config: invalid config:\n  eval.k"):
        with_preset("smoke", RunConfig.model_validate({"eval": {"k": 8}}))  # k > the preset's n=4
