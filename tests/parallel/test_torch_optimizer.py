"""DistributedOptimizer: parity with one process on the concatenated batch, and misuse.

Every rank also trains the single-process reference locally (on the whole
global batch), so each test compares the distributed weights with it.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torch_helpers import N, PAIR, R, batch, make_model, mine

import hvdlite
import hvdlite.torch as hvd

MPI_SIZES = (2, 3)


def train(make_opt, steps, wrap=None, micro=1, ranks=N, rank=R):
    """Train make_model(); wrap=None is the single-process reference on the
    concatenated batch, else wrap(opt, model) gives this rank's optimizer."""
    model = make_model()
    opt = make_opt(model.parameters())
    if wrap is not None:
        opt = wrap(opt, model)
    for step in range(steps):
        opt.zero_grad()
        for m in range(micro):
            x, y = batch(10 * step + m, ranks)
            if wrap is not None:
                x, y = mine(x, rank), mine(y, rank)
            F.mse_loss(model(x), y).backward()
        opt.step()
    return model, opt


def assert_same_weights(a, b, tol=1e-5):
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=tol, atol=tol, msg=name)


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def adam(params):
    return torch.optim.Adam(params, lr=0.01)


def dist(**kw):
    return lambda opt, model: hvd.DistributedOptimizer(
        opt, named_parameters=model.named_parameters(), **kw
    )


@pytest.mark.parametrize("make_opt", [sgd, adam])
def test_parity_with_concatenated_batch(make_opt):
    ref, _ = train(make_opt, 3)
    got, opt = train(make_opt, 3, dist())
    assert_same_weights(got, ref)
    assert isinstance(opt, type(make_opt(make_model().parameters())))
    assert type(opt).__name__ == make_opt(make_model().parameters()).__class__.__name__
    assert set(opt._parameter_names.values()) == {n for n, _ in got.named_parameters()}


def test_parity_without_names_and_with_predivide():
    ref, _ = train(sgd, 2)
    got, _ = train(sgd, 2, lambda opt, model: hvd.DistributedOptimizer(opt))
    assert_same_weights(got, ref)
    got, _ = train(sgd, 2, dist(gradient_predivide_factor=2.0))
    assert_same_weights(got, ref)


@pytest.mark.parametrize("groups", [2, "lists"])
def test_parity_with_groups(groups):
    ref, _ = train(sgd, 2)
    if groups == "lists":

        def wrap(opt, model):
            return hvd.DistributedOptimizer(
                opt,
                named_parameters=model.named_parameters(),
                groups=[[model[0].weight, model[2].bias]],
            )
    else:
        wrap = dist(groups=groups)
    got, _ = train(sgd, 2, wrap)
    assert_same_weights(got, ref)


def test_num_groups_is_deprecated_spelling():
    ref, _ = train(sgd, 1)
    with pytest.warns(DeprecationWarning):
        got, _ = train(sgd, 1, dist(num_groups=3))
    assert_same_weights(got, ref)


@pytest.mark.parametrize("compression,tol", [("fp16", 2e-3), ("bf16", 2e-2)])
def test_compression_close_to_reference(compression, tol):
    ref, _ = train(sgd, 2)
    got, _ = train(sgd, 2, dist(compression=getattr(hvd.Compression, compression)))
    assert_same_weights(got, ref, tol)


def test_backward_passes_per_step_equals_accumulating_by_hand(overlap):
    ref, _ = train(sgd, 2, micro=2)  # two backward passes summed, then one step
    got, _ = train(sgd, 2, dist(backward_passes_per_step=2), micro=2)
    assert_same_weights(got, ref)

    def wrap(opt, model):
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        opt.set_backward_passes_per_step(2)
        return opt

    got, _ = train(sgd, 2, wrap, micro=2)
    assert_same_weights(got, ref)


def test_op_sum_and_synchronize_then_clip():
    model = make_model()
    opt = hvd.DistributedOptimizer(
        sgd(model.parameters()), op=hvd.Sum, named_parameters=model.named_parameters()
    )
    x, y = batch(0)
    F.mse_loss(model(mine(x)), mine(y)).backward()
    opt.synchronize()
    ref = make_model()
    for r in range(N):
        F.mse_loss(ref(mine(x, r)), mine(y, r)).backward()  # grads summed over ranks
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    with opt.skip_synchronize():
        opt.step()
    # step() right after synchronize() without skip_synchronize() warns, as in Horovod
    opt.zero_grad()
    F.mse_loss(model(mine(x)), mine(y)).backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()


