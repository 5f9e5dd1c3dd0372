"""The JAX example runs end to end under MPI and reaches the single-process accuracy.

One process reaches 96.9 % with the example's defaults (15 epochs; measured
with ``mpiexec -n 1``); 2 ranks, each on half the rows, must reach 95 % within
8 epochs, with the reduction inside the jitted step and with it eager.
"""

import importlib.util
from pathlib import Path

from jax_helpers import quiet_jax

quiet_jax()

import pytest  # noqa: E402

import hvdlite.jax as hvd  # noqa: E402

MPI_SIZES = (2,)
MPI_REQUIRES = ("jax", "optax", "sklearn")

pytestmark = pytest.mark.timeout(180)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
hvd.init()


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("mode", [[], ["--eager-reduce"]], ids=["jit", "eager"])
def test_jax_digits_reaches_95_percent(mode, capsys):
    accuracy = load("jax_digits").main(["--epochs", "8", *mode])
    assert accuracy >= 0.95
    assert hvd.allgather_object(accuracy) == [accuracy] * hvd.size()
    if hvd.rank() == 0:
        assert "final test accuracy" in capsys.readouterr().out
