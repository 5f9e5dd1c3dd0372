"""Issue 36: elastic state that cannot be lost or forged, files and secrets kept private.

Unit tests (one process, no MPI); the collective behaviour is tested with real
hvdrun jobs in test_elastic_jobs.py and test_runner_jobs.py.
"""

from __future__ import annotations

from hvdlite.runner.elastic_hosts import FailureHistory, ranks_on
from hvdlite.runner.hosts import Host


def _reachable(_host):
    return None


def test_a_rank_failure_is_the_hosts_only_on_evidence_about_the_host():
    now = [100.0]
    history = FailureHistory(window=60.0, clock=lambda: now[0])
    placement = [Host("a", 2), Host("b", 2)]
    assert ranks_on(placement, "b") == [2, 3]
    # one rank of two failed, the host answers: a process failure
    assert history.judge("a", [0, 1], {1}, _reachable) is None
    # the other host: both of its ranks failed before hvdrun stopped them
    assert history.judge("b", [2, 3], {2, 3}, _reachable) == "all 2 ranks on it failed at once"
    # a host that cannot be reached
    assert history.judge("b", [2, 3], {3}, lambda h: "no route to host") == \
        "it cannot be reached (no route to host)"
    # "a" again within the window: the host's; then forgotten
    now[0] += 30
    assert history.judge("a", [0, 1], {0}, _reachable).startswith(
        "its ranks failed again 30 s after")
    assert history.judge("a", [0, 1], {0}, _reachable) is None
    now[0] += 61  # outside the window: a process failure again
    assert history.judge("a", [0, 1], {0}, _reachable) is None
    # a single rank on a host is no evidence about the host by itself
    assert history.judge("c", [4], {4}, _reachable) is None


def test_the_failure_history_is_bounded():
    history = FailureHistory(window=1e9, limit=3)
    for index in range(10):
        assert history.judge(f"h{index}", [0], {0}, _reachable) is None
    assert len(history._last) == 3
