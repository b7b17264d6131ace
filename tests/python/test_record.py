"""Record, then tune offline, from a small model in each framework: with
KREG_RECORD set, the shapes the tables do not answer exactly are written
down; `kreg tune --from-record` tunes them; the model's next run, asking
that table, answers every shape exactly and records nothing.

Each run is its own process (the recorder is the process's); a framework
missing from this Python skips its test."""

import os
import subprocess
import sys

import pytest

import kreg

TORCH_MODEL = """
import sys, torch, kreg, kreg.torch as kt
if len(sys.argv) > 1:
    kt.use(kreg.Dispatcher(sys.argv[1]))
g = torch.Generator().manual_seed(0)
x, router, w1 = torch.randn(48, 16, generator=g), torch.randn(16, 4, generator=g), torch.randn(4, 16, 24, generator=g)
_, chosen = kt.topk(x @ router, 2)
expert = chosen.long().flatten()
order = torch.argsort(expert, stable=True)
kt.gmm(x[order // 2], w1, torch.bincount(expert, minlength=4).int())
"""

JAX_MODEL = """
import sys, jax, jax.numpy as jnp, numpy as np, kreg.jax as kj
if len(sys.argv) > 1:
    kj.use_table(sys.argv[1])
rng = np.random.default_rng(0)
x, router, w1 = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((48, 16), (16, 4), (4, 16, 24)))

@jax.jit
def layer(x, router, w1):
    _, chosen = kj.topk(x @ router, 2)
    expert = chosen.reshape(-1)
    order = jnp.argsort(expert, stable=True)
    sizes = jnp.bincount(expert, length=4).astype(jnp.int32)
    return kj.gmm(x[order // 2], w1, sizes)

jax.block_until_ready(layer(x, router, w1))
"""


def shapes(path):
    if not os.path.exists(path):
        return []
    return [line.split()[0] for line in open(path) if line.strip() and not line.startswith("#")]


def run_model(model, record, *args):
    env = dict(os.environ, KREG_RECORD=str(record))
    subprocess.run([sys.executable, "-c", model, *map(str, args)], env=env, check=True)


@pytest.mark.parametrize("framework,model", [("torch", TORCH_MODEL), ("jax", JAX_MODEL)])
def test_a_models_shapes_are_recorded_tuned_and_then_answered_exactly(framework, model, tmp_path):
    pytest.importorskip(framework)
    first, second, table = tmp_path / "first.txt", tmp_path / "second.txt", tmp_path / "model.txtpb"
    run_model(model, first)
    assert sorted(shapes(first)) == ["gmm", "topk"]
    run_model(model, first)  # the same shapes again: written once
    assert len(shapes(first)) == 2
    kreg_command = os.path.join(kreg.install_prefix(), "bin", "kreg")
    subprocess.run([kreg_command, "tune", "--from-record", str(first), "--db", str(table), "--budget", "2",
                    "--reps", "3", "--warmup", "1"], check=True, stdout=subprocess.DEVNULL)
    run_model(model, second, table)
    assert shapes(second) == []
