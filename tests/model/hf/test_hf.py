"""Hugging Face checkpoints: our logits and greedy tokens equal transformers' (torch, CPU), export
round-trips through transformers, an 8-device mesh load equals one device, bad input names the
file and the tensor before any data is read, and the memory estimate on a hand-computed case."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_fixtures import randomize, torch_logits  # noqa: E402

from spotrl.config import ModelConfig, RopeScaling  # noqa: E402
from spotrl.model.hf import loader  # noqa: E402
from spotrl.model.hf.config import CONFIG_FILE, CheckpointError, config_from_hf, config_to_hf, read_config  # noqa: E402
from spotrl.model.hf.export import export_checkpoint  # noqa: E402
from spotrl.model.hf.loader import load_checkpoint, load_params  # noqa: E402
from spotrl.model.hf.safetensors import INDEX_FILE, WEIGHTS_FILE  # noqa: E402
from spotrl.model.memory import count_params, estimate_memory  # noqa: E402
from spotrl.model.policy import abstract_model, param_shapes  # noqa: E402
from spotrl.model.transformer import forward  # noqa: E402
from spotrl.rollout.sampler import SamplingParams, generate  # noqa: E402

VOCAB = 128
SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


def _build(kind: str):
    if kind == "qwen2_tied":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SHAPE, tie_word_embeddings=True))
    if kind == "qwen2_untied":
        return transformers.Qwen2ForCausalLM(
            transformers.Qwen2Config(**SHAPE, tie_word_embeddings=False, rope_theta=1e6)
        )
    if kind == "llama3":  # rope scaling and a head_dim that is not hidden / heads
        return transformers.LlamaForCausalLM(
            transformers.LlamaConfig(
                **SHAPE,
                head_dim=32,
                rope_theta=500000.0,
                rope_scaling=LLAMA3_ROPE,
                max_position_embeddings=256,
                tie_word_embeddings=False,
                rms_norm_eps=1e-5,
            )
        )
    raise ValueError(kind)


KINDS = ("qwen2_tied", "qwen2_untied", "llama3")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for seed, kind in enumerate(KINDS):
        torch.manual_seed(seed)
        model = randomize(_build(kind), seed)
        model.save_pretrained(root / kind)
        out[kind] = (root / kind, model)
    return out


def _tokens(batch=2, length=24, seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, (batch, length)).astype(np.int32)


_forward = jax.jit(
    lambda graphdef, state, tokens, valid: forward(nnx.merge(graphdef, state), tokens, valid), static_argnums=0
)


def _our_logits(graphdef, state, tokens, valid=None):
    valid = np.ones(tokens.shape, bool) if valid is None else valid
    return np.asarray(_forward(graphdef, state, jnp.asarray(tokens), jnp.asarray(valid)))


@pytest.mark.parametrize("kind", KINDS)
def test_logits_equal_transformers(checkpoints, kind):
    path, model = checkpoints[kind]
    cfg, graphdef, state = load_checkpoint(str(path))
    assert cfg.qkv_bias == kind.startswith("qwen2")
    assert cfg.tie_embeddings == (kind == "qwen2_tied")
    assert (cfg.rope_scaling is not None) == (kind == "llama3")
    tokens = _tokens()
    valid = np.ones(tokens.shape, bool)
    valid[1, :5] = False  # a left-padded row: positions restart at its first real token
    ref, ours = torch_logits(model, tokens, valid), _our_logits(graphdef, state, tokens, valid)
    assert np.abs(ref).max() > 1.0  # the comparison is not between two near-zero arrays
    np.testing.assert_allclose(ours[valid], ref[valid], atol=1e-4, rtol=0)


def test_llama3_rope_scaling_matters(checkpoints):
    """The scaled frequencies are what makes the numbers equal: plain RoPE gives other logits."""
    path, model = checkpoints["llama3"]
    cfg = read_config(str(path))
    plain = cfg.model_copy(update={"rope_scaling": None})
    graphdef, state = abstract_model(plain)
    nnx.replace_by_pure_dict(state, load_params(str(path), plain))
    tokens = _tokens(1, 24, seed=3)
    assert np.abs(_our_logits(graphdef, state, tokens) - torch_logits(model, tokens)).max() > 1e-2


@pytest.mark.parametrize("kind", ["qwen2_untied", "llama3"])
def test_greedy_generation_equals_transformers(checkpoints, kind):
    path, model = checkpoints[kind]
    _, graphdef, state = load_checkpoint(str(path))
    prompts = _tokens(2, 7, seed=5)
    valid = np.ones(prompts.shape, bool)
    valid[0, :3] = False
    prompts[~valid] = 0
    new, stop = 10, VOCAB - 1
    out = generate(
        graphdef,
        state,
        prompts,
        valid,
        jax.random.key(0),
        SamplingParams(max_new_tokens=new, stop_token=stop, pad_token=0, temperature=0.0),
    )
    with torch.no_grad():
        ref = model.generate(
            torch.tensor(prompts, dtype=torch.long),
            attention_mask=torch.tensor(valid, dtype=torch.long),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            eos_token_id=stop,
            pad_token_id=0,
        )
    np.testing.assert_array_equal(np.asarray(out.tokens), ref[:, prompts.shape[1] :].numpy())


def test_export_round_trips_through_transformers(checkpoints, tmp_path):
    """Load ours -> export (sharded into several files) -> transformers loads it -> equal logits;
    and our loader reads the sharded index back."""
    path, _ = checkpoints["llama3"]
    cfg = read_config(str(path))
    params = load_params(str(path), cfg)
    out = tmp_path / "export"
    export_checkpoint(params, cfg, str(out), tokenizer_from=str(path), max_shard_bytes=200_000)
    files = sorted(p.name for p in out.iterdir())
    assert INDEX_FILE in files and sum(f.endswith(".safetensors") for f in files) > 1
    assert "generation_config.json" in files
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(reloaded).__name__ == "LlamaForCausalLM"
    graphdef, state = abstract_model(cfg)
    nnx.replace_by_pure_dict(state, params)
    tokens = _tokens(2, 20, seed=7)
    np.testing.assert_allclose(_our_logits(graphdef, state, tokens), torch_logits(reloaded, tokens), atol=1e-4, rtol=0)
    cfg2, graphdef2, state2 = load_checkpoint(str(out))
    assert cfg2 == cfg
    np.testing.assert_array_equal(_our_logits(graphdef2, state2, tokens), _our_logits(graphdef, state, tokens))


def test_export_qwen2_tied_bfloat16(checkpoints, tmp_path):
    path, _ = checkpoints["qwen2_tied"]
    cfg, graphdef, state = load_checkpoint(str(path))
    out = tmp_path / "bf16"
    export_checkpoint(nnx.to_pure_dict(state), cfg, str(out), dtype="bfloat16")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert type(reloaded).__name__ == "Qwen2ForCausalLM" and reloaded.dtype == torch.bfloat16
    assert reloaded.config.tie_word_embeddings
    # our loader keeps the checkpoint's bfloat16, or converts on request
    cfg16, graphdef16, state16 = load_checkpoint(str(out))
    assert cfg16.dtype == "bfloat16"
    assert nnx.to_pure_dict(state16)["layers"][0]["self_attn"]["q_proj"]["kernel"].dtype == jnp.bfloat16
    cfg32, graphdef32, state32 = load_checkpoint(str(out), dtype="float32")
    tokens = _tokens(1, 12)
    np.testing.assert_allclose(_our_logits(graphdef32, state32, tokens), _our_logits(graphdef, state, tokens), atol=0.1)


def test_cli_export_of_the_builtin_model(tmp_path):
    """`spotrl export` writes the built-in model and its character tokenizer; transformers loads both."""
    from spotrl.cli.main import main
    from spotrl.config import RunConfig
    from spotrl.model.policy import Policy
    from spotrl.model.tokenizers import CharTokenizer
    from spotrl.storage.weights import WeightStore

    config = RunConfig()
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    policy = Policy(config.model, init_seed=3)
    params = Policy.to_pure(policy.init_state)
    WeightStore(run / "weights").publish(4, params)
    out = tmp_path / "hf-out"
    assert main(["export", "--run-dir", str(run), "--out", str(out)]) == 0
    assert main(["export", "--run-dir", str(run), "--out", str(out)]) == 2  # refuses to overwrite

    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.tie_word_embeddings
    tok = CharTokenizer()
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    prompts = ["12+34=", "907+5="]
    for text in prompts:
        assert hf_tok(text)["input_ids"] == tok.encode(text, bos=True)
        assert hf_tok.decode(tok.encode(text, bos=True, eos=True), skip_special_tokens=True) == text
    tokens, valid = tok.encode_batch_left_padded(prompts)
    ours = _our_logits(policy.graphdef, policy.to_state(params), tokens, valid)
    np.testing.assert_allclose(ours[valid], torch_logits(model, tokens, valid)[valid], atol=1e-4, rtol=0)


_MESH_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    from spotrl.model.hf.loader import load_checkpoint, sharding_rules
    from spotrl.model.transformer import forward

    path = sys.argv[1]
    assert jax.device_count() == 8, jax.devices()
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 128, (4, 16)), jnp.int32)
    valid = jnp.ones(tokens.shape, bool)
    run = jax.jit(lambda g, s, t, v: forward(nnx.merge(g, s), t, v), static_argnums=0)

    cfg, g, single = load_checkpoint(path)
    mesh = jax.make_mesh((2, 4), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    _, _, sharded = load_checkpoint(path, sharding=sharding_rules(mesh, cfg))
    q = nnx.to_pure_dict(sharded)["layers"][0]["self_attn"]["q_proj"]["kernel"]
    embed = nnx.to_pure_dict(sharded)["embed_tokens"]["embedding"]
    result = {
        "q_spec": list(q.sharding.spec),
        "q_shard_shape": list(q.addressable_shards[0].data.shape),
        "q_shape": list(q.shape),
        "embed_devices": len(embed.sharding.device_set),
        "max_diff": float(jnp.abs(run(g, single, tokens, valid) - run(g, sharded, tokens, valid)).max()),
    }
    print(json.dumps(result))
""")


