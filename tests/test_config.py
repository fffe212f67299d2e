import pytest
import yaml

from spotrl.config import ConfigError, RunConfig, config_diff
from spotrl.configs import PRESETS_DIR, build_config, load_config
from spotrl.flows import rundir


def test_tiny_preset_is_the_default():
    assert load_config(PRESETS_DIR / "tiny.yaml") == RunConfig()


@pytest.mark.parametrize(
    "override, key",
    [
        ("eval.k=20", "eval.k"),  # k > n
        ("iterations=-1", "iterations"),
        ("rollout.grop_size=4", "rollout.grop_size"),  # unknown key, a typo
        ("nonsense=1", "nonsense"),
        ("rollout.group_size=many", "rollout.group_size"),  # wrong type
        ("optimizer.learning_rate=0", "optimizer.learning_rate"),
        ("algorithm.advantage_std=median", "algorithm.advantage_std"),  # sample | population
        ("algorithm.dual_clip=1.0", "algorithm.dual_clip"),  # must be > 1
    ],
)
def test_bad_config_names_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        build_config(None, [override])
    assert f"  {key}:" in str(err.value)


def test_overrides_parse_yaml_values():
    cfg = build_config(None, ["iterations=3", "seed=7", "eval.k=4", "rollout.temperature=0.5"])
    assert (cfg.iterations, cfg.seed, cfg.eval.k, cfg.rollout.temperature) == (3, 7, 4, 0.5)


def test_cross_section_checks():
    with pytest.raises(ConfigError, match="minibatches"):
        build_config(None, ["algorithm.minibatches=3"])  # 64*8 is not divisible by 3
    with pytest.raises(ConfigError, match="vocab_size"):
        build_config(None, ["model.vocab_size=8"])


def test_config_file_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"rollout": {"tempreature": 1.0}}))
    with pytest.raises(ConfigError, match=r"bad.yaml.*\n  rollout.tempreature: unknown key"):
        load_config(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_run_dir_with_other_config_is_refused_and_kept(tmp_path):
    a = build_config(None, ["iterations=3"])
    b = build_config(None, ["iterations=4", "seed=1"])
    rundir.prepare(tmp_path, a)
    before = (tmp_path / "config.yaml").read_text()
    with pytest.raises(rundir.RunDirError, match="differing keys: iterations, seed"):
        rundir.prepare(tmp_path, b)
    assert (tmp_path / "config.yaml").read_text() == before
    assert rundir.prepare(tmp_path, a) == tmp_path.resolve()  # the same config resumes
    assert config_diff(a, b) == ["iterations", "seed"]


def test_the_old_task_key_is_read_as_problem_with_a_warning():
    with pytest.warns(DeprecationWarning, match="`task` is now `problem`"):
        old = build_config({"task": {"train_size": 100, "eval_size": 20}}, ["eval.prompts=20"])
    assert old == build_config({"problem": {"train_size": 100, "eval_size": 20}}, ["eval.prompts=20"])
    assert (old.problem.train_size, old.problem.eval_size) == (100, 20)
    with pytest.raises(ConfigError, match="both `task` and `problem`"):
        build_config({"task": {"train_size": 100}, "problem": {"train_size": 100}})


def test_a_run_directory_written_with_the_task_key_resumes(tmp_path):
    """A config.yaml written before the rename (key `task`) holds the same run as today's config."""
    config = build_config(None, ["iterations=3"])
    old = config.model_dump(mode="json")
    old["task"] = old.pop("problem")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    with pytest.warns(DeprecationWarning):
        assert rundir.prepare(tmp_path, config) == tmp_path.resolve()
    with pytest.warns(DeprecationWarning), pytest.raises(rundir.RunDirError, match="problem.train_size"):
        rundir.prepare(tmp_path, build_config(None, ["iterations=3", "problem.train_size=100"]))


def test_every_config_key_has_a_description_for_the_run_form():
    """Prefect renders the flow's `config` parameter as a form from this schema: each key gets help."""
    schema = RunConfig.model_json_schema()
    models = {**schema.get("$defs", {}), "RunConfig": schema}
    missing = [
        f"{name}.{key}"
        for name, model in models.items()
        for key, prop in model.get("properties", {}).items()
        if not prop.get("description")
    ]
    assert not missing, missing


def test_descriptions_are_not_part_of_a_configs_identity():
    # the default config's digest: d688c238dbb19d96 when descriptions were written, until defaults
    # changed what a run computes (dual clip on, sample std; rollout.plan lpt with per-sample random
    # streams; algorithm.old_logprobs auto: the ratio against the sampler's logprobs); keys added since and
    # left at their defaults do not count (config_migrations.ADDED_KEYS)
    assert RunConfig().digest() == "be64e7ff385e9359"
