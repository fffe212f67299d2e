"""The presets shipped with spotrl, and the loader that turns a preset (by name or path) plus
`dotted.key=value` overrides into a validated `RunConfig`.

`tiny.yaml` is the commented base config: the field defaults of spotrl/config.py with their
descriptions, written by `python -m spotrl.configs.base`; every other preset overrides some of its
keys. They ship inside the package, so an installed wheel has them: `spotrl train --config
qwen2.5-0.5b` or `--config path/to/my.yaml`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from spotrl.config import ConfigError, RunConfig
from spotrl.configs.yaml_file import YamlProblem, parse, read_mapping
from spotrl.model.hf.config import CheckpointError, resolve_model_config
from spotrl.storage.paths import AnyPath

PRESETS_DIR = Path(__file__).parent


def presets() -> list[str]:
    """The names of the shipped presets."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def preset_path(name_or_path: str | Path) -> Path:
    """A shipped preset's file by name ("qwen2.5-0.5b"), or the given path to a YAML file."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.parent != Path("."):
        return path
    if (PRESETS_DIR / f"{name_or_path}.yaml").is_file():
        return PRESETS_DIR / f"{name_or_path}.yaml"
    if path.is_dir():  # `--config configs`: the reader says what it is rather than "no preset"
        return path
    raise ConfigError(f"no preset {name_or_path!r}; shipped: {', '.join(presets())} (or give a path to a .yaml file)")


def _format(err: ValidationError, overrides: list[str] = ()) -> str:
    """One line per error, naming the dotted key and, when a `--set` gave it (or a section above it), that override."""
    given = {item.split("=", 1)[0].strip(): item for item in overrides}
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ")
        parts = key.split(".")
        by = next((given[k] for k in (".".join(parts[:i]) for i in range(len(parts), 0, -1)) if k in given), None)
        lines.append(f"  {key}: {msg}" + (f" (from --set {by})" if by else ""))
    return "invalid config:\n" + "\n".join(lines)


def parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"--set expects dotted.key=value, got {item!r}")
    key, raw = item.split("=", 1)
    try:
        value = parse(raw)
    except YamlProblem as problem:  # the position inside a one-line value says little: the override does
        raise ConfigError(f"{key.strip()}: {problem.what} (from --set {item})") from None
    return key.strip().split("."), value


def build_config(data: dict | None = None, overrides: list[str] = ()) -> RunConfig:
    """A validated RunConfig from a dict (a preset) and `dotted.key=value` overrides; with `model.path`,
    the architecture keys not given are read from the checkpoint's config.json (and those given checked)."""
    data = json.loads(json.dumps(data or {}))
    for item in overrides:
        path, value = parse_override(item)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {part!r} is not a section")
        node[path[-1]] = value
    if isinstance(data, dict) and "model" in data:  # with model.path: architecture keys from its config.json
        try:
            data["model"] = resolve_model_config(data["model"])
        except CheckpointError as err:
            raise ConfigError(f"invalid config:\n  model: {err}") from None
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format(err, overrides)) from None


def resolve(config: RunConfig) -> RunConfig:
    """A RunConfig validated elsewhere (a Prefect deployment's `config` parameter), completed as
    `build_config` completes a file's: with model.path, the architecture keys it does not set come
    from the checkpoint's config.json, and those it sets must agree. Without a path, `config` itself."""
    if not config.model.path:
        return config
    data = config.model_dump(mode="json")
    data["model"] = config.model.model_dump(mode="json", exclude_unset=True)  # the keys the caller set
    return build_config(data)


def _read_preset(name_or_path: str | Path) -> tuple[dict, Path]:
    path = preset_path(name_or_path)
    return read_mapping(path), path


def read_resolved_config(path: str | AnyPath) -> RunConfig:
    """The resolved config a run directory holds (RUN/config.yaml), validated as written: every key is
    there, so no checkpoint is read. Errors name the file (and the line where its YAML is wrong)."""
    data = read_mapping(path)
    if not data:
        raise ConfigError(f"{path}: empty, not a run's config")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{path}: {_format(err)}") from None


def load_config(name_or_path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """A preset by name or path (None: the defaults, which are tiny.yaml's) with overrides applied."""
    data, path = _read_preset(name_or_path) if name_or_path is not None else ({}, None)
    try:
        return build_config(data, overrides)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}" if path else str(err)) from None


def _merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def with_preset(preset: str | None, config: RunConfig) -> RunConfig:
    """The keys set in `config` over a preset, as `--config PRESET --set KEY=VALUE` (a deployment's
    `preset` parameter). Only the keys the caller gave count (pydantic's fields_set): a default of
    RunConfig never hides the preset's value. Without a preset, `config` as it is."""
    if preset is None:
        return config
    data, path = _read_preset(preset)
    try:
        return build_config(_merged(data, config.model_dump(mode="json", exclude_unset=True)))
    except ConfigError as err:
        raise ConfigError(f"{path} with the given config: {err}") from None