@pytest.mark.slow  # compile-heavy: tens of seconds of XLA compilation
def test_loading_into_an_8_device_mesh_equals_one_device(checkpoints, tmp_path):
    path, _ = checkpoints["llama3"]
    script = tmp_path / "mesh.py"
    script.write_text(_MESH_SCRIPT)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, str(script), str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["q_spec"] == ["fsdp", "tp"]
    assert result["q_shard_shape"] == [result["q_shape"][0] // 2, result["q_shape"][1] // 4]
    assert result["embed_devices"] == 8
    assert result["max_diff"] < 1e-5


# ---------------------------------------------------------------------------------------------
# bad input: the file and the tensor named, before any tensor data is read


@pytest.fixture
def broken(checkpoints, tmp_path, monkeypatch):
    """A writable copy of the tied Qwen2 checkpoint; reading any tensor's data fails the test."""
    path, _ = checkpoints["qwen2_tied"]
    copy = tmp_path / "ckpt"
    shutil.copytree(path, copy)

    def no_reads(entry):
        raise AssertionError(f"read tensor {entry.name} before validating the checkpoint")

    monkeypatch.setattr(loader, "HostTensor", no_reads)
    return copy


def _rewrite_weights(path: Path, edit):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path / WEIGHTS_FILE))
    edit(tensors)
    save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format": "pt"})


