"""Checkpoints of a train state that spans two processes (JAX's multi-controller runtime on CPU).

Two real processes, one CPU device each, join one mesh; each saves and restores through
CheckpointStore. Each writes the shards on its own device (orbax's per-process OCDBT files), process 0
seals, and both get back exactly what was saved, gathered from both processes.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from spotrl.ports import free_port

REPO = Path(__file__).resolve().parents[2]


def _worker(root: str) -> None:
    """One process of the pair: save a tree sharded over both processes' devices, restore it, print it."""
    from spotrl import distributed

    distributed.initialize()
    import jax

    from spotrl.storage.checkpoints import CheckpointStore

    mesh = jax.make_mesh((2,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
    whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    state = {
        "w": distributed.put_global(np.arange(8, dtype=np.float32).reshape(4, 2), split),
        "step": distributed.put_global(np.asarray(7, np.int32), whole),
    }
    store = CheckpointStore(root)
    store.save(3, state, {"iteration": 3})
    if distributed.is_primary():
        store.seal(3)
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices("sealed")  # the others restore only what is sealed
    template = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    restored, meta = store.restore(3, template)
    local_rows = [np.asarray(s.data).tolist() for s in restored["w"].addressable_shards]
    print(
        json.dumps(
            {
                "process": distributed.process_index(),
                "meta": meta,
                "w": distributed.to_host(restored["w"]).tolist(),
                "local_rows": local_rows,
                "step": int(distributed.to_host(restored["step"])),
                "sharding": list(restored["w"].sharding.spec),
            }
        )
    )


def test_two_processes_save_their_shards_and_restore_them(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one device per process
    env.update(PYTHONPATH=str(REPO), SPOTRL_NUM_PROCESSES="2", SPOTRL_COORDINATOR_ADDRESS=f"127.0.0.1:{free_port()}")
    code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
    code += "from test_checkpoints_multiprocess import _worker; _worker(sys.argv[1])"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / "checkpoints")],
            env={**env, "SPOTRL_PROCESS_ID": str(i)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
    results = sorted((json.loads(out.strip().splitlines()[-1]) for out, _ in outputs), key=lambda r: r["process"])

    expected = np.arange(8, dtype=np.float32).reshape(4, 2).tolist()
    for process, result in enumerate(results):
        assert result["process"] == process
        assert result["w"] == expected and result["step"] == 7 and result["meta"] == {"iteration": 3}
        assert result["sharding"] == ["fsdp"]  # restored in the template's layout
        assert result["local_rows"] == [expected[2 * process : 2 * process + 2]]  # its own half on its device
    # each process wrote the shards on its own device; the seal covers both processes' files
    state_dir = tmp_path / "checkpoints" / "iter_000003" / "state"
    assert (state_dir / "ocdbt.process_0").is_dir() and (state_dir / "ocdbt.process_1").is_dir()
    seal = json.loads((tmp_path / "checkpoints" / "iter_000003.sealed.json").read_text())
    assert any(f.startswith("state/ocdbt.process_1/") for f in seal["files"])
