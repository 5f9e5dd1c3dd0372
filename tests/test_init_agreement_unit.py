"""init()'s agreement without MPI: every rank's preparation (knobs, process sets, a
failure) judged together, so init fails on every rank or on none."""

from __future__ import annotations

import pytest

from hvdlite import config
from hvdlite.engine.init_agreement import Preparation, check

pytestmark = pytest.mark.timeout(60)


def _summary(error=None, env=None, sets=()):
    entries = [(False, list(s)) for s in sets]  # sets given as ranks
    return Preparation(error, config.read_config(env or {}), entries).summary()


def test_the_agreement_passes_when_ranks_prepared_alike():
    assert check([_summary(sets=[[0, 1]]), _summary(sets=[[0, 1]])]) is None


def test_one_failed_rank_fails_init_everywhere_with_its_error():
    message = check([_summary(), _summary(ValueError("HVDLITE_CYCLE_TIME='nan' is bad"))])
    assert "failed on 1 of 2 ranks" in message and "no rank is initialized" in message
    assert "rank 1: ValueError: HVDLITE_CYCLE_TIME='nan' is bad" in message


def test_many_ranks_failing_alike_are_named_as_one_range():
    error = ValueError("HVDLITE_FUSION_THRESHOLD='x' is bad")
    message = check([_summary()] * 3 + [_summary(error)] * 29)
    assert "failed on 29 of 32 ranks" in message
    assert message.count("is bad") == 1 and "ranks 3-31: ValueError" in message


def test_differing_knobs_or_process_sets_fail_init():
    knobs = check([_summary(), _summary(env={"HVDLITE_CACHE_CAPACITY": "0"})])
    assert "HVDLITE_CACHE_CAPACITY differs between ranks" in knobs
    sets = check([_summary(sets=[[0, 1]]), _summary(sets=[[1]])])
    assert "process_sets" in sets and "rank 0: [[0, 1]]" in sets


def test_communicator_sets_may_differ_per_rank_when_their_members_agree():
    from hvdlite.engine.initial_sets import duplicates, inconsistency, union

    halves = [[(True, [0, 2]), (False, [0])], [(True, [1])], [(True, [0, 2]), (False, [0])]]
    assert "must list the same sets" in inconsistency(halves)  # rank 1 lists one set only
    halves[1].append((False, [0]))
    assert inconsistency(halves) is None
    assert union(halves, 3) == [[0, 2], [1], [0]]
    # rank 1 says the communicator holds ranks 0 and 1; rank 0 says it holds 0 and 2
    wrong = [[(True, [0, 2])], [(True, [0, 1])], [(True, [0, 2])]]
    assert "rank 1 sees ranks [0, 1], but rank 0 sees [0, 2]" in inconsistency(wrong)
    # a set of every rank, then a repeat: both duplicates; the union skips them
    listed = [(False, [0, 1, 2]), (False, [1]), (False, [1])]
    assert duplicates(listed, 3) == [0, 2]
    assert union([listed] * 3, 3) == [[1]]