def _edit_config(path: Path, **changes):
    data = json.loads((path / CONFIG_FILE).read_text())
    data.update(changes)
    (path / CONFIG_FILE).write_text(json.dumps(data))


def test_missing_files_are_named(broken):
    (broken / WEIGHTS_FILE).unlink()
    with pytest.raises(CheckpointError, match=f"{broken}: no model.safetensors or model.safetensors.index.json"):
        load_checkpoint(str(broken))
    (broken / CONFIG_FILE).unlink()
    with pytest.raises(CheckpointError, match=f"{broken / 'config.json'}: missing file"):
        load_checkpoint(str(broken))


def test_wrong_shape_names_file_and_tensor(broken):
    name = "model.layers.1.self_attn.k_proj.weight"
    _rewrite_weights(broken, lambda t: t.update({name: t[name][:-1]}))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(str(broken))
    assert f"{broken / 'model.safetensors'}: tensor '{name}' has shape [31, 64], expected [32, 64]" in str(err.value)


def test_missing_and_unexpected_tensors_are_named(broken):
    def edit(t):
        del t["model.layers.0.self_attn.q_proj.bias"]
        t["model.layers.0.self_attn.o_proj.bias"] = np.zeros(64, np.float32)

    _rewrite_weights(broken, edit)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(str(broken))
    message = str(err.value)
    assert f"{broken / 'model.safetensors'}: missing tensor 'model.layers.0.self_attn.q_proj.bias'" in message
    assert f"{broken / 'model.safetensors'}: unexpected tensor 'model.layers.0.self_attn.o_proj.bias'" in message


