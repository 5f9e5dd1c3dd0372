"""hvdlite.jax without MPI peers: what importing it pulls in, the dispatch to it, its
casts, and its errors before init().  (Collectives at 1, 2 and 3 ranks:
tests/parallel/test_jax_*.py.)"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")

pytestmark = pytest.mark.timeout(180)


def run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=150, env=ENV
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out.stdout


def test_importing_hvdlite_does_not_import_jax():
    run(
        "import sys, numpy as np, hvdlite\n"
        "hvdlite.init(); hvdlite.allreduce(np.ones(2)); hvdlite.shutdown()\n"
        "assert not {'jax', 'optax', 'jaxlib'} & set(sys.modules), 'jax imported'\n"
    )


_NO_CUDA_PROBE = r"""
import json, sys
import jax.numpy as jnp, optax
import hvdlite.jax as hvd
hvd.init()
out = hvd.allreduce({"a": jnp.ones(3), "b": jnp.ones(2, jnp.bfloat16)}, name="probe")
tx = hvd.DistributedOptimizer(optax.sgd(0.1))
tx.update({"a": jnp.ones(3)}, tx.init({"a": jnp.ones(3)}))
hvd.shutdown()
mods = sorted(m for m in sys.modules if m.split(".")[0] in ("cupy", "cupy_backends", "torch",
                                                            "tensorflow"))
with open("/proc/self/maps") as f:
    libs = sorted({l.split()[-1] for l in f
                   if any(k in l for k in ("libcudart", "libcuda.so", "libnccl", "libcublas"))})
print(json.dumps({"modules": mods, "libs": libs}))
"""


@pytest.mark.skipif(
    importlib.util.find_spec("cupy") is not None,
    reason="CuPy is installed: this host is not a CPU-only install",
)
def test_a_cpu_run_loads_no_cuda_library_nor_another_framework():
    pytest.importorskip("jax", reason="jax is not installed (pip install hvdlite[jax])")
    pytest.importorskip("optax", reason="optax is not installed (pip install hvdlite[jax])")
    result = json.loads(run(_NO_CUDA_PROBE).strip().splitlines()[-1])
    assert result == {"modules": [], "libs": []}, result


def test_collectives_before_init_say_to_call_init():
    pytest.importorskip("jax", reason="jax is not installed (pip install hvdlite[jax])")
    pytest.importorskip("optax", reason="optax is not installed (pip install hvdlite[jax])")
    run(
        "import jax.numpy as jnp, hvdlite.jax as hvd\n"
        "for call in (lambda: hvd.allreduce(jnp.ones(2)),\n"
        "             lambda: hvd.broadcast_parameters({'w': jnp.ones(2)}, 0)):\n"
        "    try:\n"
        "        call()\n"
        "    except ValueError as e:\n"
        "        assert 'init()' in str(e), e\n"
        "    else:\n"
        "        raise SystemExit('no error before init()')\n"
    )


def test_dispatch_routes_optax_transformations_to_hvdlite_jax():
    optax = pytest.importorskip("optax", reason="optax is not installed (pip install hvdlite[jax])")
    import hvdlite

    tx = hvdlite.DistributedOptimizer(optax.sgd(0.1), name="dispatched")
    assert isinstance(tx, optax.GradientTransformationExtraArgs)
    with pytest.raises(TypeError, match="optax GradientTransformations"):
        hvdlite.DistributedOptimizer(object())


def test_compression_casts_wide_floats_only():
    jnp = pytest.importorskip("jax.numpy", reason="jax is not installed")
    pytest.importorskip("optax", reason="optax is not installed (pip install hvdlite[jax])")
    from hvdlite.jax import Compression

    x = jnp.arange(4, dtype=jnp.float32) / 3
    for compressor, wire in ((Compression.fp16, jnp.float16), (Compression.bf16, jnp.bfloat16)):
        sent, ctx = compressor.compress(x)
        assert sent.dtype == wire
        back = compressor.decompress(sent, ctx)
        assert back.dtype == jnp.float32
        assert float(jnp.abs(back - x).max()) < 1e-2
    for untouched in (jnp.arange(3, dtype=jnp.int32), jnp.ones(2, jnp.float16)):
        sent, ctx = Compression.fp16.compress(untouched)
        assert sent is untouched and Compression.fp16.decompress(sent, ctx) is untouched
    sent, ctx = Compression.none.compress(x)
    assert sent is x and Compression.none.decompress(sent, ctx) is x


def test_sharding_is_refused_for_optax_naming_why():
    pytest.importorskip("optax")
    import optax

    import hvdlite

    with pytest.raises(NotImplementedError, match="optax transformation's state is one pytree"):
        hvdlite.DistributedOptimizer(optax.adam(0.1), shard_optimizer_state=True)
