"""The Keras digits example runs end to end under MPI and does what it promises."""

import importlib.util
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import hvdlite.tensorflow.keras as hvd  # noqa: E402

MPI_SIZES = (2,)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
hvd.init()


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_keras_digits_reaches_95_percent_and_rank0_checkpoints(tmp_path_factory, capsys):
    checkpoint = tmp_path_factory.mktemp("ckpt") / "digits.keras"
    accuracy = load("keras_digits").main(["--epochs", "10", "--checkpoint", str(checkpoint)])
    assert accuracy >= 0.95
    assert hvd.allgather_object(round(accuracy, 6)) == [round(accuracy, 6)] * hvd.size()
    out = capsys.readouterr().out
    if hvd.rank() == 0:
        assert checkpoint.exists()
        assert "Epoch 10/10" in out and "final test accuracy" in out
        # Not a terminal: one line per epoch, no progress bar and no terminal codes.
        assert "\x1b[" not in out and "\u2501" not in out and "\r" not in out
        assert "loss:" in out
    else:
        assert not checkpoint.exists()
        assert "Epoch" not in out  # the progress bar is rank 0's only