def test_sharded_index_pointing_at_a_missing_file(broken):
    index = {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}
    (broken / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(
        CheckpointError, match="'model.embed_tokens.weight' is in .*model-00001-of-00002.safetensors, which is missing"
    ):
        load_checkpoint(str(broken))


@pytest.mark.parametrize(
    "change,message",
    [
        ({"architectures": ["MistralForCausalLM"]}, "unsupported architecture MistralForCausalLM"),
        ({"dtype": "float16"}, "unsupported dtype 'float16'"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "unsupported rope type 'yarn'"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"num_attention_heads": 3}, "num_heads"),
    ],
)
def test_unsupported_config_names_the_file(broken, change, message):
    _edit_config(broken, **change)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(str(broken))
    assert str(err.value).startswith(f"{broken / 'config.json'}: ") and message in str(err.value)


def test_unsupported_tensor_dtype_is_named(broken):
    _rewrite_weights(broken, lambda t: t.update({"model.norm.weight": t["model.norm.weight"].astype(np.int32)}))
    with pytest.raises(CheckpointError, match="tensor 'model.norm.weight' has unsupported dtype I32"):
        load_checkpoint(str(broken))


# ---------------------------------------------------------------------------------------------
# config and memory


def test_config_round_trip_and_v4_style_rope_keys():
    cfg = ModelConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=1,
        rope_theta=5e5,
        rope_scaling=RopeScaling(factor=32.0, original_max_position_embeddings=64),
        tie_embeddings=True,
    )
    written = config_to_hf(cfg)
    assert written["architectures"] == ["LlamaForCausalLM"] and written["rope_scaling"]["rope_type"] == "llama3"
    assert config_from_hf(written) == cfg.model_copy(update={"head_dim": 8})
    with pytest.raises(ValueError, match="high_freq_factor"):
        RopeScaling(low_freq_factor=4.0, high_freq_factor=1.0)


def test_estimate_memory_hand_computed():
    cfg = ModelConfig(
        vocab_size=10,
        hidden_size=4,
        intermediate_size=6,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        tie_embeddings=True,
        qkv_bias=True,
    )
    # embedding 10*4 = 40; attention q 4*4 + k 4*2 + v 4*2 + o 4*4 = 48, biases 4+2+2 = 8; MLP 3*4*6 = 72;
    # two norms 8 -> one layer 136; final norm 4: 40 + 136 + 4 = 180
    assert count_params(cfg) == 180 == sum(int(np.prod(s)) for s in param_shapes(cfg).values())
    m = estimate_memory(cfg, batch=2, seq_len=3, devices=2)
    assert (m["params"], m["grads"], m["optimizer"], m["reference"]) == (720, 720, 1440, 720)
    assert m["kv_cache"] == 2 * 1 * 6 * 2 * 4  # k and v, 1 layer, 6 tokens, kv width 2, float32 = 96
    # per token per layer (4*4 + 2*4 + 2*2 + 3*6) * 4 B = 184, attention probs 2 heads * 3 * 4 B = 24;
    # 6 tokens -> 1248; logits and log-softmax 6 * 2 * 10 * 4 B = 480
    assert m["activations"] == 1248 + 480
    assert m["total"] == 720 + 720 + 1440 + 720 + 96 + 1728 == 5424 and m["per_device"] == 2712
    bf16 = estimate_memory(
        cfg.model_copy(update={"dtype": "bfloat16"}), batch=2, seq_len=3, training=False, reference_copies=0
    )
    assert (bf16["params"], bf16["grads"], bf16["optimizer"], bf16["activations"]) == (360, 0, 0, 480)


