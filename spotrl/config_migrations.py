"""How configs written by earlier versions of spotrl still read as the same run.

Two kinds of change are kept compatible here, both for a run directory's config.yaml and for a
preset: a key renamed (the old name is read as the new one, with a warning, until it is dropped),
and a key added after runs existed (it counts in a config's identity, RunConfig.digest, only where
it differs from its default). Plain dicts in, plain dicts out: no I/O and no import of spotrl.
"""

from __future__ import annotations

import warnings
from typing import Any

# keys added after runs existed, in the order they came: see RunConfig.digest
ADDED_KEYS = ("rollout.workers", "fleet", "problem.reasoning_gym", "problem.countdown", "algorithm.rft")


def renamed_keys(data: Any) -> Any:
    """A run config's mapping with the old names of its keys read as the new ones: `task:` is the old
    name (until 0.2) of `problem:`, read with a DeprecationWarning; both set is a ValueError."""
    if isinstance(data, dict) and "task" in data:
        if "problem" in data:
            raise ValueError("both `task` and `problem` are set: `task` is the old name of `problem`; keep one")
        warnings.warn(
            "config key `task` is now `problem` (read as `problem` until spotrl 0.2)",
            DeprecationWarning,
            stacklevel=3,  # the caller of the RunConfig validator that calls this
        )
        data = {("problem" if k == "task" else k): v for k, v in data.items()}
    return data


def without_added_defaults(data: dict, defaults: dict) -> dict:
    """`data` (a config's JSON dump) without the ADDED_KEYS whose values equal those in `defaults`,
    so that a config which leaves them alone keeps the identity it had before they were added.
    Changes `data` in place and returns it."""
    for dotted in ADDED_KEYS:
        *parents, leaf = dotted.split(".")
        node, default = data, defaults
        for part in parents:
            node, default = node[part], default[part]
        if node[leaf] == default[leaf]:
            del node[leaf]
    return data
