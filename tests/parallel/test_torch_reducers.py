"""DistributedOptimizer(reducer=...): a user's reducer is used and matches plain
allreduce, Horovod's arguments pick the built-in reducers as before, and
arguments that conflict with a reducer are refused.

On one rank the optimizer calls no reducer (there is nothing to reduce), so the
call counts below depend on the world size; the trained weights never do.
"""

from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from torch_helpers import N, PAIR, batch, make_model, mine

import hvdlite.torch as hvd

MPI_SIZES = (1, 2, 3)

pytestmark = pytest.mark.timeout(120)

CALLED = N > 1  # whether the optimizer hands anything to its reducer


class SumThenDivide(hvd.GradientReducer):
    """The smallest useful reducer: everything at synchronize()."""

    def synchronize(self, ctx):
        named = ctx.named_gradients()
        grads = [grad for _, grad in named]
        hvd.grouped_allreduce_(
            grads,
            name=f"test.sum_then_divide.{named[0][0]}",
            op=hvd.Sum,
            process_set=ctx.process_set,
        )
        for grad in grads:
            grad.div_(ctx.process_set.size())
        self.bytes_sent_last_step = sum(grad.nbytes for grad in grads)


class Recording(SumThenDivide):
    """SumThenDivide that records every call and keeps a count as its state."""

    def __init__(self):
        self.ready = []
        self.synchronized = 0
        self.steps = 0

    def gradient_ready(self, ctx, key):
        self.ready.append(key)

    def synchronize(self, ctx):
        self.synchronized += 1
        super().synchronize(ctx)

    def step(self, ctx, base_step, closure=None):
        self.steps += 1
        return super().step(ctx, base_step, closure)

    def state_dict(self):
        return {"synchronized": self.synchronized}

    def load_state_dict(self, state):
        self.synchronized = state["synchronized"]


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def wrap(model, **kw):
    return hvd.DistributedOptimizer(
        sgd(model.parameters()), named_parameters=model.named_parameters(), **kw
    )


def train(model, opt, steps, micro=1, ranks=N):
    for step in range(steps):
        opt.zero_grad()
        for m in range(micro):
            x, y = batch(10 * step + m, ranks)
            F.mse_loss(model(mine(x)), mine(y)).backward()
        opt.step()
    return model


def train_with_plain_allreduce(steps):
    """The reference: each rank's gradients averaged by hvd.allreduce, then a plain step."""
    model = make_model()
    opt = sgd(model.parameters())
    for step in range(steps):
        x, y = batch(10 * step)
        opt.zero_grad()
        F.mse_loss(model(mine(x)), mine(y)).backward()
        for name, p in model.named_parameters():
            p.grad = hvd.allreduce(p.grad, name=f"test.reference.{name}", op=hvd.Average)
        opt.step()
    return model


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# ------------------------------------------------------------ a user's reducer


