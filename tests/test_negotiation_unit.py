"""Negotiation on rank 0 without MPI: a cold cycle that every rank submitted alike is
decided by rank 0 alone; anything else gathers every rank's list."""

from __future__ import annotations

from engine_requests import P, coordinator, join_params, ok

from hvdlite.engine.messages import Kind


class _Rank0Comm:
    """Rank 0's side of the control communicator of a job of *others* + 1 ranks, whose
    other ranks send *their* request lists (for the digest and the gather)."""

    def __init__(self, theirs):
        self.theirs = theirs
        self.gathered = False

    def Get_size(self):
        return len(self.theirs) + 1

    def Allreduce(self, _, vector, op):
        from hvdlite.engine import negotiation

        for requests in self.theirs:
            other = vector.copy()
            negotiation._everyone_sent(_Local(other), requests, spoil=False)
            vector &= other

    def gather(self, item, root=0):
        self.gathered = True
        return [item] + [(requests, None) for requests in self.theirs]

    def bcast(self, value, root=0):
        return value


class _Local:
    """A communicator of one rank that leaves the digest vector as it was built."""

    def __init__(self, out):
        self.out = out

    def Allreduce(self, _, vector, op):
        self.out[:] = vector


def _negotiate_on_rank0(mine, theirs, joined=False):
    from types import SimpleNamespace

    from hvdlite.engine.negotiation import negotiate

    c, _ = coordinator(len(theirs) + 1)
    if joined:
        c.joined = [len(theirs)]
    comm = _Rank0Comm(theirs)
    entries = [SimpleNamespace(params=p, sent=False) for p in mine]
    responses = negotiate(comm, entries, {}, c, False, None, None)
    return responses, comm.gathered


def test_a_cold_cycle_alike_on_every_rank_is_decided_by_rank_0_alone():
    alike = [P("a"), P("b", kind=Kind.ALLGATHER)]
    responses, gathered = _negotiate_on_rank0(alike, [list(alike)] * 31)
    assert not gathered and responses == [ok(p) for p in alike]
    # One rank's list differs (or a rank has joined): the coordinator needs every list.
    responses, gathered = _negotiate_on_rank0(alike, [list(alike)] * 30 + [[P("a")]])
    assert gathered and responses == [ok(alike[0])]
    _, gathered = _negotiate_on_rank0(alike, [list(alike)] * 31, joined=True)
    assert gathered


def test_only_new_global_collectives_without_joined_ranks_are_decided_alone():
    c, _ = coordinator(3, {1: frozenset({0, 1})})
    assert c.decides_alone([P("a"), P("b", kind=Kind.BROADCAST, root=2)])
    assert not c.decides_alone([P("s", set_id=1)])  # a set of some ranks only
    assert not c.decides_alone([join_params()])
    c.process([(1, [P("x")])])  # rank 1 asked for x in an earlier cycle
    assert not c.decides_alone([P("x")])
    assert c.process_unanimous([P("a")]) == [ok(P("a"))]
