"""Device mesh (data, fsdp, tp) and the logical axis rules that place parameters and activations on it.

Code names array dimensions logically ("embed", "heads", "act_batch", ...); `LOGICAL_RULES` maps
each logical name to mesh axes. Parameters get their logical names from their path
(`PARAM_AXES`, regexes over the flat path such as "layers.0.self_attn.q_proj.kernel"), so the
model's code and its checkpoints carry no sharding metadata, and the same rules place the
parameters, their gradients and the optimizer's moments (whose paths end the same way).
Activations are constrained inside the model only while `activation_mesh(mesh)` is active during
tracing; otherwise `constrain` returns its input unchanged, so single-device programs are the
same program as before.

Layout (the usual FSDP + Megatron tensor parallelism):
  data    pure data parallelism: the batch is split, parameters are replicated;
  fsdp    the batch is split and every parameter's "embed" dimension too (gathered per layer);
  tp      tensor parallelism: attention heads, the MLP's hidden dimension and the vocabulary are split
          (the issue's "tensor" axis; named as `model.mesh` names it).
A mesh axis is dropped from a dimension it does not divide, or that an earlier dimension of the
same array already uses: the array is then replicated along that axis instead. Axes of size 1
are dropped too.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np

P = jax.sharding.PartitionSpec
MESH_AXES = ("data", "fsdp", "tp")

# logical name -> mesh axes (in order); names not listed are replicated
LOGICAL_RULES: dict[str, tuple[str, ...]] = {
    # parameters
    "vocab": ("tp",),
    "embed": ("fsdp",),
    "heads": ("tp",),  # heads * head_dim of q, and of k/v (GQA)
    "mlp": ("tp",),
    # activations
    "act_batch": ("data", "fsdp"),
    "act_length": (),
    "act_embed": (),
    "act_heads": ("tp",),
    "act_mlp": ("tp",),
    "act_vocab": ("tp",),
}

# (regex over the flat parameter path, one logical name or None per dimension); first match wins
PARAM_AXES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r"embed_tokens\.embedding$", ("vocab", "embed")),  # [vocab, hidden]
    (r"lm_head\.kernel$", ("embed", "vocab")),  # [hidden, vocab]
    (r"self_attn\.(q|k|v)_proj\.kernel$", ("embed", "heads")),  # column parallel
    (r"self_attn\.(q|k|v)_proj\.bias$", ("heads",)),
    (r"self_attn\.o_proj\.kernel$", ("heads", "embed")),  # row parallel
    (r"mlp\.(gate|up)_proj\.kernel$", ("embed", "mlp")),
    (r"mlp\.down_proj\.kernel$", ("mlp", "embed")),
    (r".*", ()),  # norms, scalars (the optimizer's step count), value heads: replicated
)


def make_mesh(data: int = 1, fsdp: int = 1, tp: int = 1, devices=None) -> jax.sharding.Mesh:
    """A (data, fsdp, tp) mesh over the first data * fsdp * tp devices.

    Axes are `Auto`: the shardings of inputs, parameters and the constraints `constrain` adds
    propagate through the jitted step, so the model's code needs no explicit collectives.
    """
    shape = (data, fsdp, tp)
    count = int(np.prod(shape))
    devices = jax.devices()[:count] if devices is None else list(devices)
    if len(devices) != count:
        raise ValueError(f"mesh {dict(zip(MESH_AXES, shape))} needs {count} devices, {len(devices)} available")
    return jax.sharding.Mesh(
        np.asarray(devices).reshape(shape), MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    )


def logical_spec(
    names: Iterable[str | None],
    shape: tuple[int, ...],
    mesh: jax.sharding.Mesh,
    rules: dict[str, tuple[str, ...]] = LOGICAL_RULES,
) -> jax.sharding.PartitionSpec:
    """PartitionSpec of an array of `shape` whose dimensions have logical `names`, on `mesh`."""
    used: set[str] = set()
    dims = []
    for size, name in zip(shape, tuple(names) + (None,) * (len(shape) - len(tuple(names)))):
        # a size-1 axis splits nothing, and XLA hands such arrays back without it (a different jit cache key)
        # a mesh axis name stands for itself: rules written in mesh axes (`model.sharding_rules`) work too
        wanted = rules.get(name, (name,) if name in MESH_AXES else ()) if name else ()
        axes = [a for a in wanted if mesh.shape.get(a, 1) > 1 and a not in used]
        while axes and size % int(np.prod([mesh.shape[a] for a in axes])):
            axes.pop()  # drop the innermost axis until the rest divides the dimension
        used.update(axes)
        dims.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    while dims and dims[-1] is None:  # P('fsdp', None) is how XLA returns P('fsdp'): one canonical form
        dims.pop()
    return P(*dims)


def param_logical_axes(path: str, rules=PARAM_AXES) -> tuple[str | None, ...]:
    for pattern, names in rules:
        if re.search(pattern, path):
            return names
    return ()


def param_spec(
    path: str, shape: tuple[int, ...], mesh: jax.sharding.Mesh, rules=PARAM_AXES
) -> jax.sharding.PartitionSpec:
    return logical_spec(param_logical_axes(path, rules)[: len(shape)], shape, mesh)


def path_string(key_path) -> str:
    """'layers.0.self_attn.q_proj.kernel' from a jax key path (dict keys, indices, attributes).

    An nnx.Variable flattens to its `.value`, which is dropped so the path ends with the parameter's name."""
    parts = []
    for key in key_path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    if parts and parts[-1] == "value" and isinstance(key_path[-1], jax.tree_util.GetAttrKey):
        parts.pop()
    return ".".join(parts)


