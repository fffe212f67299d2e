"""Train-state checkpoints with orbax: arrays through StandardSave, run metadata as JSON.

One directory per iteration, `iter_000005/`; orbax writes it under a temporary name and commits it
by rename, so an incomplete checkpoint is never listed. The metadata holds everything that is not
an array and decides the future of the run: iteration, weights version, data cursor, RNG seed path.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import jax
import orbax.checkpoint as ocp

_NAME = re.compile(r"^iter_(\d{6})$")


class CheckpointStore:
    def __init__(self, root: str | Path, keep: int = 3):
        self.root = Path(root)
        self.keep = keep
        self._checkpointer = ocp.Checkpointer(ocp.CompositeCheckpointHandler())

    def path(self, iteration: int) -> Path:
        return self.root / f"iter_{iteration:06d}"

    def iterations(self) -> list[int]:
        if not self.root.exists():
            return []
        found = []
        for p in self.root.iterdir():
            m = _NAME.match(p.name)
            if m and (p / "commit_success.txt").exists():
                found.append(int(m.group(1)))
        return sorted(found)

    def save(self, iteration: int, state, metadata: dict) -> Path:
        """Save a pytree of arrays and a JSON-able dict; idempotent for a committed iteration."""
        path = self.path(iteration)
        if iteration not in self.iterations():
            self.root.mkdir(parents=True, exist_ok=True)
            self._checkpointer.save(
                path,
                ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(metadata)),
                force=True,
            )
        return path

    def restore(self, iteration: int, template) -> tuple[object, dict]:
        """The state shaped like `template` (a pytree of arrays or ShapeDtypeStructs) and the metadata."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        restored = self._checkpointer.restore(
            self.path(iteration),
            ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()),
        )
        # orbax returns containers as plain tuples/dicts: put the template's structure back
        state = jax.tree.unflatten(jax.tree.structure(template), jax.tree.leaves(restored.state))
        return state, dict(restored.meta)

    def prune(self) -> None:
        for iteration in self.iterations()[: -self.keep]:
            shutil.rmtree(self.path(iteration), ignore_errors=True)
