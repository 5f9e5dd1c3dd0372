"""The device path's pure parts, in one process: array detection, packing through the
host backend, transport selection, the device in fusion and negotiation, capability
probes, and the proof that a CPU run never loads CuPy or CUDA libraries."""

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from hvdlite.engine.coordinator import check_agreement
from hvdlite.device import HostDeviceArray, device_of, host_device_array
from hvdlite.device.backend import HostBackend
from hvdlite.device.packing import (
    NUMPY,
    Scattered,
    pack,
    pack_rank_major,
    pack_rank_pieces,
    rank_counts,
    unpack,
)
from hvdlite.device.selection import Capabilities, DeviceChoice, read_request
from hvdlite.device.capabilities import cuda_aware_mpi
from hvdlite.device.buffers import Reduction
from hvdlite.engine.fusion import plan_batches
from hvdlite.engine.messages import RESPONSE_OK, Kind, Params, Response
from hvdlite.engine.transports.routes import Transport
from hvdlite.util.splits import even_split, offsets


class _FakeCudaArray:
    """Only what detection looks at (no GPU claim: nothing is moved)."""

    __cuda_array_interface__ = {"shape": (2,), "typestr": "<f4", "data": (0, False), "version": 3}


class _FakeDLPack:
    def __init__(self, kind):
        self.kind = kind

    def __dlpack_device__(self):
        return (self.kind, 0)


def test_device_of():
    assert device_of(np.ones(2)) == "cpu"
    assert device_of([1, 2]) == "cpu"
    assert device_of(host_device_array(np.ones(2))) == "host"
    assert device_of(_FakeCudaArray()) == "cuda"
    assert device_of(_FakeDLPack(2)) == "cuda"
    assert device_of(_FakeDLPack(1)) == "cpu"
    torch = pytest.importorskip("torch")
    assert device_of(torch.ones(2)) == "cpu"


def test_pack_and_unpack_scale_cast_and_zero_joined():
    backend = HostBackend()
    part = Reduction()
    a = host_device_array(np.arange(3, dtype=np.float16))
    b = host_device_array(np.ones(2, dtype=np.float32))
    outs = [host_device_array(np.empty(3, np.float16)), host_device_array(np.empty(2, np.float32))]
    part.add("e", a, outs[0], 3, 2.0, 0.5)
    part.add(None, None, None, 4, 1.0, 1.0)  # a joined rank's tensor: zeros, no output
    part.add("e", b, outs[1], 2, 1.0, 3.0)
    buf = backend.buffer(np.float32, part.total())
    pack(backend, part, buf)
    np.testing.assert_array_equal(buf, [0, 2, 4, 0, 0, 0, 0, 1, 1])
    buf += 1
    unpack(backend, part, buf)
    np.testing.assert_array_equal(outs[0], [0.5, 1.5, 2.5])
    np.testing.assert_array_equal(outs[1], [6, 6])
    assert isinstance(outs[0], HostDeviceArray)


def test_pack_fast_path_concatenates():
    backend = HostBackend()
    part = Reduction()
    xs = [host_device_array(np.full(n, n, np.float64)) for n in (1, 2, 3)]
    for x in xs:
        part.add("e", x, x, x.size, 1.0, 1.0)
    buf = backend.buffer(np.float64, part.total())
    pack(backend, part, buf)
    np.testing.assert_array_equal(buf, [1, 2, 2, 3, 3, 3])


def test_pack_rank_pieces_cuts_each_blocks_as_pack_rank_major_lays_them_out():
    """Each rank's block (its rows of every tensor, prescaled and cast) cut into
    pieces at the places given: read back piece by piece, every block is
    pack_rank_major's, and the runs returned tile the buffer in order, each naming
    the tensor its values came from."""
    size = 3
    a = np.arange(14, dtype=np.float16).reshape(7, 2)  # rows 3, 2, 2 over 3 ranks
    b = np.arange(100, 105, dtype=np.float16)  # rows 2, 2, 1

    def scattered(x, y, prescale):
        return [
            Scattered("a", x, x.shape, x.dtype, prescale, 1.0, even_split(7, size)),
            Scattered("b", y, y.shape, y.dtype, 1.0, 1.0, even_split(5, size)),
        ]

    tensors = scattered(a, b, 2.0)
    counts = rank_counts(tensors, size)
    whole = np.empty(sum(counts), np.float32)
    pack_rank_major(NUMPY, tensors, whole, offsets(counts))
    cuts = [even_split(count, 3) for count in counts]  # a piece may hold nothing of a rank
    piece_at = offsets([sum(c[i] for c in cuts) for i in range(3)])
    # within a piece, the ranks' parts in reverse order
    places = [
        [piece_at[i] + sum(cuts[q][i] for q in range(r + 1, size)) for r in range(size)]
        for i in range(3)
    ]
    send = np.full(sum(counts), -1.0, np.float32)
    runs = pack_rank_pieces(NUMPY, tensors, send, cuts, places)
    for r in range(size):
        back = [send[places[i][r] : places[i][r] + cuts[r][i]] for i in range(3)]
        lo = offsets(counts)[r]
        np.testing.assert_array_equal(np.concatenate(back), whole[lo : lo + counts[r]])
    assert [at for at, _, _ in runs] == offsets([n for _, n, _ in runs])
    assert sum(n for _, n, _ in runs) == send.size
    ids = np.empty_like(send)
    pack_rank_pieces(NUMPY, scattered(np.zeros_like(a), np.ones_like(b), 1.0), ids, cuts, places)
    for at, n, j in runs:
        assert (ids[at : at + n] == j).all()