def tree_shardings(tree: Any, mesh: jax.sharding.Mesh, rules=PARAM_AXES) -> Any:
    """A NamedSharding for every array leaf of `tree` (params, grads, a train state with its
    optimizer moments), chosen by the leaf's path."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: jax.sharding.NamedSharding(mesh, param_spec(path_string(path), np.shape(x), mesh, rules)), tree
    )


def shard_tree(tree: Any, mesh: jax.sharding.Mesh, rules=PARAM_AXES) -> Any:
    """`tree` placed on `mesh` by `tree_shardings`."""
    return jax.device_put(tree, tree_shardings(tree, mesh, rules))


def batch_sharding(mesh: jax.sharding.Mesh, ndim: int, rows: int) -> jax.sharding.NamedSharding:
    """Rows over ("data", "fsdp") where they divide; other dimensions replicated."""
    return jax.sharding.NamedSharding(
        mesh, logical_spec(("act_batch",) + (None,) * (ndim - 1), (rows,) + (1,) * (ndim - 1), mesh)
    )


def shard_batch(batch: Any, mesh: jax.sharding.Mesh) -> Any:
    """Every array of `batch` (leading dimension: rows) split by rows over the mesh."""
    return jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, np.ndim(x), np.shape(x)[0])), batch)


# --- activations --------------------------------------------------------------------------------

_ACTIVE_MESH: contextvars.ContextVar[jax.sharding.Mesh | None] = contextvars.ContextVar("spotrl_mesh", default=None)


@contextlib.contextmanager
def activation_mesh(mesh: jax.sharding.Mesh | None):
    """While tracing under this context, `constrain` pins activations to `mesh` (None: no-op)."""
    token = _ACTIVE_MESH.set(mesh)
    try:
        yield
    finally:
        _ACTIVE_MESH.reset(token)


def constrain(x: jax.Array, names: tuple[str | None, ...]) -> jax.Array:
    """x with a sharding constraint from its logical dimension names, when a mesh is active."""
    mesh = _ACTIVE_MESH.get()
    if mesh is None:
        return x
    return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, logical_spec(names, x.shape, mesh)))
