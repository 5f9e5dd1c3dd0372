"""The digits example reaches >= 93 % test accuracy with every compressor and with Adasum.

Top-k at 1 % sends about 3 % of the bytes of the dense gradient per step, so
it gets more epochs than the others (each epoch takes a fraction of a second).
"""

import importlib.util
from pathlib import Path

import pytest
import torch

import hvdlite.torch as hvd

MPI_SIZES = (2,)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
torch.set_num_threads(1)
hvd.init()


def load_example():
    spec = importlib.util.spec_from_file_location("torch_digits", EXAMPLES / "torch_digits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "args",
    [
        ["--compression", "fp16", "--epochs", "8"],
        ["--compression", "topk", "--topk-ratio", "0.01", "--epochs", "15"],
        [
            "--compression",
            "powersgd",
            "--powersgd-rank",
            "4",
            "--powersgd-start-step",
            "20",
            "--epochs",
            "8",
        ],
        ["--op", "adasum", "--epochs", "8"],
    ],
    ids=["fp16", "topk-1pct", "powersgd-rank4", "adasum"],
)
def test_digits_accuracy(args):
    accuracy = load_example().main(args + ["--checkpoint", ""])
    assert accuracy >= 0.93
    assert hvd.allgather_object(accuracy) == [accuracy] * hvd.size()
