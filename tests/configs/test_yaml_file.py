"""A config file that cannot be read as YAML is one line naming the file, the line and the column
(spotrl/configs/yaml_file.py), never PyYAML's traceback; the CLI side is tests/cli/test_main.py."""

import re

import pytest

from spotrl.config import ConfigError
from spotrl.configs import build_config, load_config, read_resolved_config
from spotrl.configs.yaml_file import read_mapping

BROKEN = {
    "an unclosed bracket": (
        b"seed: 1\nrollout:\n  group_size: [4\n  temperature: 1\n",
        ":4:14: not valid YAML: expected ',' or ']', but got ':'"
        " (while parsing a flow sequence from line 3, column 15)",
    ),
    "a tab in the indentation": (
        b"seed: 1\nrollout:\n\tgroup_size: 4\n",
        ":3:1: not valid YAML: found character '\\t' that cannot start any token; YAML indents with spaces, not tabs",
    ),
    "Latin-1 bytes": (b"seed: 1\n# caf\xe9\n", ":2:6: not UTF-8 text (byte 0xe9); save the file as UTF-8"),
    "a control character": (b"seed: 1\nx: \x01\n", ":2:4: not valid YAML: unacceptable character #x0001"),
    "two documents": (b"seed: 1\n---\nseed: 2\n", ":2:1: not valid YAML: but found another document"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_file_is_one_line_naming_the_file_line_and_column(tmp_path, case):
    data, expected = BROKEN[case]
    path = tmp_path / "bad.yaml"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as err:
        read_mapping(path)
    assert str(err.value).startswith(f"{path}{expected}") and "\n" not in str(err.value)


def test_a_directory_is_named_as_one_not_as_missing(tmp_path):
    with pytest.raises(ConfigError, match=f"^config file {re.escape(str(tmp_path))} is a directory, not a YAML file$"):
        read_mapping(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        read_mapping(tmp_path / "missing.yaml")


def test_a_directory_given_to_the_loader_by_a_bare_name_is_not_reported_as_an_unknown_preset(tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="^config file configs is a directory, not a YAML file$"):
        load_config("configs")


def test_a_file_must_hold_a_mapping_and_an_empty_one_is_the_defaults(tmp_path):
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="list.yaml must hold a mapping, not list"):
        read_mapping(tmp_path / "list.yaml")
    (tmp_path / "empty.yaml").write_text("# nothing set\n")
    assert read_mapping(tmp_path / "empty.yaml") == {}


def test_an_override_that_is_not_yaml_names_the_key_and_the_override_as_given():
    with pytest.raises(ConfigError) as err:
        build_config(None, ["seed=[1"])
    assert str(err.value) == "seed: not valid YAML: expected ',' or ']', but got '<stream end>' (from --set seed=[1)"


def test_a_run_directorys_config_reads_with_the_same_checks(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_bytes(b"\xff\xfe garbage")
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}:1:1: not UTF-8 text"):
        read_resolved_config(path)
    path.write_text("")  # an empty resolved config is not the defaults: every key was written
    with pytest.raises(ConfigError, match="empty, not a run's config"):
        read_resolved_config(path)
    path.write_text("iterations: -1\n")
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}: invalid config:\n  iterations: "):
        read_resolved_config(path)
