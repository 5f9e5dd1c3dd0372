"""The sharded optimizer's element ownership without MPI: every class of
ELEMENTWISE_OPTIMIZERS, with the options that change its update, steps slices of
a parameter exactly as it steps the whole; buckets are deterministic and cover
every trainable element once."""

import pytest
import torch

from hvdlite.torch.shard_elements import (
    ELEMENTWISE_OPTIMIZERS,
    _copy_range,
    _read_range,
    element_buckets,
    is_elementwise,
)

optim = torch.optim
CASES = [
    (optim.SGD, {"lr": 0.1}),
    (optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1}),
    (optim.SGD, {"lr": 0.1, "momentum": 0.9, "dampening": 0.2, "maximize": True}),
    (optim.Adam, {"lr": 0.01, "weight_decay": 0.1}),
    (optim.Adam, {"lr": 0.01, "amsgrad": True}),
    (optim.AdamW, {"lr": 0.01, "amsgrad": True, "weight_decay": 0.05}),
    (optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.1}),
    (optim.Adadelta, {"lr": 1.0, "weight_decay": 0.1}),
    (optim.Adamax, {"lr": 0.01, "weight_decay": 0.1}),
    (optim.NAdam, {"lr": 0.01, "momentum_decay": 0.01}),
    (optim.NAdam, {"lr": 0.01, "decoupled_weight_decay": True, "weight_decay": 0.1}),
    (optim.RAdam, {"lr": 0.01, "decoupled_weight_decay": True, "weight_decay": 0.1}),
    (optim.RMSprop, {"lr": 0.01, "momentum": 0.9, "centered": True}),
    (optim.Rprop, {"lr": 0.01}),
    (optim.ASGD, {"lr": 0.01, "t0": 2, "weight_decay": 0.1}),
]


def test_every_listed_class_has_a_case():
    assert {cls for cls, _ in CASES} == set(ELEMENTWISE_OPTIMIZERS)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("cls,options", CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_stepping_slices_equals_stepping_the_whole(cls, options, foreach):
    torch.manual_seed(0)
    whole = torch.nn.Parameter(torch.randn(7, 5))
    parted = torch.nn.Parameter(whole.detach().clone())
    cuts = [(0, 9), (9, 10), (10, 35)]
    slices = [torch.nn.Parameter(parted.detach().view(-1)[a:b]) for a, b in cuts]
    ref = cls([whole], foreach=foreach, **options)
    opt = cls(slices, foreach=foreach, **options)
    for step in range(12):
        grad = torch.randn(7, 5, generator=torch.Generator().manual_seed(step))
        whole.grad = grad.clone()
        for (a, b), piece in zip(cuts, slices):
            piece.grad = grad.view(-1)[a:b].clone()
        ref.step()
        opt.step()
    torch.testing.assert_close(parted, whole, rtol=1e-6, atol=1e-7)  # slices update in place


def test_only_exact_listed_classes_on_contiguous_parameters():
    class Mine(torch.optim.SGD):
        pass

    p = torch.nn.Parameter(torch.randn(3, 4))
    assert is_elementwise(torch.optim.SGD([p], lr=0.1), [p])
    assert not is_elementwise(Mine([p], lr=0.1), [p])
    q = torch.nn.Parameter(torch.randn(4, 3).t())
    assert not is_elementwise(torch.optim.SGD([q], lr=0.1), [q])
    if hasattr(torch.optim, "Adafactor"):
        assert not is_elementwise(torch.optim.Adafactor([p]), [p])


def test_buckets_cover_trainable_parameters_once_last_first():
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (100, 3, 50, 0, 7, 200)]
    params[1].requires_grad_(False)
    params.append(torch.nn.Parameter(torch.zeros(5, dtype=torch.float64)))
    buckets = element_buckets(params, cap=4 * 60)
    assert sorted(i for b in buckets for i in b) == [0, 2, 4, 5, 6]
    assert all(b == sorted(b) for b in buckets)
    assert buckets[0] == [6] or 5 in buckets[0]  # the last parameters first
    assert all(len({params[i].dtype for i in b}) == 1 for b in buckets)
    assert element_buckets(params, cap=4 * 60) == buckets
    assert all(len(b) == 1 for b in element_buckets(params, cap=0))


def test_ranges_read_and_written_across_parameters():
    params = [torch.arange(4.0), torch.arange(10.0, 13.0), torch.arange(20.0, 22.0)]
    out = torch.empty(6)
    _read_range(out, 3, params)
    assert out.tolist() == [3.0, 10.0, 11.0, 12.0, 20.0, 21.0]
    out = torch.full((4,), 9.0)
    _read_range(out, 7, params)
    assert out.tolist() == [20.0, 21.0, 0.0, 0.0]  # padding past the end
    _copy_range(torch.tensor([-1.0, -2.0, -3.0]), 2, params)
    assert params[0].tolist() == [0.0, 1.0, -1.0, -2.0] and params[1][0] == -3.0
