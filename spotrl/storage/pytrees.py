"""Flat names for nested parameter dicts ("layers.0.self_attn.q_proj.kernel"), and back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def flatten(tree: Mapping[Any, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def unflatten_like(template: Mapping[Any, Any], flat: Mapping[str, Any], prefix: str = "", source: str = "") -> dict:
    """Rebuild `template`'s nesting (its key types included) from flat names, checking shapes."""
    out = {}
    for key, value in template.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out[key] = unflatten_like(value, flat, name + ".", source)
            continue
        if name not in flat:
            raise KeyError(f"{source or 'weights'}: missing tensor {name!r}")
        array = flat[name]
        if tuple(np.shape(array)) != tuple(np.shape(value)):
            raise ValueError(
                f"{source or 'weights'}: tensor {name!r} has shape {tuple(np.shape(array))}, "
                f"expected {tuple(np.shape(value))}"
            )
        out[key] = array
    return out
