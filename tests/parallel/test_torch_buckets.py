"""Gradient buckets: the default DistributedOptimizer reduces buckets of
gradients, one grouped allreduce each, with the same results as one allreduce
per gradient (Horovod's way, ``bucket_cap_mb=0``)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torch_helpers import N, PAIR, R

import hvdlite.collectives
import hvdlite.torch as hvd
from hvdlite.torch import buckets

MPI_SIZES = (2, 3)
SPARSE = 2  # engine submissions of one sparse allreduce (values and indices gathered)


def model_with_embedding():
    torch.manual_seed(3)
    return nn.ModuleDict(
        {
            "emb": nn.Embedding(20, 6, sparse=True),
            "body": nn.Sequential(
                nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)
            ),
            "unused": nn.Linear(4, 4),  # never in the graph: its gradient stays None
        }
    )


def run(steps=3, **kw):
    """Train on this rank's rows; return the weights and the engine submissions per step."""
    model = model_with_embedding()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(),
        **kw,
    )
    submissions = []
    real_submit = hvdlite.collectives._submit

    def counting_submit(*args, **kwargs):
        submissions[-1] += 1
        return real_submit(*args, **kwargs)

    hvdlite.collectives._submit = counting_submit
    try:
        for step in range(steps):
            g = torch.Generator().manual_seed(step)
            ids = torch.randint(0, 20, (N, 5), generator=g)
            y = torch.randn(N, 5, 4, generator=g)
            submissions.append(0)
            opt.zero_grad()
            out = model["body"](model["emb"](ids[R]))
            F.mse_loss(out, y[R]).backward()
            opt.step()
    finally:
        hvdlite.collectives._submit = real_submit
    return [p.detach().clone() for p in model.parameters()], submissions


@pytest.mark.parametrize("compression", [hvd.Compression.none, hvd.Compression.fp16])
def test_buckets_give_the_results_of_one_allreduce_per_gradient(compression):
    per_tensor, per_tensor_calls = run(bucket_cap_mb=0, compression=compression)
    bucketed, bucketed_calls = run(compression=compression)
    for a, b in zip(per_tensor, bucketed, strict=True):
        assert torch.equal(a, b)
    # 9 gradients: the embedding's sparse one keeps its own exchange (SPARSE
    # submissions), the 8 dense ones (the unused layer's zeros too) go in one bucket
    assert per_tensor_calls == [SPARSE + 8] * 3
    assert bucketed_calls == [SPARSE + 1] * 3


def test_small_cap_cuts_several_buckets_last_layer_first():
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 64))
    cap = 64 * 65 * 4 + 1  # one layer's weight and bias fit, two do not
    got = buckets.build_buckets(list(model.parameters()), cap)
    params = list(model.parameters())
    assert got == [(params[5], params[4]), (params[3], params[2]), (params[1], params[0])]
    weights, calls = run(bucket_cap_mb=cap / (1 << 20))
    ref, _ = run(bucket_cap_mb=0)
    for a, b in zip(weights, ref, strict=True):
        assert torch.equal(a, b)


def test_first_bucket_is_small_only_where_hooks_start_reductions(overlap):
    """Buckets for overlap keep the last layers' gradients apart (a small first
    bucket starts early); where the hooks only count, every gradient up to the
    cap goes in one bucket: one collective per step, the same weights."""

    def train(**kw):
        torch.manual_seed(5)
        model = nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 8), nn.Linear(8, 8))
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters(),
            **kw,
        )
        keys = list(opt._reduction.keys)
        for step in range(2):
            x = torch.randn(N, 512, generator=torch.Generator().manual_seed(step))
            opt.zero_grad()
            model(x[R : R + 1]).square().sum().backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()], keys

    bucketed, keys = train()
    reference, _ = train(bucket_cap_mb=0)
    for a, b in zip(bucketed, reference, strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)
    assert 512 * 512 * 4 == buckets.FIRST_BUCKET_BYTES  # the first weight
    if overlap == "on":  # the 1 MB weight does not fit the first bucket: reduced alone
        assert [len(k) if isinstance(k, tuple) else 1 for k in keys] == [1, 5]
    else:
        assert [len(k) for k in keys] == [6]


