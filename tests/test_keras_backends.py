"""hvdlite.keras picks its Keras backend once, per process: what each backend
imports and refuses (each case in a fresh Python, since Keras fixes its backend
at its first import), and the backend-free argument rules."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvdlite._optimizer_args import split_groups

ROOT = Path(__file__).resolve().parent.parent


def _python(backend: str, code: str) -> str:
    env = {
        **os.environ,
        "KERAS_BACKEND": backend,
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.timeout(150)
def test_torch_backend_imports_no_tensorflow():
    code = (
        "import sys, hvdlite.keras as hvd\n"
        "import hvdlite.keras.callbacks, hvdlite.keras.elastic\n"
        "print(hvd.Compression.__module__, 'tensorflow' in sys.modules)"
    )
    assert _python("torch", code) == "hvdlite.keras._backend_torch False"


@pytest.mark.timeout(150)
def test_jax_backend_imports_no_tensorflow():
    pytest.importorskip("jax")
    code = (
        "import sys, keras, hvdlite.keras as hvd\n"
        "import hvdlite.keras.callbacks, hvdlite.keras.elastic\n"
        "hvd.init()\n"
        "opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))\n"
        "print(type(opt).__name__, hvd.Compression.__module__, 'tensorflow' in sys.modules)"
    )
    assert _python("jax", code) == "SGD hvdlite.jax.compression False"


@pytest.mark.timeout(150)
def test_a_backend_that_cannot_train_is_refused_naming_the_fix():
    code = (
        "import keras, hvdlite.keras as hvd\n"
        "try:\n"
        "    hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))\n"
        "except NotImplementedError as e:\n"
        "    print(e)\n"
    )
    out = _python("numpy", code)
    assert "'numpy' is not supported" in out and "KERAS_BACKEND" in out
    assert "tensorflow, torch, jax" in out


class _Var:
    """Stands in for a Keras variable: the object and the value it holds."""

    def __init__(self):
        self.value = object()


def test_split_groups():
    assert split_groups([0, 1, 2], None, None) == [[0, 1, 2]]
    assert split_groups([], None, None) == []
    assert split_groups(list(range(5)), 2, None) == [[0, 1], [2, 3, 4]]
    variables = [_Var() for _ in range(4)]
    # by the variable or by its value; positions in no group travel alone
    groups = [[variables[2], variables[0].value], [variables[3]]]
    assert split_groups([0, 1, 2, 3], groups, variables) == [[0, 2], [3], [1]]
    with pytest.raises(ValueError, match="need the variables"):
        split_groups([0], groups, None)