def test_parameter_unused_on_some_ranks(overlap):
    torch.manual_seed(1)
    model = nn.ModuleDict({"a": nn.Linear(3, 1), "b": nn.Linear(3, 1)})
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    x = torch.ones(2, 3)
    loss = model["a"](x).sum() + (model["b"](x).sum() if R == 0 else 0)
    loss.backward()
    opt.synchronize()
    assert torch.allclose(model["a"].weight.grad, torch.full((1, 3), 2.0))
    assert torch.allclose(model["b"].weight.grad, torch.full((1, 3), 2.0 / N))
    with opt.skip_synchronize():
        opt.step()


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_embedding_gradients(sparse_as_dense):
    def run(distributed):
        torch.manual_seed(2)
        emb = nn.Embedding(10, 3, sparse=True)
        opt = torch.optim.SGD(emb.parameters(), lr=0.5)
        if distributed:
            opt = hvd.DistributedOptimizer(
                opt, named_parameters=emb.named_parameters(), sparse_as_dense=sparse_as_dense
            )
        for step in range(2):
            ids = torch.arange(N * 2).view(N, 2) * (step + 1) % 10
            opt.zero_grad()
            if distributed:
                emb(ids[R]).pow(2).sum().backward()
            else:
                (emb(ids).pow(2).sum() / N).backward()
            opt.step()
        return emb.weight.detach()

    torch.testing.assert_close(run(True), run(False), rtol=1e-5, atol=1e-6)


def test_process_set_subset():
    if R < 2:  # rank 2 takes no part
        ref, _ = train(sgd, 2, ranks=2)
        got, _ = train(sgd, 2, dist(process_set=PAIR), ranks=2)
        assert_same_weights(got, ref)
    hvd.barrier()


# op=Adasum (the delta-optimizer scheme) is tested in test_torch_compression.py.


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step")
def test_state_dict_round_trip_and_scheduler():
    ref, _ = train(adam, 3)
    model, opt = train(adam, 2, dist())
    saved = opt.state_dict()
    plain = adam(model.parameters())
    plain.load_state_dict(saved)  # a distributed checkpoint loads into a plain optimizer
    base = adam(model.parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(base, step_size=100)  # patches base.step
    opt2 = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    opt2.load_state_dict(plain.state_dict())
    del opt  # its hooks on the same parameters become no-ops
    x, y = batch(20)
    opt2.zero_grad()
    F.mse_loss(model(mine(x)), mine(y)).backward()
    opt2.step()
    scheduler.step()
    assert_same_weights(model, ref)


def test_top_level_dispatch():
    model = make_model()
    opt = hvdlite.DistributedOptimizer(
        sgd(model.parameters()), named_parameters=model.named_parameters()
    )
    assert isinstance(opt, torch.optim.SGD) and hasattr(opt, "synchronize")
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        hvdlite.DistributedOptimizer(object())


# ------------------------------------------------------------------- misuse


def test_named_parameters_errors():
    model = make_model()
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="unique"):
        hvd.DistributedOptimizer(
            sgd(model.parameters()), named_parameters=[("w", p) for _, p in named]
        )
    with pytest.raises(ValueError, match="not named"):
        hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=named[:2])
    with pytest.raises(ValueError, match="tuples"):
        hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=[p for _, p in named])
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(sgd(model.parameters()), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="op != Average"):
        hvd.DistributedOptimizer(sgd(model.parameters()), op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="once"):
        hvd.DistributedOptimizer(sgd(model.parameters()), groups=[[named[0][1]], [named[0][1]]])
    with pytest.raises(ValueError, match="torch.Tensor"):
        hvd.DistributedOptimizer(sgd(model.parameters()), groups=[["w"]])
    with pytest.raises(TypeError):
        hvd.DistributedOptimizer(model)
    opt = hvd.DistributedOptimizer(sgd(model.parameters()))
    with pytest.raises(ValueError, match="already"):
        hvd.DistributedOptimizer(opt)