def test_groups_argument_keeps_its_meaning():
    _, calls = run(groups=2)
    assert calls == [SPARSE + 2] * 3  # the sparse one alone, the dense rest of 2 groups


def test_bad_bucket_cap_is_a_clear_error():
    model = nn.Linear(2, 2)
    for bad in (-1, float("nan"), "25", True):
        with pytest.raises(ValueError, match="bucket_cap_mb must be a finite number"):
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), bucket_cap_mb=bad)


def restart():
    hvd.shutdown()
    hvd.init(process_sets=[PAIR] if N > 2 else None)  # as torch_helpers does


def test_the_knob_sets_the_default_cap(monkeypatch):
    monkeypatch.setenv("HVDLITE_BUCKET_CAP_MB", "0")
    restart()
    try:
        _, calls = run()
        assert calls == [SPARSE + 8] * 3
    finally:
        monkeypatch.delenv("HVDLITE_BUCKET_CAP_MB")
        restart()


def engine_arrays(fn):
    """Run *fn*; the number of arrays each engine submission carried."""
    arrays = []
    real_submit = hvdlite.collectives._submit

    def counting_submit(st, params, inputs, *args, **kwargs):
        arrays.append(len(inputs))
        return real_submit(st, params, inputs, *args, **kwargs)

    hvdlite.collectives._submit = counting_submit
    try:
        fn()
    finally:
        hvdlite.collectives._submit = real_submit
    return arrays


def test_a_dense_bucket_travels_as_one_flat_array():
    arrays = engine_arrays(lambda: run(steps=1))
    # the sparse embedding: values and indices; the 8 dense gradients: one flat array
    assert sorted(arrays) == [1, 1, 1]


@pytest.mark.parametrize(
    "kw",
    [
        dict(compression=hvd.Compression.bf16),
        dict(gradient_predivide_factor=2.0),
        dict(op=hvd.Sum),
        dict(backward_passes_per_step=2),
    ],
)
def test_flat_buckets_give_the_results_of_one_allreduce_per_gradient(kw):
    per_tensor, _ = run(bucket_cap_mb=0, **kw)
    bucketed, _ = run(**kw)
    for a, b in zip(per_tensor, bucketed, strict=True):
        assert torch.equal(a, b)


def trained(model, opt, backward, steps=2):
    """Train *steps* steps (``backward(generator)`` computes this rank's
    gradients); the weights, and the arrays of each engine submission."""

    def run_steps():
        for step in range(steps):
            opt.zero_grad()
            backward(torch.Generator().manual_seed(10 * step + R))
            opt.step()

    arrays = engine_arrays(run_steps)
    return [p.detach().clone() for p in model.parameters()], arrays


def same_weights_as_per_tensor(train):
    """Run ``train(**kw) -> (weights, arrays)`` with one allreduce per gradient and
    with buckets; assert equal weights; return the bucketed run's arrays."""
    per_tensor, _ = train(bucket_cap_mb=0)
    bucketed, arrays = train()
    for a, b in zip(per_tensor, bucketed, strict=True):
        assert torch.equal(a, b)
    return arrays


def test_a_bucket_of_mixed_dtypes_goes_grouped_with_the_same_results():
    def train(**kw):
        torch.manual_seed(5)
        model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3).double())
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters(),
            **kw,
        )

        def step(g):
            x = torch.randn(4, 6, generator=g)
            model[2](model[1](model[0](x)).double()).pow(2).sum().backward()

        return trained(model, opt, step)

    arrays = same_weights_as_per_tensor(train)
    assert arrays == [4, 4]  # one grouped submission of the 4 gradients per step


