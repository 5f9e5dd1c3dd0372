"""Single-process tests of hvdlite.torch.reducers (no MPI, no engine).

The parts a reducer sees without communicating are checked here: the
reduction context, the base class defaults, the built-ins' argument checks,
CompressorReducer's glue around a stand-in compressor, and how
DistributedOptimizer's arguments pick or refuse a reducer.
"""

import pytest
import torch
from torch import nn

import hvdlite
import hvdlite.torch as hvd
from hvdlite.torch.compressors import StatefulCompressor
from hvdlite.torch.optimizer import _check_reducer, _default_reducer
from hvdlite.torch.reducers import (
    AdasumReducer,
    AllreduceReducer,
    CompressorReducer,
    GradientReducer,
    ReductionContext,
)

pytestmark = pytest.mark.timeout(60)


def context(*params, groups=()):
    """A context over *params* named p0, p1, ...; *groups* are tuples of them."""
    ctx = ReductionContext({p: f"p{i}" for i, p in enumerate(params)}, hvdlite.global_process_set)
    group_of = {p: g for g in groups for p in g}
    for p in params:
        if p.requires_grad:
            ctx._track(p, group_of.get(p, p))
    return ctx


class RecordingCompressor(StatefulCompressor):
    """Doubles every gradient in place and remembers what it was given."""

    kind = "recording"

    def __init__(self):
        self.seen = []

    def reduce(self, grads, process_set, op):
        self.seen.append([(name, grad.clone()) for name, grad in grads])
        for _, grad in grads:
            grad.mul_(2)
        return 123

    def state_dict(self):
        return {"kind": self.kind, "calls": len(self.seen)}

    def load_state_dict(self, state):
        self._check_kind(state)
        self.seen = [None] * state["calls"]


# -------------------------------------------------------------------- context


def test_context_keys_parameters_and_gradients():
    a, b, c = (nn.Parameter(torch.ones(2)) for _ in range(3))
    frozen = nn.Parameter(torch.ones(1), requires_grad=False)
    group = (b, c)
    ctx = context(a, b, frozen, c, groups=[group])
    assert len(ctx.keys) == 2 and ctx.keys[0] is a and ctx.keys[1] is group
    assert [id(p) for p in ctx.parameters()] == [id(a), id(b), id(c)]
    assert not ctx._track(a, a)  # already tracked: no second hook
    a.grad = torch.full((2,), 3.0)
    named = ctx.named_gradients()
    assert [n for n, _ in named] == ["p0", "p1", "p3"]
    assert named[0][1] is a.grad
    assert torch.equal(b.grad, torch.zeros(2))  # never computed here: zeros, kept on p
    assert named[1][1] is b.grad


def test_base_reducer_defaults():
    reducer = GradientReducer()
    ctx = context(nn.Parameter(torch.ones(1)))
    assert reducer.bytes_sent_last_step == 0 and reducer.state_dict() is None
    reducer.gradient_ready(ctx, ctx.keys[0])  # default: nothing
    reducer.load_state_dict({"ignored": 1})
    with pytest.raises(NotImplementedError, match="synchronize"):
        reducer.synchronize(ctx)
    assert reducer.step(ctx, lambda: "stepped") == "stepped"
    assert reducer.step(ctx, lambda closure: closure(), lambda: "closure") == "closure"


# ------------------------------------------------------------------ built-ins


def test_builtin_argument_checks():
    with pytest.raises(ValueError, match="op != Average"):
        AllreduceReducer(op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="positive"):
        AllreduceReducer(gradient_predivide_factor=0.0)
    with pytest.raises(ValueError, match=r"CompressorReducer\(Compression.topk"):
        AllreduceReducer(compression=hvd.Compression.topk(0.1))
    with pytest.raises(TypeError, match="stateful compressor"):
        CompressorReducer(hvd.Compression.fp16)
    with pytest.raises(ValueError, match="op=Average or op=Sum"):
        CompressorReducer(hvd.Compression.topk(0.1), op=hvd.Max)
    with pytest.raises(ValueError, match="Adasum"):
        AdasumReducer(hvd.Compression.powersgd())
    assert AllreduceReducer()._scale_factors() == (1.0, 1.0)
    assert AllreduceReducer(gradient_predivide_factor=4.0)._scale_factors() == (0.25, 4.0)
    assert AllreduceReducer(op=hvd.Sum)._scale_factors() == (1.0, 1.0)


