"""A run whose `model.path` names a Hugging Face checkpoint: a tiny random Qwen2 made here with
save_pretrained, with a ChatML tokenizer and two stop ids. Two RL iterations through the train flow;
the sampler's logprobs equal transformers' on the chat-templated prompts; `spotrl export` of the
result loads in transformers with the same logits; a bad checkpoint fails before any work."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_fixtures import randomize, torch_logits, write_qwen_tokenizer  # noqa: E402
from support import TINY_OVERRIDES  # noqa: E402

from spotrl.cli.main import main as cli_main  # noqa: E402
from spotrl.config import ConfigError, RunConfig  # noqa: E402
from spotrl.configs import build_config, resolve  # noqa: E402
from spotrl.flows import rundir  # noqa: E402
from spotrl.model.hf.config import CheckpointError  # noqa: E402
from spotrl.model.hf.loader import check_checkpoint, load_tokenizer  # noqa: E402
from spotrl.model.policy import abstract_model  # noqa: E402
from spotrl.model.transformer import forward  # noqa: E402
from spotrl.storage.checkpoints import CheckpointStore  # noqa: E402
from spotrl.storage.parquet import read_frame  # noqa: E402
from spotrl.storage.rollouts import find_shard  # noqa: E402
from spotrl.storage.weights import WeightStore  # noqa: E402

pytestmark = pytest.mark.slow  # end to end: a whole run from a Hugging Face checkpoint

# the tiny overrides' architecture keys (hidden 32, intermediate 64, 2 layers) agree with the checkpoint
SHAPE = dict(
    vocab_size=320,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=False,
)
OVERRIDES = [o for o in TINY_OVERRIDES if not o.startswith("iterations=")] + [
    "iterations=2",
    "rollout.max_new_tokens=6",
    "algorithm.old_logprobs=recompute",  # the trainer rescores the loaded weights' samples: the two must agree
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2-tiny")
    torch.manual_seed(0)
    model = randomize(transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SHAPE)), 0)
    model.save_pretrained(path)
    write_qwen_tokenizer(path)
    return path, model


@pytest.fixture(scope="module")
def finished(prefect_harness, checkpoint, tmp_path_factory):
    from spotrl.flows.train import train

    path, _ = checkpoint
    config = build_config(None, OVERRIDES + [f"model.path={path}"])
    run_dir = tmp_path_factory.mktemp("run")
    return config, run_dir, train(config=config, run_dir=str(run_dir))


def test_config_takes_the_architecture_from_the_checkpoint(checkpoint):
    path, _ = checkpoint
    config = build_config(None, OVERRIDES + [f"model.path={path}"])
    m = config.model
    assert (m.vocab_size, m.qkv_bias, m.tie_embeddings, m.num_heads, m.num_kv_heads) == (320, True, False, 4, 2)
    assert m.dtype == "float32"  # the config's default, whatever the checkpoint's
    assert build_config(None, OVERRIDES + [f"model.path={path}", "model.dtype=bfloat16"]).model.dtype == "bfloat16"
    with pytest.raises(
        ConfigError, match=r"model: .*config.json disagrees.*model.hidden_size: config 48, checkpoint 32"
    ):
        build_config(None, OVERRIDES + [f"model.path={path}", "model.hidden_size=48"])
    # validation alone does no I/O: a RunConfig validated directly (a deployment's parameter) is
    # checked against the checkpoint when the run starts (RunContext -> build_policy -> check_checkpoint)
    direct = RunConfig.model_validate({**config.model_dump(), "model": {**m.model_dump(), "hidden_size": 48}})
    with pytest.raises(
        CheckpointError,
        match=r"config.json: the run config's model does not match it:\n"
        r"  model.hidden_size: config 48, checkpoint 32",
    ):
        check_checkpoint(direct.model)


def test_a_deployment_config_is_completed_from_the_checkpoint(checkpoint):
    """A RunConfig validated directly (as Prefect validates a deployment's `config` parameter) with
    model.path and no architecture keys: the flow completes it from config.json, as the loader does."""
    path, _ = checkpoint
    loaded = build_config(None, OVERRIDES + [f"model.path={path}"])
    data = build_config(None, OVERRIDES).model_dump(mode="json")
    data["model"] = {"path": str(path)}
    direct = RunConfig.model_validate(data)
    assert direct.model.hidden_size != 32  # validation alone: the tiny default
    assert resolve(direct) == loaded
    data["model"] = {"path": str(path), "hidden_size": 48}
    with pytest.raises(ConfigError, match=r"model.hidden_size: config 48, checkpoint 32"):
        resolve(RunConfig.model_validate(data))
    plain = build_config(None, OVERRIDES)
    assert resolve(plain) is plain


def test_two_iterations_from_the_checkpoint(finished, checkpoint):
    config, run_dir, result = finished
    _, torch_model = checkpoint
    metrics = rundir.read_records(run_dir, "metrics")
    assert [m["iteration"] for m in metrics] == [1, 2]
    for m in metrics:
        assert np.isfinite(m["loss"]) and 0 <= m["reward_mean"] <= 1
        assert m["logprob_max_abs_diff"] < 1e-4  # sampler and trainer agree on the loaded weights
    assert WeightStore(run_dir / "weights").resolve(None) == 2 and (run_dir / "weights" / "v000000").is_dir()
    assert result["weights_sha256"] == WeightStore(run_dir / "weights").verified_digest()
    # no supervised warm-up from a pretrained checkpoint: iteration 0 is the checkpoint itself
    assert CheckpointStore(run_dir / "checkpoints").metadata(0)["warmstart"]["steps"] == 0

    # Iteration 1 sampled with version 0, the checkpoint itself: transformers, given the prompt as its
    # own tokenizer renders it through the chat template, assigns the sampled tokens the same logprobs.
    auto = transformers.AutoTokenizer.from_pretrained(config.model.path)
    frame = pd.concat([read_frame(find_shard(run_dir / "rollouts", 1, s, "rollouts")) for s in range(2)])
    stop_ids = {auto.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    for _, row in frame.head(8).iterrows():
        prompt = auto.apply_chat_template(
            [{"role": "user", "content": row["prompt"]}], add_generation_prompt=True, tokenize=False
        )
        assert prompt.startswith("<|im_start|>system")
        ids = auto(prompt)["input_ids"]
        n = int(row["length"])
        completion = [int(t) for t in row["tokens"][:n]]
        logits = torch_logits(torch_model, np.array([ids + completion]))[0, len(ids) - 1 : -1]
        logprobs = torch.log_softmax(torch.tensor(logits, dtype=torch.float64), -1).numpy()
        expected = np.take_along_axis(logprobs, np.array(completion)[:, None], 1)[:, 0]
        np.testing.assert_allclose(np.asarray(row["logprobs"][:n]), expected, atol=1e-4)
        assert row["stopped"] == (completion[-1] in stop_ids)  # either stop id ends a completion
        assert row["completion"] == auto.decode([t for t in completion if t not in stop_ids], skip_special_tokens=True)


def test_rerun_of_the_finished_run_returns_the_same_weights_and_result(finished):
    """A finished run resumes after its last iteration: nothing is sampled or trained again."""
    from spotrl.flows.train import train

    config, run_dir, first = finished
    second = train(config=config, run_dir=str(run_dir))
    assert second["weights_sha256"] == first["weights_sha256"] and second["after"] == first["after"]


def test_chat_template_is_a_choice(checkpoint):
    path, _ = checkpoint
    model = build_config(None, OVERRIDES + [f"model.path={path}"]).model
    auto = transformers.AutoTokenizer.from_pretrained(path)
    prompt = "0012+0345="
    templated = auto.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    for choice, expected in ((True, auto(templated)["input_ids"]), (False, auto(prompt)["input_ids"])):
        tokens, valid = load_tokenizer(model.model_copy(update={"chat_template": choice})).encode_batch_left_padded(
            [prompt, "1+1="]
        )
        assert tokens[0][valid[0]].tolist() == expected


def test_export_of_the_run_loads_in_transformers(finished, tmp_path):
    config, run_dir, _ = finished
    out = tmp_path / "exported"
    assert cli_main(["export", "--run-dir", str(run_dir), "--out", str(out)]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(model).__name__ == "Qwen2ForCausalLM"
    auto = transformers.AutoTokenizer.from_pretrained(out)
    assert auto.chat_template == transformers.AutoTokenizer.from_pretrained(config.model.path).chat_template
    assert len(json.loads((out / "generation_config.json").read_text())["eos_token_id"]) == 2
    graphdef, state = abstract_model(config.model)
    params = WeightStore(run_dir / "weights").load(2, nnx.to_pure_dict(state))
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
    tokens = np.random.default_rng(0).integers(0, 320, (2, 12)).astype(np.int32)
    ours = np.asarray(forward(nnx.merge(graphdef, state), jnp.asarray(tokens), jnp.ones(tokens.shape, bool)))
    np.testing.assert_allclose(ours, torch_logits(model, tokens), atol=1e-4, rtol=0)


def test_bad_checkpoint_fails_before_any_work(checkpoint, tmp_path, capsys):
    from safetensors.numpy import load_file, save_file

    path, _ = checkpoint
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in path.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(bad / "model.safetensors"))
    tensors["model.layers.1.mlp.up_proj.weight"] = tensors["model.layers.1.mlp.up_proj.weight"][:32]
    save_file(tensors, str(bad / "model.safetensors"))
    run = tmp_path / "run"
    assert cli_main(["train", "--run-dir", str(run), "--set", f"model.path={bad}"]) == 2
    err = capsys.readouterr().err
    assert f"{bad / 'model.safetensors'}: tensor 'model.layers.1.mlp.up_proj.weight' has shape [32, 32]" in err
    assert not run.exists()
    (bad / "tokenizer.json").unlink()
    save_file(load_file(str(path / "model.safetensors")), str(bad / "model.safetensors"))
    assert cli_main(["train", "--run-dir", str(run), "--set", f"model.path={bad}"]) == 2
    assert f"{bad / 'tokenizer.json'}: missing file" in capsys.readouterr().err
    assert not run.exists()


_MESH_SCRIPT = """
import json, sys, tempfile
from pathlib import Path
import jax, jax.numpy as jnp, numpy as np
from spotrl.configs import build_config
from spotrl.rollout.completions import LoadedPolicy, sample_completions
from spotrl.rl.train_step import RLBatch, build_rl_step, loss_spec
from spotrl.model.sequences import join
from spotrl.tasks.context import RunContext

assert jax.device_count() == 8, jax.devices()
path, overrides = sys.argv[1], json.loads(sys.argv[2])
out, prompts = {}, ["0012+0345=", "0907+0005=", "0055+0066=", "1234+4321="]
for name, mesh in (("one", []), ("mesh", ["model.mesh.fsdp=2", "model.mesh.tp=4"])):
    ctx = RunContext(Path(tempfile.mkdtemp()), build_config(None, overrides + [f"model.path={path}"] + mesh))
    state = ctx.initial_train_state(jax.tree.map(jnp.copy, ctx.policy.init_state))
    ctx.checkpoints.save(0, state, {"iteration": 0})
    ctx.checkpoints.seal(0)
    restored, _ = ctx.checkpoints.restore(0, ctx.state_template())
    ctx.weights.publish(0, ctx.policy.to_pure(state["params"]))
    pulled = ctx.pull(0)
    q = lambda s: s["layers"][0]["self_attn"]["q_proj"]["kernel"]
    done = sample_completions(LoadedPolicy(ctx.policy.graphdef, pulled, ctx.tokenizer), prompts, 4,
                              ctx.sampling(1.0), jax.random.key(0))
    tokens, valid = join(done.prompt_tokens, done.prompt_valid, done.tokens, done.lengths)
    batch = RLBatch(jnp.asarray(tokens), jnp.asarray(valid), jnp.asarray(done.logprobs),
                    jnp.asarray(np.linspace(-1, 1, len(tokens)), jnp.float32))
    step = build_rl_step(ctx.policy.graphdef, ctx.optimizer, loss_spec(ctx.config.algorithm, 6), 1.0)
    updated, metrics = step(restored, batch)
    placed = (ctx.policy.init_state, restored["params"], pulled, updated["params"])
    out[name] = {"specs": [getattr(q(x).sharding, "spec", None) and list(q(x).sharding.spec) for x in placed],
                 "tokens": done.tokens.tolist(), "loss": float(metrics["loss"]), "ratio": float(metrics["ratio_mean"]),
                 "q": np.asarray(q(updated["params"])).tolist()}
print(json.dumps(out))
"""


def test_a_mesh_of_8_devices_trains_like_one(checkpoint, tmp_path):
    """model.mesh 2 x 4: the loaded, checkpointed, restored, published and pulled parameters all stay
    sharded, and sampling plus one RL step give what one device gives."""
    import os
    import subprocess
    import sys

    path, _ = checkpoint
    script = tmp_path / "mesh_run.py"
    script.write_text(_MESH_SCRIPT)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, str(script), str(path), json.dumps(OVERRIDES)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    one, mesh = result["one"], result["mesh"]
    assert mesh["specs"] == [["fsdp", "tp"]] * 4 and one["specs"] == [None] * 4
    assert mesh["tokens"] == one["tokens"]
    assert abs(mesh["ratio"] - 1.0) < 1e-5 and abs(mesh["loss"] - one["loss"]) < 1e-5
    np.testing.assert_allclose(mesh["q"], one["q"], atol=1e-5)
