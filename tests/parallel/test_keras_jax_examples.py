"""The Keras digits example runs end to end on Keras' JAX backend under MPI."""

import importlib.util
from pathlib import Path

from keras_backend_helpers import keras_on

keras = keras_on("jax")

import hvdlite.keras as hvd  # noqa: E402

MPI_SIZES = (2,)
MPI_ENV = {"KERAS_BACKEND": "jax"}
MPI_REQUIRES = ("jax",)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
hvd.init()


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_keras_digits_on_jax_reaches_95_percent_and_rank0_checkpoints(tmp_path_factory, capsys):
    checkpoint = tmp_path_factory.mktemp("ckpt") / "digits.keras"
    accuracy = load("keras_digits").main(["--epochs", "10", "--checkpoint", str(checkpoint)])
    assert accuracy >= 0.95
    assert hvd.allgather_object(round(accuracy, 6)) == [round(accuracy, 6)] * hvd.size()
    out = capsys.readouterr().out
    if hvd.rank() == 0:
        assert "Keras backend jax" in out
        assert checkpoint.exists()
        assert "Epoch 10/10" in out and "final test accuracy" in out
        # the checkpoint reloads with a distributed optimizer on this backend
        assert hasattr(hvd.load_model(str(checkpoint)).optimizer, "_hvd")
    else:
        assert not checkpoint.exists()
        assert "Epoch" not in out
