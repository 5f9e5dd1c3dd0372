"""The status vector each cycle exchanges, and the doorbell that wakes waiting peers:
how flags and cache hits combine across ranks, and who rings."""

from __future__ import annotations

import random

import pytest

from hvdlite.engine.coordinator import StallClock
from hvdlite.engine.driver import Phase
from hvdlite.engine.status import Codec, Flag, Layout, alone, combine, decode, encode

pytestmark = pytest.mark.timeout(60)


class _Bell:
    def __init__(self, peer_rang: bool):
        self.peer_rang = peer_rang
        self.rings = 0

    def heard(self) -> bool:
        heard, self.peer_rang = self.peer_rang, False
        return heard

    def ring(self) -> None:
        self.rings += 1


def _waiting_engine(bell: _Bell, work: bool):
    """What Engine.work_arrived reads, for a rank waiting with or without local work."""
    from types import SimpleNamespace

    from hvdlite.engine.wait_limit import WaitLimit

    stall = StallClock(60, 0, enabled=False)
    return SimpleNamespace(
        limit=WaitLimit(None, 0),
        flight=SimpleNamespace(pending={}),
        negotiator=SimpleNamespace(want_stall_check=stall.due),
        inbox=[object()] if work else [],
        driver=SimpleNamespace(state=Phase.RUNNING),
        doorbell=bell,
    )


@pytest.mark.parametrize("peer_rang", [False, True])
def test_a_rank_with_work_rings_only_if_no_peer_rang_first(peer_rang):
    # When every rank has work in the same step, ringing every peer from every
    # rank would cost N * (N - 1) messages; a peer's ring already wakes them all.
    from hvdlite.engine.cycle import Engine

    bell = _Bell(peer_rang)
    assert Engine.work_arrived(_waiting_engine(bell, work=True))
    assert bell.rings == (0 if peer_rang else 1)
    idle = _Bell(peer_rang)
    assert Engine.work_arrived(_waiting_engine(idle, work=False)) is peer_rang
    assert idle.rings == 0


def test_the_combined_status_is_the_or_of_flags_and_the_and_of_hits():
    rng = random.Random(7)
    for world, nbits in ((1, 0), (2, 5), (3, 130), (70, 64)):
        layout = Layout.of(nbits, world, after_wait=True)
        full = (1 << (layout.bit_words * 64)) - 1
        ranks = []
        for rank in range(world):
            hits = rng.getrandbits(nbits) if nbits else 0
            ranks.append(
                (
                    rng.choice([0, Flag.NEW, Flag.STALL | Flag.JOINED]),
                    hits,
                    rng.getrandbits(nbits) if nbits and rng.random() < 0.3 else 0,
                    rank if rng.random() < 0.5 else None,
                )
            )
        vectors = [
            encode(layout, flags, hits, hits, invalid, ringer)
            for flags, hits, invalid, ringer in ranks
        ]
        status = decode(layout, combine(vectors))
        expect_flags = expect_any = expect_invalid = 0
        expect_all = full
        for flags, hits, invalid, _ in ranks:
            expect_flags |= flags
            expect_all &= hits
            expect_any |= hits
            expect_invalid |= invalid
        assert status.flags == expect_flags
        assert status.all_hit == expect_all & full
        assert status.any_hit == expect_any
        assert status.invalid == expect_invalid
        assert status.ringers == sum(ringer is not None for *_, ringer in ranks)


def test_a_job_of_one_rank_decodes_its_own_status_without_a_vector():
    for after_wait in (False, True):
        layout = Layout.of(70, 1, after_wait)
        args = (Flag.NEW | Flag.STALL, (1 << 69) | 5, (1 << 69) | 5, 2)
        assert alone(layout, *args, rang=True) == decode(
            layout, combine([encode(layout, *args, ringer_rank=0)])
        )


def test_a_status_without_a_wait_has_no_ringer_field():
    layout = Layout.of(10, 4, after_wait=False)
    assert layout.ringer_words == 0 and layout.nbytes == 8 * 4
    status = decode(layout, encode(layout, Flag.SHUTDOWN, 0b101, 0b101, 0))
    assert status.flags == Flag.SHUTDOWN and status.all_hit == 0b101 and status.ringers == 0


def test_the_codec_answers_as_encode_and_decode_do_and_forgets_past_its_limit():
    codec = Codec(limit=4)
    rng = random.Random(3)
    for _ in range(40):
        layout = Layout.of(rng.choice([0, 5, 70]), 3, rng.random() < 0.5, rng.choice([0, 1]))
        full = (1 << (layout.bit_words * 64)) - 1
        args = (
            rng.choice([0, Flag.NEW, Flag.STALL]),
            rng.getrandbits(3) & full,
            rng.getrandbits(3) & full,
            0,
            rng.choice([None, 1]),
            rng.choice([None, 7]) if layout.root_words else None,
        )
        vector = codec.encode(layout, *args)
        assert vector.tobytes() == encode(layout, *args).tobytes()
        vector[0] = 0  # the caller's to reduce in place: the remembered answer stays
        assert codec.encode(layout, *args).tobytes() == encode(layout, *args).tobytes()
        assert codec.decode(layout, vector) == decode(layout, vector)
        assert len(codec._vectors) <= 4 and len(codec._statuses) <= 4
