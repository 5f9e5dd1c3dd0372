"""A collective call's request is made once: each tensor validated once, its device
asked once, the single-tensor fast path decided once (``Params.single_host``).

The calls run against a stand-in for the running engine that only keeps what is
submitted; nothing here starts MPI.  The executor's side of the fast path (it
follows ``Params.single_host``) is checked under MPI in
tests/parallel/test_core_ops.py.
"""

from __future__ import annotations

import collections
import functools
import types

import numpy as np
import pytest
import torch

import hvdlite.torch.mpi_ops as mpi_ops
from hvdlite.torch import _handles
from hvdlite import collectives
from hvdlite.device import arrays, registry, submission
from hvdlite.device.arrays import host_device_array
from hvdlite.engine import runtime
from hvdlite.exceptions import ArgumentError
from hvdlite.ops import Max, Sum
from hvdlite.util.dtypes import BFLOAT16
from hvdlite.util.paths import Transport

pytestmark = pytest.mark.timeout(60)


class _Engine:
    """Keeps the submitted entries; never runs them."""

    stopped = False

    def __init__(self):
        self.entries = []

    def submit(self, entry, wake=True):
        self.entries.append(entry)
        return entry.handle


class _Router:
    """The routes of a one-rank set: on one node, or (*across*) as if it spanned nodes."""

    def __init__(self):
        self.across = False

    def routes(self, ranks):
        return types.SimpleNamespace(half_allreduce=Transport.HALF_WIRE if self.across else None)


@pytest.fixture
def engine(monkeypatch):
    st = runtime.Runtime()
    st.engine = _Engine()
    st.sets = types.SimpleNamespace(ranks={0: [0]}, ranks_of=lambda process_set: [0])
    st.router = _Router()
    monkeypatch.setattr(runtime, "_state", st)
    return st.engine


def _counting(monkeypatch, counts, module, name, label):
    real = getattr(module, name)

    @functools.wraps(real)
    def counted(*args, **kwargs):
        counts[label] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)


@pytest.fixture
def device_questions(monkeypatch):
    """How often an array was asked its device."""
    counts = collections.Counter()
    _counting(monkeypatch, counts, arrays, "device_of", "device_of")
    _counting(monkeypatch, counts, submission, "device_of", "device_of")
    return counts


@pytest.fixture
def calls(monkeypatch, device_questions):
    """How often each validator, device question and fast-path decision ran."""
    counts = device_questions
    _counting(monkeypatch, counts, _handles, "_check", "torch check")  # _source, _target
    _counting(monkeypatch, counts, mpi_ops, "_check", "torch check")
    _counting(monkeypatch, counts, collectives, "checked_input", "input check")
    _counting(monkeypatch, counts, collectives, "checked_output", "output check")
    _counting(monkeypatch, counts, collectives, "single_host", "fast path decision")
    return counts


class _CudaArray:
    """Stands in for a CuPy array: device_of says "cuda"."""

    __cuda_array_interface__: dict = {}

    def __init__(self, shape=(4,), dtype=np.float32):
        self.shape, self.dtype = shape, np.dtype(dtype)


class _CudaBackend:
    """The CUDA backend's caller-side part, for :class:`_CudaArray`."""

    def __init__(self):
        self.readied = []

    def wrap(self, x, what):
        return x

    def empty(self, shape, dtype, ready=None):
        return _CudaArray(shape, dtype)

    def record_ready(self, inputs):
        self.readied.append(len(inputs))
        return "ready"


@pytest.fixture
def cuda(monkeypatch):
    backend = _CudaBackend()
    monkeypatch.setitem(registry._backends, "cuda", backend)
    return backend


@pytest.mark.parametrize("name", ["w", None], ids=["named", "unnamed"])
@pytest.mark.parametrize("spelling", ["allreduce_async", "allreduce_async_"])
def test_a_torch_allreduce_validates_its_tensor_once_and_asks_no_device(
    engine, calls, spelling, name
):
    tensor = torch.ones(4)
    getattr(mpi_ops, spelling)(tensor, name=name, op=Sum)
    assert calls == {"torch check": 1, "fast path decision": 1}
    (entry,) = engine.entries
    assert entry.params.device == "cpu" and entry.params.single_host
    assert entry.inputs[0].__array_interface__["data"][0] == tensor.data_ptr()


@pytest.mark.parametrize("spelling", ["grouped_allreduce_async", "grouped_allreduce_async_"])
def test_every_torch_allreduce_spelling_validates_each_tensor_once(engine, calls, spelling):
    # bfloat16 travels as a float32 copy within a node, the general path of both spellings
    tensors = [torch.ones(3, dtype=torch.bfloat16), torch.ones(2, 2)]
    getattr(mpi_ops, spelling)(tensors, op=Sum)
    mpi_ops.allreduce_async(tensors[0], op=Sum)
    assert calls == {"torch check": 3, "fast path decision": 2}
    group, alone = (entry.params for entry in engine.entries)
    assert group.framework_dtypes == ("bfloat16", "float32")
    assert alone.dtypes == ("<f4",) and alone.framework_dtypes == ("bfloat16",)
    assert alone.single_host  # the engine reduces the float32 copy as it is