def test_compressor_reducer_glue():
    dense = nn.Parameter(torch.ones(2, 2))
    unused = nn.Parameter(torch.ones(3))
    sparse = nn.Parameter(torch.ones(4, 2))
    ctx = context(dense, unused, sparse)
    dense.grad = torch.full((2, 2), 0.5)
    sparse.grad = torch.sparse_coo_tensor([[1, 3]], torch.ones(2, 2), (4, 2), check_invariants=True)
    compressor = RecordingCompressor()
    reducer = CompressorReducer(compressor, op=hvd.Sum)
    reducer.synchronize(ctx)
    (call,) = compressor.seen
    assert [name for name, _ in call] == ["p0", "p1", "p2"]  # every parameter, in order
    assert torch.equal(call[1][1], torch.zeros(3))  # unused here: zeros go to the exchange
    assert not call[2][1].is_sparse  # densified for the compressor...
    assert sparse.grad.is_sparse  # ...and sparse again for the optimizer
    assert torch.equal(sparse.grad.to_dense()[1], torch.full((2,), 2.0))
    assert torch.equal(dense.grad, torch.ones(2, 2))
    assert reducer.bytes_sent_last_step == 123
    state = reducer.state_dict()
    fresh = CompressorReducer(RecordingCompressor())
    fresh.load_state_dict(state)
    assert len(fresh.compressor.seen) == 1


def test_adasum_reducer_keeps_gradients_local_until_step():
    reducer = AdasumReducer()
    reducer.bytes_sent_last_step = 7
    p = nn.Parameter(torch.ones(2))
    p.grad = torch.ones(2)
    reducer.synchronize(context(p))
    assert reducer.bytes_sent_last_step == 0 and torch.equal(p.grad, torch.ones(2))


# ------------------------------------------------- choosing from the arguments


def test_default_reducer_follows_horovods_arguments():
    plain = _default_reducer(hvd.Compression.fp16, hvd.Sum, 1.0, True)
    assert isinstance(plain, AllreduceReducer)
    assert (plain.op, plain.compression, plain.sparse_as_dense) == (
        hvd.Sum,
        hvd.Compression.fp16,
        True,
    )
    topk = hvd.Compression.topk(0.1)
    stateful = _default_reducer(topk, hvd.Average, 1.0, False)
    assert isinstance(stateful, CompressorReducer) and stateful.compressor is topk
    adasum = _default_reducer(hvd.Compression.bf16, hvd.Adasum, 1.0, False)
    assert isinstance(adasum, AdasumReducer) and adasum.compression is hvd.Compression.bf16
    with pytest.raises(ValueError, match="op=Average or op=Sum"):  # as before: topk first
        _default_reducer(topk, hvd.Adasum, 1.0, False)


def test_reducer_conflicts_name_the_argument_and_the_fix():
    reducer = AllreduceReducer()
    _check_reducer(reducer, hvd.Compression.none, hvd.Average, 1.0, False)  # defaults: fine
    for kwargs, named in [
        ({"compression": hvd.Compression.fp16}, "compression=Compression.fp16"),
        ({"op": hvd.Adasum}, "op="),
        ({"gradient_predivide_factor": 2.0}, "gradient_predivide_factor=2.0"),
        ({"sparse_as_dense": True}, "sparse_as_dense=True"),
    ]:
        args = {
            "compression": hvd.Compression.none,
            "op": hvd.Average,
            "gradient_predivide_factor": 1.0,
            "sparse_as_dense": False,
            **kwargs,
        }
        with pytest.raises(ValueError, match=named) as info:
            _check_reducer(reducer, **args)
        assert "AllreduceReducer(op=" in str(info.value) and "reducer=None" in str(info.value)
    with pytest.raises(TypeError, match="GradientReducer"):
        _check_reducer(lambda ctx: None, hvd.Compression.none, hvd.Average, 1.0, False)


def test_reducers_are_exported():
    for name in (
        "GradientReducer",
        "ReductionContext",
        "AllreduceReducer",
        "CompressorReducer",
        "AdasumReducer",
    ):
        assert name in hvd.__all__ and getattr(hvd, name).__module__ == "hvdlite.torch.reducers"


def test_a_flat_bucket_unflattens_into_its_gradients_in_order():
    from hvdlite.torch.reducers import _flatten, _unflatten_into

    grads = [
        torch.arange(6.0).reshape(2, 3),
        torch.tensor([7.0]),
        torch.arange(4.0).reshape(2, 2).t(),
    ]  # non-contiguous: copied by value
    flat = _flatten(grads)
    assert flat.tolist() == [0, 1, 2, 3, 4, 5, 7, 0, 2, 1, 3]
    before = [g.data_ptr() for g in grads]
    _unflatten_into(grads, flat * 10)
    assert [g.data_ptr() for g in grads] == before  # written in place
    assert grads[0].tolist() == [[0, 10, 20], [30, 40, 50]]
    assert grads[1].tolist() == [70]
    assert grads[2].tolist() == [[0, 20], [10, 30]]