@pytest.mark.slow  # compile-heavy: tens of seconds of XLA compilation
def test_rl_steps_from_a_checkpoint(checkpoints):
    """A short GRPO-style run from a loaded checkpoint: the on-policy importance ratio is 1 (sampler and
    trainer agree on the loaded weights) and the reward (share of completion tokens below VOCAB/2) rises."""
    from spotrl.rl.losses import LossSpec
    from spotrl.rl.train_step import RLBatch, build_rl_step, make_optimizer

    path, _ = checkpoints["qwen2_untied"]
    _, graphdef, state = load_checkpoint(str(path))
    group, new = 8, 6
    prompts = np.repeat(_tokens(4, 5, seed=11), group, axis=0)
    valid = np.ones(prompts.shape, bool)
    tx = make_optimizer(0.01, 0.0, 0.9, 0.99, 1.0)
    step = build_rl_step(graphdef, tx, LossSpec(), 1.0)
    train = {"params": jax.tree.map(jnp.copy, state), "opt_state": tx.init(state)}
    params = SamplingParams(max_new_tokens=new, stop_token=VOCAB - 1, pad_token=0, temperature=1.0)
    rewards = []
    for it in range(6):
        out = generate(graphdef, train["params"], prompts, valid, jax.random.key(it), params)
        done = np.arange(new)[None] < np.asarray(out.lengths)[:, None]
        reward = ((np.asarray(out.tokens) < VOCAB // 2) & done).sum(1) / done.sum(1)
        rewards.append(reward.mean())
        grouped = reward.reshape(-1, group)
        advantages = ((grouped - grouped.mean(1, keepdims=True)) / (grouped.std(1, keepdims=True) + 1e-6)).reshape(-1)
        batch = RLBatch(
            jnp.asarray(np.concatenate([prompts, np.asarray(out.tokens)], 1)),
            jnp.asarray(np.concatenate([valid, done], 1)),
            out.logprobs,
            jnp.asarray(advantages, jnp.float32),
        )
        train, metrics = step(train, batch)
        assert abs(float(metrics["ratio_mean"]) - 1.0) < 1e-4
        assert np.isfinite(float(metrics["loss"]))
    assert rewards[-1] > rewards[0] + 0.1, rewards


def test_fsspec_url_checkpoint_loads_and_exports(checkpoints):
    """A non-local URL (fsspec's memory://, standing in for gs://) reads by byte ranges, and export writes to it."""
    import fsspec

    path, _ = checkpoints["qwen2_tied"]
    fs = fsspec.filesystem("memory")
    for f in path.iterdir():
        fs.pipe(f"/ckpt/{f.name}", f.read_bytes())
    cfg, graphdef, state = load_checkpoint("memory://ckpt")
    _, _, local = load_checkpoint(str(path))
    jax.tree.map(np.testing.assert_array_equal, nnx.to_pure_dict(state), nnx.to_pure_dict(local))
    export_checkpoint(nnx.to_pure_dict(state), cfg, "memory://exported", max_shard_bytes=100_000)
    assert fs.exists("/exported/model.safetensors.index.json")
    _, _, again = load_checkpoint("memory://exported")
    jax.tree.map(np.testing.assert_array_equal, nnx.to_pure_dict(again), nnx.to_pure_dict(local))
    fs.rm("/ckpt", recursive=True)
    fs.rm("/exported", recursive=True)
