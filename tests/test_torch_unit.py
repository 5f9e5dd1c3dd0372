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


@pytest.mark.parametrize(
    "name,wire,tol", [("fp16", torch.float16, 1e-3), ("bf16", torch.bfloat16, 1e-2)]
)
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
    assert sorted(names.values()) == [
        "allreduce.noname.0.0",
        "allreduce.noname.0.1",
        "allreduce.noname.1.0",
        "allreduce.noname.1.1",
    ]
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
    code = (
        "import torch, hvdlite.torch as hvd\n"
        "try:\n"
        "    hvd.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))],"
        " lr=0.1))\n"
        "except ValueError as e:\n"
        "    assert 'init()' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('no error before init()')\n"
    )
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=root, env=env)


def test_dispatch_rejects_other_objects():
    with pytest.raises(TypeError, match="torch.optim.Optimizer.*Keras"):
        hvdlite.DistributedOptimizer(object())


def test_dispatch_routes_keras_optimizers_without_importing_tensorflow(monkeypatch):
    calls = []
    fake_keras_adapter = types.ModuleType("hvdlite.keras")
    fake_keras_adapter.DistributedOptimizer = lambda opt, **kw: calls.append((opt, kw)) or "ok"
    monkeypatch.setitem(sys.modules, "hvdlite.keras", fake_keras_adapter)
    monkeypatch.setitem(sys.modules, "keras", types.ModuleType("keras"))
    adam = type("Adam", (), {"__module__": "keras.src.optimizers.adam"})()
    assert hvdlite.DistributedOptimizer(adam, backward_passes_per_step=2) == "ok"
    assert calls == [(adam, {"backward_passes_per_step": 2})]


def test_torch_import_does_not_pull_in_tensorflow():
    code = (
        "import sys, torch, hvdlite, hvdlite.torch as hvd\n"
        "hvd.init()\n"
        "opt = hvdlite.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter("
        "torch.ones(1))], lr=0.1))\n"
        "assert isinstance(opt, torch.optim.SGD)\n"
        "assert not {'tensorflow', 'keras'} & set(sys.modules), 'framework imported'\n"
    )
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=root, env=env)


def test_buckets_cut_last_layer_first_with_a_small_first_bucket():
    from hvdlite.torch.buckets import FIRST_BUCKET_BYTES, build_buckets

    big = torch.nn.Linear(512, 512)  # 1 MB weight: more than the first bucket holds
    small = [torch.nn.Linear(8, 8) for _ in range(3)]
    params = list(big.parameters()) + [p for m in small for p in m.parameters()]
    got = build_buckets(params, cap=4 << 20)
    # the first bucket (1 MB at most) takes the small layers and the big bias; the
    # big weight fills the next one alone, so it is reduced on its own (not listed)
    assert params[0].numel() * 4 == FIRST_BUCKET_BYTES
    assert got == [tuple(reversed(params[1:]))]
    extra = torch.nn.Parameter(torch.zeros(10))
    assert build_buckets([extra] + params, cap=4 << 20) == [
        tuple(reversed(params[1:])),
        (params[0], extra),
    ]
    assert build_buckets(params, cap=0) == []
    # a smaller cap cuts sooner: the small layers, then the big bias and weight alone
    assert build_buckets(params, cap=1 << 10) == [tuple(reversed(params[2:]))]
    # with no small first bucket (the hooks only count), one bucket takes them all
    assert build_buckets(params, cap=4 << 20, first=4 << 20) == [tuple(reversed(params))]


def test_bucket_cap_from_argument_or_the_knob():
    from hvdlite import config
    from hvdlite.torch.buckets import bucket_cap_bytes

    assert config.read_config({}).bucket_cap_mb == 25.0
    assert config.read_config({"HOROVOD_BUCKET_CAP_MB": "2.5"}).bucket_cap_mb == 2.5
    with pytest.raises(ValueError, match="HVDLITE_BUCKET_CAP_MB must be >= 0 MB"):
        config.read_config({"HVDLITE_BUCKET_CAP_MB": "-3"})
    assert bucket_cap_bytes(0) == 0
    assert bucket_cap_bytes(0.5) == 1 << 19
    for bad in (-1, float("nan"), float("inf"), "25", True):
        with pytest.raises(ValueError, match="bucket_cap_mb must be a finite number"):
            bucket_cap_bytes(bad)


@pytest.mark.parametrize(
    "dtype,hint",
    [
        (torch.complex64, "torch.view_as_real(tensor)"),
        (torch.uint32, "tensor.to(torch.int64)"),
        (torch.float8_e4m3fn, "tensor.float()"),
    ],
)
def test_an_unsupported_dtype_names_the_cast_that_fixes_it(dtype, hint):
    from hvdlite.torch._handles import _check

    with pytest.raises(ValueError, match="unsupported dtype") as info:
        _check(torch.zeros(2).to(dtype), "allreduce")
    assert hint in str(info.value) and "bfloat16" in str(info.value)
