"""Single-process tests of hvdlite.torch: compression, argument validation, dispatch."""

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn

import hvdlite
from hvdlite.torch import Compression
from hvdlite.torch.optimizer import _name_parameters, _parameter_groups

# ---------------------------------------------------------------- compression


def test_none_compression_is_identity():
    t = torch.randn(5)
    compressed, ctx = Compression.none.compress(t)
    assert compressed is t
    assert Compression.none.decompress(compressed, ctx) is t


@pytest.mark.parametrize("name,wire,tol", [("fp16", torch.float16, 1e-3),
                                           ("bf16", torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cast_compression_round_trip(name, wire, tol, dtype):
    compressor = getattr(Compression, name)
    t = torch.randn(64, dtype=dtype)
    compressed, ctx = compressor.compress(t)
    assert compressed.dtype == wire and compressed.shape == t.shape
    back = compressor.decompress(compressed, ctx)
    assert back.dtype == dtype
    torch.testing.assert_close(back, t, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_cast_compression_leaves_integers_and_its_own_dtype_alone(name):
    compressor = getattr(Compression, name)
    ints = torch.arange(4)
    compressed, ctx = compressor.compress(ints)
    assert compressed is ints and compressor.decompress(compressed, ctx) is ints
    same = torch.ones(3, dtype=compressor.wire_dtype)
    compressed, ctx = compressor.compress(same)
    assert compressed is same and compressor.decompress(compressed, ctx) is same


def test_compression_keeps_gradients_flowing():
    t = torch.randn(4, requires_grad=True)
    compressed, ctx = Compression.fp16.compress(t)
    Compression.fp16.decompress(compressed, ctx).sum().backward()
    assert torch.equal(t.grad, torch.ones(4))


# ------------------------------------------------------------ argument checks


def test_parameter_names_default_and_validation():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    groups = [{"params": list(model[0].parameters())}, {"params": list(model[1].parameters())}]
    names = _name_parameters(groups, None)
    assert sorted(names.values()) == ["allreduce.noname.0.0", "allreduce.noname.0.1",
                                      "allreduce.noname.1.0", "allreduce.noname.1.1"]
    named = list(model.named_parameters())
    assert set(_name_parameters(groups, named).values()) == {n for n, _ in named}
    with pytest.raises(ValueError, match="Found duplicates: a"):
        _name_parameters(groups, [("a", p) for _, p in named])
    with pytest.raises(ValueError, match=r"not named: param_groups\[1\]"):
        _name_parameters(groups, named[:2])
    with pytest.raises(ValueError, match="tuples"):
        _name_parameters(groups, [p for _, p in named])


def test_parameter_groups():
    params = [nn.Parameter(torch.ones(1)) for _ in range(5)]
    frozen = nn.Parameter(torch.ones(1), requires_grad=False)
    groups = [{"params": params + [frozen]}]
    mapping = _parameter_groups(2, groups)
    assert [len(mapping[p]) for p in params] == [3, 3, 3, 2, 2]
    assert frozen not in mapping
    assert _parameter_groups(None, groups) == {} and _parameter_groups(0, groups) == {}
    mapping = _parameter_groups([[params[0], params[3]], [params[1]]], groups)
    assert mapping[params[0]] == (params[0], params[3]) and params[1] not in mapping
    with pytest.raises(ValueError, match="once"):
        _parameter_groups([[params[0]], [params[0]]], groups)
    with pytest.raises(ValueError, match="not a trainable parameter"):
        _parameter_groups([[frozen]], groups)
    with pytest.raises(ValueError, match="non-negative"):
        _parameter_groups(-1, groups)
    with pytest.raises(ValueError):
        _parameter_groups("two", groups)


# ----------------------------------------------------------------- dispatch


def test_distributed_optimizer_needs_init():
    code = ("import torch, hvdlite.torch as hvd\n"
            "try:\n"
            "    hvd.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))],"
            " lr=0.1))\n"
            "except ValueError as e:\n"
            "    assert 'init()' in str(e), e\n"
            "else:\n"
            "    raise SystemExit('no error before init()')\n")
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=root, env=env)


def test_dispatch_rejects_other_objects():
    with pytest.raises(TypeError, match="torch.optim.Optimizer.*Keras"):
        hvdlite.DistributedOptimizer(object())


def test_dispatch_routes_keras_optimizers_without_importing_tensorflow(monkeypatch):
    calls = []
    fake_keras_adapter = types.ModuleType("hvdlite.tensorflow.keras")
    fake_keras_adapter.DistributedOptimizer = lambda opt, **kw: calls.append((opt, kw)) or "ok"
    monkeypatch.setitem(sys.modules, "hvdlite.tensorflow.keras", fake_keras_adapter)
    monkeypatch.setitem(sys.modules, "keras", types.ModuleType("keras"))
    adam = type("Adam", (), {"__module__": "keras.src.optimizers.adam"})()
    assert hvdlite.DistributedOptimizer(adam, backward_passes_per_step=2) == "ok"
    assert calls == [(adam, {"backward_passes_per_step": 2})]


def test_torch_import_does_not_pull_in_tensorflow():
    code = ("import sys, torch, hvdlite, hvdlite.torch as hvd\n"
            "hvd.init()\n"
            "opt = hvdlite.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter("
            "torch.ones(1))], lr=0.1))\n"
            "assert isinstance(opt, torch.optim.SGD)\n"
            "assert not {'tensorflow', 'keras'} & set(sys.modules), 'framework imported'\n")
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=root, env=env)