def test_torch_bfloat16_goes_as_itself_where_it_crosses_nodes(engine, calls):
    # across nodes the engine takes bfloat16 (numpy's) and moves 16 bits: no copy
    runtime._state.router.across = True
    tensor = torch.ones(3, dtype=torch.bfloat16)
    mpi_ops.grouped_allreduce_async([tensor, torch.ones(2)], op=Sum)
    mpi_ops.allreduce_async_(tensor, op=Sum)
    assert calls == {"torch check": 3, "fast path decision": 2}
    group, alone = engine.entries
    assert group.params.dtypes == ("bfloat16", "<f4")
    assert alone.params.dtypes == ("bfloat16",) and not alone.params.single_host
    assert alone.inputs[0].dtype == BFLOAT16
    assert alone.inputs[0].__array_interface__["data"][0] == tensor.data_ptr()


_MOVES = {
    "allgather_async": lambda t: mpi_ops.allgather_async(t),
    "grouped_allgather_async": lambda t: mpi_ops.grouped_allgather_async([t, t]),
    "broadcast_async": lambda t: mpi_ops.broadcast_async(t, 0),
    "broadcast_async_": lambda t: mpi_ops.broadcast_async_(t, 0),
    "alltoall_async": lambda t: mpi_ops.alltoall_async(t),
    "reducescatter_async": lambda t: mpi_ops.reducescatter_async(t, op=Sum),
    "grouped_reducescatter_async": lambda t: mpi_ops.grouped_reducescatter_async([t], op=Sum),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("spelling", sorted(_MOVES))
def test_every_other_torch_collective_validates_each_tensor_once(engine, calls, spelling, dtype):
    # the adapter checks each tensor and hands the engine its view with the device
    # it found: the numpy API checks none of them again, nor asks their device
    tensor = torch.ones(4, 2, dtype=dtype)
    _MOVES[spelling](tensor)
    tensors = 2 if spelling == "grouped_allgather_async" else 1
    assert calls == {"torch check": tensors}
    (entry,) = engine.entries
    assert entry.params.device == "cpu"
    assert len(entry.inputs) == tensors


def test_a_torch_gradient_bucket_is_validated_once_by_the_adapter(engine, calls):
    tensors = [torch.ones(3), torch.ones(5)]
    mpi_ops.grouped_allreduce_async_(tensors, name="bucket", op=Sum)
    mpi_ops.grouped_allreduce_async_(tensors[:1], name="alone", op=Sum)
    assert calls == {"fast path decision": 2}
    bucket, alone = (entry.params for entry in engine.entries)
    assert not bucket.single_host  # two tensors: the general path
    assert alone.single_host and alone.device == "cpu"


def test_the_fast_path_is_decided_once_per_request_and_remembered_with_it(engine, calls):
    x = np.ones(4, np.float32)
    for _ in range(3):
        collectives.allreduce_async(x, name="metric", op=Sum)
        engine.entries.clear()  # nothing runs: let the name be submitted again
    assert calls["fast path decision"] == 1  # the remembered request carries it
    for _ in range(2):
        collectives.allreduce_async(x, op=Sum)
    assert calls["fast path decision"] == 3  # a new request each time


@pytest.mark.parametrize(
    "array,op,fast",
    [
        (np.ones(4, np.float32), Sum, True),
        (np.ones((2, 3), np.int64), Sum, True),
        (np.ones(4, np.float16), Sum, False),  # reduced in a float32 buffer
        (np.ones(4, np.bool_), Max, False),  # reduced as uint8
        (host_device_array(np.ones(4, np.float32)), Sum, False),  # the device path
    ],
    ids=["float32", "int64", "float16", "bool", "host device"],
)
def test_the_request_says_whether_it_takes_the_fast_path(engine, array, op, fast):
    collectives.allreduce_async(array, op=op)
    assert engine.entries[0].params.single_host is fast


def test_a_device_array_is_asked_its_device_once(engine, device_questions, cuda):
    x, out = _CudaArray(), _CudaArray()
    collectives.allreduce_async(x, name="g", op=Sum, output=out)  # input and output: once each
    collectives.allreduce_async(x, name="h", op=Sum, output=x)  # in place: once
    assert device_questions["device_of"] == 3
    first, second = engine.entries
    assert first.params.device == second.params.device == "cuda"
    assert not first.params.single_host
    assert first.ready == "ready" and cuda.readied == [1, 1]


def test_device_errors_keep_their_words(engine, cuda):
    with pytest.raises(ArgumentError, match="the output is on device 'cpu' but the input on"):
        collectives.allreduce_async(_CudaArray(), output=np.ones(4, np.float32))
    mixed = [host_device_array(np.ones(2, np.float32)), np.ones(2, np.float32)]
    with pytest.raises(ArgumentError) as info:
        collectives.grouped_allreduce_async(mixed, name="mix")
    assert str(info.value) == (
        "mix: the arrays of one collective must all be on one device, got cpu, host; "
        "move them first (e.g. tensor.cuda() or .cpu())."
    )
    with pytest.raises(ArgumentError, match="^one: the arrays .* got cpu, host;"):
        collectives.allreduce_async(mixed[0], name="one", output=mixed[1])
    assert not engine.entries
