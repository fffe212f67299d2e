"""Logical sharding rules, and a train step sharded over 8 CPU devices against one device."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import pytest

from spotrl.model import sharding

P = jax.sharding.PartitionSpec


@pytest.fixture
def mesh222():
    return jax.sharding.AbstractMesh((2, 2, 2), sharding.MESH_AXES)


def test_parameters_get_fsdp_on_embed_and_tensor_on_heads_mlp_vocab(mesh222):
    spec = lambda path, shape: sharding.param_spec(path, shape, mesh222)  # noqa: E731
    assert spec("layers.0.self_attn.q_proj.kernel", (32, 32)) == P("fsdp", "tp")
    assert spec("layers.0.self_attn.o_proj.kernel", (32, 32)) == P("tp", "fsdp")
    assert spec("layers.1.mlp.down_proj.kernel", (64, 32)) == P("tp", "fsdp")
    assert spec("layers.0.self_attn.k_proj.bias", (16,)) == P("tp")
    assert spec("embed_tokens.embedding", (16, 32)) == P("tp", "fsdp")
    assert spec("layers.0.input_layernorm.weight", (32,)) == P()
    # an optimizer moment has the parameter's path as its suffix, so it is placed the same way
    assert spec("opt_state.1.0.mu.layers.0.mlp.up_proj.kernel", (32, 64)) == P("fsdp", "tp")
    assert spec("opt_state.1.0.count", ()) == P()


def test_paths_of_a_train_state_name_the_parameter():
    import optax

    from spotrl.config import ModelConfig
    from spotrl.model.policy import Policy

    params = Policy(ModelConfig(num_layers=1), init_seed=0).init_state
    state = {"params": params, "opt_state": optax.adam(1e-3).init(params)}
    paths = {sharding.path_string(k) for k, _ in jax.tree_util.tree_flatten_with_path(state)[0]}
    assert {
        "params.layers.0.self_attn.q_proj.kernel",
        "opt_state.0.mu.layers.0.self_attn.q_proj.kernel",
        "opt_state.0.count",
        "params.embed_tokens.embedding",
    } <= paths


def test_axes_that_do_not_divide_or_repeat_are_dropped(mesh222):
    assert sharding.param_spec("embed_tokens.embedding", (15, 32), mesh222) == P(None, "fsdp")  # 15 % 2
    assert sharding.logical_spec(("act_batch", "act_length", "act_embed"), (8, 5, 32), mesh222) == P(("data", "fsdp"))
    assert sharding.logical_spec(("act_batch",), (6,), mesh222) == P("data")  # 6 rows: data only
    assert sharding.logical_spec(("embed", "embed"), (4, 4), mesh222) == P("fsdp")  # fsdp used once
    assert sharding.logical_spec(("vocab", "embed"), (4, 4), mesh222) == P("tp", "fsdp")
    no_tensor = jax.sharding.AbstractMesh((2, 4), ("data", "fsdp"))
    assert sharding.param_spec("layers.0.mlp.gate_proj.kernel", (32, 64), no_tensor) == P("fsdp")
    data_only = jax.sharding.AbstractMesh((8, 1, 1), sharding.MESH_AXES)  # size-1 axes split nothing
    assert sharding.param_spec("layers.0.mlp.gate_proj.kernel", (32, 64), data_only) == P()
    assert sharding.logical_spec(("act_batch",), (8,), data_only) == P("data")


def test_rules_may_name_mesh_axes_directly(mesh222):
    # `model.sharding_rules` are written in mesh axes: a mesh axis name stands for itself
    rules = ((r"q_proj\.kernel$", ("tp", "fsdp")), (r".*", ()))
    assert sharding.param_spec("layers.0.self_attn.q_proj.kernel", (32, 32), mesh222, rules) == P("tp", "fsdp")
    assert sharding.param_spec("layers.0.mlp.up_proj.kernel", (32, 64), mesh222, rules) == P()


def test_constrain_is_the_identity_without_a_mesh():
    x = jax.numpy.ones((2, 3))
    assert sharding.constrain(x, ("act_batch", None)) is x


_SCRIPT = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np, optax
    from spotrl.model import sharding
    from spotrl.config import ModelConfig
    from spotrl.model.policy import Policy
    from spotrl.rl.losses import LossSpec
    from spotrl.rl.train_step import RLBatch, build_rl_step

    assert jax.device_count() == 8, jax.devices()
    policy = Policy(ModelConfig(hidden_size=32, intermediate_size=64, num_layers=1), init_seed=0)
    rng = np.random.default_rng(0)
    rows, prompt, new = 8, 5, 4
    lengths = np.array([4, 1, 2, 4, 3, 1, 4, 2])
    batch = RLBatch(rng.integers(2, 16, (rows, prompt + new)).astype(np.int32),
                    np.concatenate([np.ones((rows, prompt), bool), np.arange(new)[None] < lengths[:, None]], 1),
                    rng.normal(-2.7, 0.3, (rows, new)).astype(np.float32), rng.normal(0, 1, rows).astype(np.float32))
    # eps 1e-4: a gradient component that is ~0 up to rounding cannot flip a whole Adam step
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, eps=1e-4, weight_decay=0.01))

    def run(mesh, micro_batches=1):
        params = jax.tree.map(jnp.copy, policy.to_state(policy.template()))
        state = {"params": params, "opt_state": tx.init(params)}
        b = batch
        if mesh is not None:
            state, b = sharding.shard_tree(state, mesh), sharding.shard_batch(batch, mesh)
        step = build_rl_step(policy.graphdef, tx, LossSpec(), 1.0, micro_batches=micro_batches, mesh=mesh)
        for _ in range(2):  # the second step reuses the first one's compilation and donated buffers
            state, metrics = step(state, b)
        return state, jax.device_get(metrics), step._cache_size()

    single, single_metrics, _ = run(None)
    out = {}
    for name, shape, micro in (("2x2x2", (2, 2, 2), 1), ("8x1x1", (8, 1, 1), 1), ("2x2x2_micro2", (2, 2, 2), 2)):
        mesh = sharding.make_mesh(*shape)
        state, metrics, compilations = run(mesh, micro)
        q = state["params"]["layers"][0]["self_attn"]["q_proj"]["kernel"]
        mu = state["opt_state"][1][0].mu["layers"][0]["self_attn"]["q_proj"]["kernel"]
        diff = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), single["params"], state["params"])
        out[name] = {
            "max_param_diff": max(jax.tree.leaves(diff)),
            "loss_diff": abs(float(metrics["loss"]) - float(single_metrics["loss"])),
            "grad_norm_diff": abs(float(metrics["grad_norm"]) - float(single_metrics["grad_norm"])),
            "q_spec": [list(a) if isinstance(a, tuple) else a for a in q.sharding.spec],
            "q_shard_shape": list(q.addressable_shards[0].data.shape),
            "mu_spec": [list(a) if isinstance(a, tuple) else a for a in mu.sharding.spec],
            "q_devices": len(q.sharding.device_set),
            "compilations": compilations,
        }
    print(json.dumps(out))
""")


@pytest.mark.slow  # compile-heavy: tens of seconds of XLA compilation
def test_sharded_train_step_equals_one_device(tmp_path):
    script = tmp_path / "sharded_step.py"
    script.write_text(_SCRIPT)
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, r in result.items():
        assert r["max_param_diff"] < 1e-5 and r["loss_diff"] < 1e-5 and r["grad_norm_diff"] < 1e-5, (name, r)
    # the state stays sharded through the donated step: q [32, 32] over fsdp x tp, its Adam moment alike
    for name in ("2x2x2", "2x2x2_micro2"):
        assert result[name]["q_spec"] == result[name]["mu_spec"] == ["fsdp", "tp"], result[name]
        assert result[name]["q_shard_shape"] == [16, 16] and result[name]["q_devices"] == 8
    assert result["8x1x1"]["q_shard_shape"] == [32, 32]  # pure data parallel: parameters replicated
    assert all(r["compilations"] == 1 for r in result.values()), result