def test_read_request():
    assert dict(read_request({})) == dict.fromkeys(dict(read_request({})), "")
    req = dict(read_request({"HOROVOD_GPU_OPERATIONS": "mpi", "HOROVOD_GPU_ALLREDUCE": "NCCL"}))
    assert req["allreduce"] == "NCCL" and req["allgather"] == "MPI"
    req = dict(read_request({"HOROVOD_GPU_OPERATIONS": "MPI", "HVDLITE_GPU_OPERATIONS": "NCCL"}))
    assert set(req.values()) == {"NCCL"}
    with pytest.raises(ValueError, match="HVDLITE_GPU_BROADCAST='GLOO'.*NCCL or MPI"):
        read_request({"HVDLITE_GPU_BROADCAST": "GLOO"})


@pytest.mark.parametrize(
    "caps,env,expect",
    [
        (Capabilities(True, True, False), {}, Transport.NCCL),
        (
            Capabilities(True, True, True),
            {"HVDLITE_GPU_OPERATIONS": "MPI"},
            Transport.CUDA_AWARE_MPI,
        ),
        (Capabilities(True, True, False), {"HVDLITE_GPU_OPERATIONS": "MPI"}, Transport.STAGED),
        (
            Capabilities(True, False, True),
            {"HVDLITE_GPU_OPERATIONS": "NCCL"},
            Transport.CUDA_AWARE_MPI,
        ),
        (Capabilities(False, False, False), {}, Transport.STAGED),
    ],
)
def test_plan_rules(caps, env, expect):
    plan = DeviceChoice(caps, read_request(env)).routes()
    assert plan.allreduce is expect and plan.alltoall is expect
    assert plan.fallback in (Transport.CUDA_AWARE_MPI, Transport.STAGED)
    assert expect.value in plan.describe()


def test_hierarchical_only_for_the_whole_homogeneous_job():
    caps = Capabilities(True, True, False)
    assert DeviceChoice(caps, read_request({}), True, True).routes(True).hierarchical
    assert not DeviceChoice(caps, read_request({}), True, True).routes(False).hierarchical
    assert not DeviceChoice(caps, read_request({}), True, False).routes(True).hierarchical


def test_capabilities_agree_only_on_what_everyone_has():
    both = Capabilities(True, True, True, "x") & Capabilities(True, False, True, "y")
    assert both == Capabilities(True, False, True, "not on every rank")


def _response(name, device, dtype="<f4"):
    p = Params(
        set_id=0,
        name=name,
        kind=int(Kind.ALLREDUCE),
        dtypes=(dtype,),
        shapes=((4,),),
        device=device,
    )
    return Response(RESPONSE_OK, p, p.key)


def test_fusion_never_mixes_devices():
    responses = [
        _response("a", "cpu"),
        _response("b", "cuda"),
        _response("c", "cpu"),
        _response("d", "cuda"),
    ]
    batches = plan_batches(responses, 1 << 20)
    assert [[r.key[1] for r in b] for b in batches] == [["a", "c"], ["b", "d"]]


def test_device_mismatch_message_names_both():
    message = check_agreement(
        "w", {0: _response("w", "cpu").params, 1: _response("w", "cuda").params}
    )
    assert "Mismatched device" in message and "rank 0: cpu" in message and "rank 1: cuda" in message


def test_cuda_aware_mpi_knob():
    assert cuda_aware_mpi({"HVDLITE_CUDA_AWARE_MPI": "1"}) == (True, "HVDLITE_CUDA_AWARE_MPI=1")
    assert cuda_aware_mpi({"HVDLITE_CUDA_AWARE_MPI": "0"})[0] is False
    assert cuda_aware_mpi({"MV2_USE_CUDA": "1"})[0] is True


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed")
def test_cuda_array_without_cupy_names_the_fix():
    from hvdlite.device import registry

    with pytest.raises(ValueError, match=r"pip install hvdlite\[cuda12\]"):
        registry.backend("cuda")


def test_check_build_gpu_row():
    from hvdlite.runner.checkbuild import _gpu_transport_row

    assert "cuda12" in _gpu_transport_row({"missing": "x"}, {}, {})
    row = _gpu_transport_row({"cuda_available": True, "nccl": "22703"}, {}, {})
    assert "would use NCCL" in row
    row = _gpu_transport_row(
        {"cuda_available": True}, {"cuda_aware": True}, {"HVDLITE_GPU_OPERATIONS": "MPI"}
    )
    assert "would use CUDA-aware MPI" in row


_NO_CUDA_PROBE = r"""
import json, sys
import numpy as np
import hvdlite, hvdlite.torch, hvdlite.tensorflow
hvdlite.init()
hvdlite.allreduce(np.ones(3, np.float32), name="probe")
answers = [hvdlite.cuda_built(), hvdlite.nccl_built()]
hvdlite.shutdown()
mods = sorted(m for m in sys.modules if m.split(".")[0] in ("cupy", "cupy_backends", "pycuda",
                                                            "numba"))
with open("/proc/self/maps") as f:
    libs = sorted({l.split()[-1] for l in f
                   if any(k in l for k in ("libcudart", "libcuda.so", "libnccl", "libcublas"))})
print(json.dumps({"modules": mods, "libs": libs, "answers": answers}))
"""


@pytest.mark.skipif(
    importlib.util.find_spec("cupy") is not None,
    reason="CuPy is installed: this host is not a CPU-only install",
)
def test_cpu_run_never_loads_cupy_or_cuda():
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    out = subprocess.run(
        [sys.executable, "-c", _NO_CUDA_PROBE], capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"modules": [], "libs": [], "answers": [False, 0]}, result