def test_a_dense_bucket_packs_into_the_same_buffer_every_step():
    # The flat tensor of a bucket is kept from step to step (no tensor made per
    # step); gradients of another dtype get a new one, with the right results.
    def train(**kw):
        torch.manual_seed(6)
        model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
            named_parameters=model.named_parameters(),
            **kw,
        )
        buffers = []
        real_submit = hvdlite.collectives._submit

        def recording_submit(st, params, inputs, *args, **kwargs):
            buffers.append((inputs[0].__array_interface__["data"][0], inputs[0].dtype))
            return real_submit(st, params, inputs, *args, **kwargs)

        hvdlite.collectives._submit = recording_submit
        try:
            for step in range(4):
                if step == 2:
                    model.double()  # the same parameters, now float64
                g = torch.Generator().manual_seed(10 * step + R)
                x = torch.randn(4, 6, generator=g, dtype=next(model.parameters()).dtype)
                opt.zero_grad()
                model(x).pow(2).sum().backward()
                opt.step()
        finally:
            hvdlite.collectives._submit = real_submit
        return [p.detach().clone() for p in model.parameters()], buffers

    per_tensor, _ = train(bucket_cap_mb=0)
    bucketed, buffers = train()
    for a, b in zip(per_tensor, bucketed, strict=True):
        assert torch.equal(a, b)
    assert len(buffers) == 4  # one flat array per step
    assert buffers[0] == buffers[1] and buffers[2] == buffers[3]
    assert [dtype.name for _, dtype in buffers] == ["float32"] * 2 + ["float64"] * 2


def model_with_a_large_weight(compression, submitted=None, optimizers=None):
    """A model whose 38 KB weight is past PACK_BELOW_BYTES, and its training
    (``train(**kw) -> (weights, arrays)``); *submitted* collects the first input
    of each engine submission, *optimizers* each DistributedOptimizer made."""

    def train(**kw):
        torch.manual_seed(7)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 600))
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters(),
            compression=compression,
            **kw,
        )
        if optimizers is not None:
            optimizers.append(opt)

        def step(g):
            model(torch.randn(4, 8, generator=g)).pow(2).sum().backward()

        real_submit = hvdlite.collectives._submit

        def recording_submit(st, params, inputs, *args, **kwargs):
            if submitted is not None:
                submitted.append(inputs[0])
            return real_submit(st, params, inputs, *args, **kwargs)

        hvdlite.collectives._submit = recording_submit
        try:
            return trained(model, opt, step)
        finally:
            hvdlite.collectives._submit = real_submit

    return train


def test_a_large_gradient_of_a_bucket_is_reduced_where_it_is():
    # The 38 KB weight travels as its own array beside the packed small ones, in
    # one grouped allreduce, with the results of one allreduce per gradient.
    arrays = same_weights_as_per_tensor(model_with_a_large_weight(hvd.Compression.none))
    assert arrays == [2, 2]  # per step: the 3 small gradients packed, the weight apart


@pytest.mark.parametrize("compression", [hvd.Compression.fp16, hvd.Compression.bf16])
def test_under_a_16_bit_cast_a_bucket_is_one_flat_tensor_of_the_wire_dtype(compression):
    # The cast is the packing: large and small gradients alike are cast into one
    # flat tensor of the wire dtype, kept by the reducer, with the results of
    # casting and reducing each gradient alone.
    submitted, optimizers = [], []
    train = model_with_a_large_weight(compression, submitted, optimizers)
    arrays = same_weights_as_per_tensor(train)
    assert arrays == [1, 1]
    # (the engine is handed a float32 copy where the set is on one node, as here)
    bucketed = submitted[-2:]  # same_weights_as_per_tensor trains per tensor first
    assert bucketed[0].size == 8 * 16 + 16 + 16 * 600 + 600
    [bucket] = optimizers[-1]._reducer._buffers.values()
    assert bucket.flat.dtype == compression.wire_dtype
    assert bucket.flat.numel() == bucketed[0].size
