"""The torch examples run end to end under MPI and do what they promise."""

import importlib.util
import os
from pathlib import Path

import torch

import hvdlite.torch as hvd

MPI_SIZES = (2,)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
torch.set_num_threads(1)
hvd.init()


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_torch_digits_reaches_95_percent(tmp_path_factory):
    # every rank writes to its own temp dir; only rank 0 writes a checkpoint
    checkpoint = tmp_path_factory.mktemp("ckpt") / "digits.pt"
    accuracy = load("torch_digits").main(["--epochs", "8", "--checkpoint", str(checkpoint)])
    assert accuracy >= 0.95
    assert hvd.allgather_object(accuracy) == [accuracy] * hvd.size()
    if hvd.rank() == 0:
        saved = torch.load(checkpoint)
        assert saved["epoch"] == 8 and "model" in saved and "optimizer" in saved
    else:
        assert not os.path.exists(checkpoint)


def test_torch_synthetic_benchmark_runs(capsys):
    load("torch_synthetic_benchmark").main(
        [
            "--batch-size",
            "4",
            "--image-size",
            "16",
            "--width",
            "8",
            "--num-warmup-batches",
            "1",
            "--num-batches-per-iter",
            "1",
            "--num-iters",
            "2",
            "--fp16-allreduce",
        ]
    )
    out = capsys.readouterr().out
    if hvd.rank() == 0:
        assert "total img/sec on 2 rank(s)" in out