def test_wrapping_one_optimizer_twice_is_refused_naming_it():
    model = make_model()
    base = sgd(model.parameters())
    first = hvdlite.DistributedOptimizer(base, named_parameters=model.named_parameters())
    with pytest.raises(ValueError, match="already wrapped by another") as info:
        hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    assert "use only the optimizer that call returned" in str(info.value)
    del first  # once the first wrapper is gone, the optimizer may be wrapped again
    again = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    x, y = batch(0)
    F.mse_loss(model(mine(x)), mine(y)).backward()
    again.step()


def test_a_step_that_bypasses_the_wrapper_is_refused(overlap):
    model = make_model()
    base = sgd(model.parameters())
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    before = [p.detach().clone() for p in model.parameters()]
    x, y = batch(0)
    F.mse_loss(model(mine(x)), mine(y)).backward()
    with pytest.raises(RuntimeError, match="not on the optimizer it returned") as info:
        base.step()
    assert "were not averaged" in str(info.value)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))  # no update
    opt.step()  # the wrapper still works, and the local step before any backward too
    opt.zero_grad()
    base.step()


def test_zero_grad_between_backward_and_step_raises(overlap):
    model = make_model()
    opt = hvd.DistributedOptimizer(
        sgd(model.parameters()), named_parameters=model.named_parameters()
    )
    x, y = batch(0)
    F.mse_loss(model(mine(x)), mine(y)).backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    opt.step()
    opt.zero_grad()  # fine after step


def test_too_many_backward_passes_raises(overlap):
    model = make_model()
    opt = hvd.DistributedOptimizer(
        sgd(model.parameters()), named_parameters=model.named_parameters()
    )
    x, y = batch(0)
    F.mse_loss(model(mine(x)), mine(y)).backward()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        F.mse_loss(model(mine(x)), mine(y)).backward()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt.synchronize()  # drain what the first pass started


def test_gradients_that_require_grad_are_refused(overlap):
    model = make_model()
    opt = hvd.DistributedOptimizer(
        sgd(model.parameters()), named_parameters=model.named_parameters()
    )
    x, y = batch(0)
    with pytest.raises(AssertionError, match="create_graph"):
        F.mse_loss(model(mine(x)), mine(y)).backward(create_graph=True)
        opt.step()
    for p in model.parameters():  # a leaf's grad that requires grad keeps it alive
        p.grad = None


@pytest.mark.parametrize("params_on", ["cpu", "meta"])
def test_hooks_start_reductions_in_backward_only_where_a_rank_overlaps(overlap, params_on):
    # Without a core for any engine thread, the default allreduce of CPU gradients
    # starts at synchronize(): the hooks only count.  Otherwise (or for gradients
    # on another device) each bucket starts from the hook of its last gradient.
    from hvdlite.torch.optimizer import _hooks_start_work
    from hvdlite.torch.reducers import AllreduceReducer

    if params_on == "meta":  # the choice itself, for parameters on another device
        meta = [{"params": [torch.empty(2, device="meta")]}]
        assert _hooks_start_work(AllreduceReducer(), meta)
        return
    model = make_model()
    opt = hvd.DistributedOptimizer(
        sgd(model.parameters()), named_parameters=model.named_parameters()
    )
    x, y = batch(0)
    F.mse_loss(model(mine(x)), mine(y)).backward()
    started = len(opt._reducer._in_flight)
    assert opt._allreduce_delay == {p: 0 for p in model.parameters()}
    opt.step()
    assert started == (1 if overlap == "on" else 0)  # the model is one bucket
    assert opt._allreduce_delay == {p: 1 for p in model.parameters()}


def test_step_hooks_run_once_and_see_averaged_gradients():
    model = make_model()
    opt = hvd.DistributedOptimizer(
        sgd(model.parameters()), named_parameters=model.named_parameters()
    )
    seen = []
    opt.register_step_pre_hook(lambda o, args, kw: seen.append(model[2].bias.grad.clone()))
    opt.register_step_post_hook(lambda o, args, kw: seen.append("post"))
    x, y = batch(0)
    for _ in range(2):
        opt.zero_grad()
        F.mse_loss(model(mine(x)), mine(y)).backward()
        opt.step()
        opt.load_state_dict(opt.state_dict())  # re-patching must not double the hooks
    assert len(seen) == 4 and seen[1] == seen[3] == "post"
    assert all(torch.equal(t, seen[0]) for t in hvd.allgather_object(seen[0]))
