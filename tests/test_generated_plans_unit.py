"""The model behind the generated-collectives tests (tests/parallel/generated_plans.py),
checked on hand-made cases without MPI: what each rank must get, and which error."""

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent / "parallel"))

import generated_plans as gp  # noqa: E402

SETS3 = gp.process_sets(3)


def call(ident=0, kind="allreduce", **kw):
    c = {
        "id": ident,
        "kind": kind,
        "grouped": False,
        "inplace": False,
        "mode": "sync",
        "set": 0,
        "name": None,
        "seed": 7,
        "inject": None,
        "tensors": [{"dtype": "int32", "shape": [4], "layout": "c"}],
    }
    if gp.is_reduction(kind):
        c.update(op="sum", pre=1.0, post=1.0)
    c.update(kw)
    return c


def expect(c, sets=SETS3, joined=frozenset()):
    members = sets[c["set"]]
    by_rank = {r: [x] for r in members if r not in joined and (x := gp.localize(c, r))}
    return gp.expect_calls(by_rank, sets, joined)


def test_integer_average_is_scaled_in_float64_and_truncated():
    parts = [np.array([1.0, -1.0, 5.0]), np.array([1.0, -1.0, 5.0]), np.array([0.0, 0.0, 1.0])]
    out = gp.reduce(parts, "int32", "average", 1.0, 1.0, 3)
    np.testing.assert_array_equal(out, [0.0, 0.0, 3.0])  # 2/3 -> 0, -2/3 -> 0, 11/3 -> 3
    out = gp.reduce(parts, "int32", "sum", 0.5, 1.0, 3)  # prescale truncates each input
    np.testing.assert_array_equal(out, [0.0, 0.0, 4.0])


def test_a_matching_sum_is_the_sum_of_every_ranks_values():
    c = call()
    got = expect(c)
    total = sum(gp.values(c, 0, r, "int32", (4,)) for r in range(3))
    for r in range(3):
        outcome, ref = got[(r, 0)]
        assert outcome == gp.OK
        np.testing.assert_array_equal(ref[0], total)


@pytest.mark.parametrize(
    "inject,outcome",
    [
        ({"what": "shape", "rank": 1, "shape": [5]}, gp.MISMATCH),
        ({"what": "dtype", "rank": 2, "dtype": "float32"}, gp.MISMATCH),
        ({"what": "op", "rank": 0, "value": "max"}, gp.MISMATCH),
        ({"what": "post", "rank": 1, "value": 2.0}, gp.MISMATCH),
    ],
)
def test_a_disagreement_fails_on_every_rank(inject, outcome):
    got = expect(call(inject=inject))
    assert {got[(r, 0)][0] for r in range(3)} == {outcome}


def test_a_skip_fails_the_others_and_a_bad_argument_only_its_rank():
    got = expect(call(name="x", inject={"what": "skip", "rank": 1}))
    assert (1, 0) not in got and got[(0, 0)][0] == got[(2, 0)][0] == gp.INTERNAL
    bad = call(name="x", tensors=[{"dtype": "bool", "shape": [2], "layout": "c"}], op="max")
    bad["inject"] = {"what": "op", "rank": 2, "value": "sum"}  # bool cannot be summed
    got = expect(bad)
    assert got[(2, 0)][0] == gp.ARGUMENT and got[(0, 0)][0] == gp.INTERNAL


def test_unnamed_calls_pair_by_their_position_on_each_rank():
    a, b = call(0), call(1)
    by_rank = {0: [a, b], 1: [b, a]}
    got = gp.expect_calls(by_rank, gp.process_sets(2))
    both = [gp.values(a, 0, 0, "int32", (4,)) + gp.values(b, 0, 1, "int32", (4,))]
    np.testing.assert_array_equal(got[(0, 0)][1][0], both[0])  # rank 0's a met rank 1's b
    np.testing.assert_array_equal(got[(1, 1)][1][0], both[0])


def test_a_joined_rank_adds_zeros_and_fails_other_kinds():
    c = call(name="j", op="product")
    got = expect(c, joined=frozenset({2}))
    assert (2, 0) not in got and not got[(0, 0)][1][0].any()
    got = expect(call(name="j", kind="broadcast", root=0), joined=frozenset({2}))
    assert got[(0, 0)][0] == got[(1, 0)][0] == gp.MISMATCH


def test_alltoall_and_reducescatter_split_rows_as_documented():
    c = call(kind="alltoall", set=1, tensors=[{"dtype": "int8", "shape": [3], "layout": "c"}])
    c["tensors"][0]["rows"] = {"0": 3, "1": 1}
    c["splits"] = {"0": [1, 2], "1": [0, 1]}
    got = expect(c)
    x0, x1 = (gp.values(c, 0, r, "int8", (n,)) for r, n in ((0, 3), (1, 1)))
    np.testing.assert_array_equal(got[(1, 0)][1][0], np.concatenate([x0[1:], x1]))
    assert list(got[(1, 0)][1][1]) == [2, 1] and list(got[(0, 0)][1][1]) == [1, 0]
    rs = call(kind="reducescatter", tensors=[{"dtype": "int16", "shape": [4, 2], "layout": "c"}])
    got = expect(rs)
    assert [got[(r, 0)][1][0].shape[0] for r in range(3)] == [2, 1, 1]


def test_adasum_keeps_identical_vectors_once_and_adds_orthogonal_ones():
    a = np.array([1.0, 2.0])
    np.testing.assert_allclose(gp.adasum([a, a]), a)
    np.testing.assert_allclose(gp.adasum([np.array([1.0, 0]), np.array([0, 3.0])]), [1, 3])
    np.testing.assert_allclose(gp.adasum([np.zeros(2), a]), a)
