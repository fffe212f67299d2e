"""tiny.yaml, the commented base config, is written from the config model (spotrl/configs/base.py):
a key's description has one source, its `Field(description=...)` in spotrl/config.py."""

import pytest
import yaml

from spotrl.algorithm_presets import ALGORITHMS
from spotrl.configs import PRESETS_DIR, build_config
from spotrl.configs.base import base_yaml


def test_tiny_yaml_is_what_the_generator_writes():
    shipped = (PRESETS_DIR / "tiny.yaml").read_text()
    assert shipped == base_yaml(), "spotrl/configs/tiny.yaml is stale: run `python -m spotrl.configs.base`"


@pytest.mark.parametrize("name", ALGORITHMS)
def test_a_copy_of_tiny_yaml_takes_any_algorithm_preset_whole(name):
    """The parts an algorithm preset sets are commented out in the base config: with another
    algorithm.name, a copy of it runs that preset, not GRPO's values."""
    data = yaml.safe_load(base_yaml())
    data["algorithm"]["name"] = name
    assert build_config(data) == build_config({"algorithm": {"name": name}})