def test_a_bucket_buffer_packs_into_one_kept_tensor_and_unpacks_in_place():
    from hvdlite.torch.reducers import _BucketBuffer

    grads = [
        torch.arange(6.0).reshape(2, 3),
        torch.tensor([7.0]),
        torch.arange(4.0).reshape(2, 2).t(),
    ]  # non-contiguous: copied by value
    buffer = _BucketBuffer(grads)
    [flat] = buffer.pack(grads)
    assert flat.tolist() == [0, 1, 2, 3, 4, 5, 7, 0, 2, 1, 3]
    assert buffer.pack([g * 2 for g in grads])[0] is flat  # the same tensor every step
    assert flat.tolist() == [0, 2, 4, 6, 8, 10, 14, 0, 4, 2, 6]
    before = [g.data_ptr() for g in grads]
    flat.mul_(10)  # as a reduction in place would
    buffer.unpack_into(grads, flat)
    assert [g.data_ptr() for g in grads] == before
    assert grads[0].tolist() == [[0, 20, 40], [60, 80, 100]]
    assert grads[1].tolist() == [140]
    assert grads[2].tolist() == [[0, 40], [20, 60]]
    buffer.unpack_into(grads, torch.ones(11, dtype=torch.float16))  # a cast came back
    assert all(g.eq(1).all() for g in grads) and grads[0].dtype == torch.float32
    assert buffer.fits(grads) and not buffer.fits([g.double() for g in grads])


def test_a_bucket_buffer_leaves_large_gradients_where_they_are():
    from hvdlite.torch.reducers import PACK_BELOW_BYTES, _BucketBuffer

    large = PACK_BELOW_BYTES // 4  # float32 elements
    grads = [
        torch.ones(large),
        torch.full((3,), 2.0),
        torch.full((large + 1,), 3.0),
        torch.full((2,), 4.0),
    ]
    buffer = _BucketBuffer(grads)
    arrays = buffer.pack(grads)
    assert arrays[1] is grads[0] and arrays[2] is grads[2]  # reduced in place
    assert arrays[0].tolist() == [2, 2, 2, 4, 4]  # the small ones, packed
    arrays[0].mul_(10)
    buffer.unpack_into(grads, arrays[0])
    assert grads[1].tolist() == [20] * 3 and grads[3].tolist() == [40] * 2
    # A large gradient that is not contiguous any more needs a new buffer.
    assert not buffer.fits(
        [grads[0], grads[1], torch.ones(2, large)[:, : large // 2 + 1].t(), grads[3]]
    )
    # One small gradient alone is not packed either.
    lone = _BucketBuffer([torch.ones(large), torch.ones(3)])
    assert lone.flat is None and len(lone.pack([torch.ones(large), torch.ones(3)])) == 2


@pytest.mark.parametrize("wire", [torch.float16, torch.bfloat16])
def test_a_cast_bucket_casts_into_one_kept_tensor_and_widens_back_in_place(wire):
    from hvdlite.torch.reducers import _CastBucket

    g = torch.Generator().manual_seed(0)
    grads = [
        torch.randn(2, 3, generator=g),
        torch.randn(5000, generator=g),  # past PACK_BELOW_BYTES: cast in all the same
        torch.randn(4, 2, generator=g).t(),  # non-contiguous: cast by value
    ]
    bucket = _CastBucket(grads, wire)
    flat = bucket.pack(grads)
    assert flat.dtype == wire and flat.numel() == 6 + 5000 + 8
    assert torch.equal(flat, torch.cat([grad.reshape(-1).to(wire) for grad in grads]))
    assert bucket.pack([grad * 2 for grad in grads]) is flat  # the same tensor every step
    before = [grad.data_ptr() for grad in grads]
    bucket.unpack_into(grads)
    assert [grad.data_ptr() for grad in grads] == before  # widened in place
    for grad, piece in zip(grads, flat.split([6, 5000, 8])):
        assert grad.dtype == torch.float32
        assert torch.equal(grad.reshape(-1), piece.float())
    assert bucket.fits(grads)
    assert not bucket.fits([grad.double() for grad in grads])
    assert not bucket.fits([grads[0], grads[1][:10], grads[2]])  # other sizes
