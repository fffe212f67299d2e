"""tiny.yaml, the commented base config, written from the config model: every key with its default
and its `Field(description=...)` from spotrl/config.py, so that a key is described in one place.

    python -m spotrl.configs.base     # rewrite spotrl/configs/tiny.yaml after a field changed

tests/configs/test_base.py checks that the shipped file is what this writes. An algorithm part that
an algorithm preset sets (spotrl/algorithm_presets.py) is written commented out: set in the file, it
would override every preset's value. A section that is null by default is followed by its keys,
commented out, with their defaults.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from pydantic import BaseModel

from spotrl.algorithm_presets import ALGORITHM_PRESETS
from spotrl.config import AlgorithmConfig, RunConfig

WIDTH = 110  # the longest line, unless a `key: value` alone is longer
MIN_COLUMN, MAX_COLUMN = 25, 33  # where a section's comments start: after its longest `key: value`, within these
TINY = Path(__file__).parent / "tiny.yaml"

HEADER = """\
# The built-in tiny preset: the base config every other preset overrides. `spotrl train` with no
# --config uses exactly these values; override any key with --set, e.g. --set iterations=10 --set eval.k=4.
# Written by `python -m spotrl.configs.base` from the fields of spotrl/config.py and their descriptions:
# change those, then run it again (a test checks that this file is what it writes).
"""
PRESET_PARTS = "(commented out: a part an algorithm preset sets, with GRPO's value; set here, it overrides the preset)"
NULL_SECTION = "(its keys and their defaults)"
PRESET_PART_KEYS = {key for parts in ALGORITHM_PRESETS.values() for key in parts}


class Line(NamedTuple):
    depth: int  # indent, in steps of two spaces
    mark: int | None  # commented out at this depth (None: a live key)
    text: str  # `key: value`, `key:` or a note
    comment: str = ""

    def key(self) -> str:
        if self.mark is None:
            return "  " * self.depth + self.text
        return "  " * self.mark + "# " + "  " * (self.depth - self.mark) + self.text


def _value(value: Any) -> str:
    """`value` as YAML on one line (flow style): null, true, 1.0e-06, [], {min_terms: 2}."""
    value = list(value) if isinstance(value, tuple) else value
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, sort_keys=False)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def _optional_section(annotation: Any) -> type[BaseModel] | None:
    """The section class of a `Section | None` field (a section off by default), else None."""
    args = getattr(annotation, "__args__", ())
    return next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)


def _lines(section: BaseModel, depth: int, mark: int | None) -> list[Line]:
    """Every key of `section` at `depth`, commented out from depth `mark` on (None: live)."""
    lines = []
    for key, field in type(section).model_fields.items():
        value, off = getattr(section, key), mark
        if isinstance(section, AlgorithmConfig):
            if key == "name":
                lines.append(Line(depth, None, f"name: {_value(value)}", field.description))
                lines.append(Line(depth, depth, PRESET_PARTS))
                continue
            if key in PRESET_PART_KEYS and off is None:
                off = depth
        if isinstance(value, BaseModel):
            lines.append(Line(depth, off, f"{key}:", field.description))
            lines += _lines(value, depth + 1, off)
            continue
        lines.append(Line(depth, off, f"{key}: {_value(value)}", field.description))
        section_type = _optional_section(field.annotation)
        if value is None and section_type is not None:
            lines.append(Line(depth, depth if off is None else off, f"{key}:", NULL_SECTION))
            lines += _lines(section_type(), depth + 1, depth if off is None else off)
    return lines


def _format(lines: list[Line]) -> list[str]:
    """The lines with their comments aligned in one column, wrapped at WIDTH."""
    widths = [len(line.key()) + 2 for line in lines if line.comment]
    column = max([MIN_COLUMN] + [width for width in widths if width <= MAX_COLUMN])
    out = []
    for line in lines:
        key = line.key()
        if not line.comment:
            out.append(key)
            continue
        start = max(column, len(key) + 2)
        first, *rest = textwrap.wrap(line.comment, WIDTH - start - 2, break_on_hyphens=False) or [""]
        out.append(f"{key.ljust(start)}# {first}")
        out += [f"{' ' * start}# {more}" for more in rest]
    return out


def base_yaml() -> str:
    """tiny.yaml's text: the defaults of RunConfig, each key with its description."""
    config = RunConfig()
    blocks, top = [], []
    for key, field in RunConfig.model_fields.items():
        value = getattr(config, key)
        if isinstance(value, BaseModel):
            blocks.append(_format([Line(0, None, f"{key}:", field.description), *_lines(value, 1, None)]))
        else:
            top.append(Line(0, None, f"{key}: {_value(value)}", field.description))
    return HEADER + "\n" + "\n\n".join("\n".join(block) for block in [_format(top), *blocks]) + "\n"


if __name__ == "__main__":
    TINY.write_text(base_yaml())
    print(f"wrote {TINY}")