def test_custom_reducer_matches_plain_allreduce_and_default(overlap):
    model = make_model()
    reducer = Recording()
    opt = wrap(model, reducer=reducer)
    assert opt._reducer is reducer
    train(model, opt, 3)
    ref = train_with_plain_allreduce(3)
    torch.testing.assert_close(flat(model), flat(ref), rtol=1e-6, atol=1e-6)
    default = make_model()
    train(default, wrap(default), 3)
    torch.testing.assert_close(flat(model), flat(default), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(flat(model), flat(make_model()))  # it did train

    names = {p: n for n, p in model.named_parameters()}
    calls = 3 if CALLED else 0
    assert (reducer.synchronized, reducer.steps) == (calls, calls)
    assert Counter(names[p] for p in reducer.ready) == Counter(
        {n: calls for n in names.values()} if CALLED else {}
    )
    assert opt.bytes_sent_last_step == (75 * 4 if CALLED else 0)  # 75 float32 values


def test_minimal_reducer_with_groups_accumulation_and_closure():
    model = make_model()
    reducer = SumThenDivide()
    groups = [[model[0].weight, model[2].bias]]
    opt = wrap(model, reducer=reducer, groups=groups, backward_passes_per_step=2)
    train(model, opt, 2, micro=2)
    default = make_model()
    train(
        default,
        wrap(default, groups=[[default[0].weight, default[2].bias]], backward_passes_per_step=2),
        2,
        micro=2,
    )
    torch.testing.assert_close(flat(model), flat(default), rtol=1e-6, atol=1e-6)

    recording = Recording()
    opt = wrap(model, reducer=recording, groups=[[model[0].weight, model[2].bias]])
    x, y = batch(50)

    def closure():
        opt.zero_grad()
        loss = F.mse_loss(model(mine(x)), mine(y))
        loss.backward()
        return loss

    loss = closure()
    assert torch.equal(opt.step(closure=lambda: loss), loss)  # the closure's result comes back
    if CALLED:  # the group arrives as one tuple key, the others one by one
        assert sorted(len(k) if isinstance(k, tuple) else 1 for k in recording.ready) == [1, 1, 2]


def test_custom_reducer_state_travels_with_the_optimizer_state():
    model = make_model()
    opt = wrap(model, reducer=Recording())
    train(model, opt, 2)
    saved = opt.state_dict()
    assert saved["hvdlite_compression"] == {"synchronized": 2 if CALLED else 0}
    again = Recording()
    again.synchronized = -1
    wrap(model, reducer=again).load_state_dict(saved)
    assert again.synchronized == saved["hvdlite_compression"]["synchronized"]
    sgd(model.parameters()).load_state_dict(saved)  # a plain optimizer ignores the key
    assert "hvdlite_compression" not in wrap(model, reducer=SumThenDivide()).state_dict()


# ------------------------------------------------------------------ built-ins


def test_builtin_reducers_are_picked_from_horovods_arguments():
    model = make_model()
    plain = wrap(model)._reducer
    assert type(plain) is hvd.AllreduceReducer and plain.op == hvd.Average
    cast = wrap(model, op=hvd.Sum, compression=hvd.Compression.fp16, sparse_as_dense=True)._reducer
    assert (type(cast), cast.op, cast.compression, cast.sparse_as_dense) == (
        hvd.AllreduceReducer,
        hvd.Sum,
        hvd.Compression.fp16,
        True,
    )
    assert wrap(model, gradient_predivide_factor=2.0)._reducer.gradient_predivide_factor == 2.0
    topk = hvd.Compression.topk(0.2)
    stateful = wrap(model, compression=topk)._reducer
    assert type(stateful) is hvd.CompressorReducer and stateful.compressor is topk
    adasum = wrap(model, op=hvd.Adasum, process_set=PAIR)._reducer
    assert type(adasum) is hvd.AdasumReducer


@pytest.mark.parametrize(
    "arguments,make_reducer",
    [
        (lambda: {"op": hvd.Sum}, lambda: hvd.AllreduceReducer(op=hvd.Sum)),
        (
            lambda: {"compression": hvd.Compression.fp16, "gradient_predivide_factor": 2.0},
            lambda: hvd.AllreduceReducer(
                compression=hvd.Compression.fp16, gradient_predivide_factor=2.0
            ),
        ),
        (
            lambda: {"compression": hvd.Compression.topk(0.3)},
            lambda: hvd.CompressorReducer(hvd.Compression.topk(0.3)),
        ),
        (
            lambda: {"compression": hvd.Compression.powersgd(rank=1, start_step=1)},
            lambda: hvd.CompressorReducer(hvd.Compression.powersgd(rank=1, start_step=1)),
        ),
    ],
    ids=["sum", "fp16-predivide", "topk", "powersgd"],
)
def test_builtin_reducer_passed_explicitly_equals_the_arguments(arguments, make_reducer):
    by_arguments = make_model()
    opt = wrap(by_arguments, **arguments())
    train(by_arguments, opt, 3)
    explicit = make_model()
    opt2 = wrap(explicit, reducer=make_reducer())
    train(explicit, opt2, 3)
    assert torch.equal(flat(explicit), flat(by_arguments))
    assert opt2.bytes_sent_last_step == opt.bytes_sent_last_step


def test_adasum_reducer_passed_explicitly_equals_op_adasum():
    ranks = PAIR.size()  # at 3 ranks: on ranks 0 and 1 (Adasum needs 2**k ranks)
    if PAIR.included():
        by_op = make_model()
        train(by_op, wrap(by_op, op=hvd.Adasum, process_set=PAIR), 2, ranks=ranks)
        explicit = make_model()
        opt = wrap(explicit, reducer=hvd.AdasumReducer(), process_set=PAIR)
        train(explicit, opt, 2, ranks=ranks)
        assert torch.equal(flat(explicit), flat(by_op))
        assert opt.bytes_sent_last_step == (75 * 4 if CALLED else 0)
    hvd.barrier()


# ---------------------------------------------------------------------- misuse


def test_conflicting_arguments_are_refused():
    model = make_model()
    with pytest.raises(ValueError, match=r"compression=Compression.fp16.*reducer=None"):
        wrap(model, reducer=SumThenDivide(), compression=hvd.Compression.fp16)
    with pytest.raises(ValueError, match=r"combined with op=Adasum.*AdasumReducer\(\)"):
        wrap(model, reducer=SumThenDivide(), op=hvd.Adasum, process_set=PAIR)
    with pytest.raises(ValueError, match=r"compression=Compression.topk\(0.1\)"):
        wrap(model, reducer=hvd.AllreduceReducer(), compression=hvd.Compression.topk(0.1))
    with pytest.raises(ValueError, match="gradient_predivide_factor=2.0"):
        wrap(model, reducer=SumThenDivide(), gradient_predivide_factor=2.0)
    with pytest.raises(TypeError, match="GradientReducer"):
        wrap(model, reducer=object())
    with pytest.raises(TypeError, match="positional"):  # reducer is keyword-only
        hvd.DistributedOptimizer(
            sgd(model.parameters()),
            None,
            hvd.Compression.none,
            1,
            hvd.Average,
            1.0,
            0,
            None,
            False,
            hvd.global_process_set,
            SumThenDivide(),
        )


@pytest.mark.skipif(N & (N - 1) == 0, reason="only non-power-of-two sizes are refused")
def test_explicit_adasum_reducer_refuses_non_power_of_two():
    with pytest.raises(ValueError, match=r"power-of-two.*has 3"):
        wrap(make_model(), reducer=hvd.AdasumReducer())
