"""The response cache and what builds on it, without MPI: hits, misses, eviction and
deterministic bits; the cache bits a cycle marks; the plans kept per set of ready
bits."""

from __future__ import annotations

import random

import pytest
from engine_requests import P, allreduce_response, entry_of, ok

from hvdlite.engine.cache_bits import CacheBits
from hvdlite.engine.plans import Plan, PlanCache
from hvdlite.engine.response_cache import HIT, INVALID, MISS, ResponseCache, set_bits
from hvdlite.ops import ReduceOp

pytestmark = pytest.mark.timeout(60)


def test_cache_hit_miss_invalid():
    cache = ResponseCache(4)
    assert cache.lookup(P("a")) == (MISS, -1)
    assert cache.put(ok(P("a"))) is None
    state, bit = cache.lookup(P("a"))
    assert state == HIT and cache.get(bit).params == P("a")
    assert cache.lookup(P("a", shapes=((5,),))) == (INVALID, bit)
    assert cache.lookup(P("a", op=ReduceOp.MAX))[0] == INVALID
    assert len(cache) == 1 and cache.num_bits == 1


def test_cache_disabled_with_capacity_zero():
    cache = ResponseCache(0)
    assert cache.put(ok(P("a"))) is None
    assert cache.lookup(P("a")) == (MISS, -1)
    assert len(cache) == 0 and cache.num_bits == 0


def test_cache_evicts_least_recently_used():
    cache = ResponseCache(2)
    cache.put(ok(P("a")))
    cache.put(ok(P("b")))
    bit_a = cache.lookup(P("a"))[1]
    cache.touch(bit_a)  # a is now more recent than b
    bit_b = cache.lookup(P("b"))[1]
    assert cache.put(ok(P("c"))) == bit_b
    assert cache.lookup(P("b"))[0] == MISS
    assert cache.lookup(P("a"))[0] == HIT and cache.lookup(P("c"))[0] == HIT
    assert cache.lookup(P("c"))[1] == bit_b  # the freed bit is reused
    assert cache.num_bits == 2


def test_cache_put_same_key_updates_in_place():
    cache = ResponseCache(2)
    cache.put(ok(P("a")))
    bit = cache.lookup(P("a"))[1]
    assert cache.put(ok(P("a", shapes=((9,),)))) is None
    assert cache.lookup(P("a", shapes=((9,),))) == (HIT, bit)
    assert len(cache) == 1


def test_cache_version_changes_only_when_a_bit_changes_meaning():
    cache = ResponseCache(2)
    v0 = cache.version
    cache.put(ok(P("a")))
    bit = cache.lookup(P("a"))[1]
    v1 = cache.version
    assert v1 == v0  # a bit never used before: what other bits mean is unchanged
    cache.touch(bit)
    cache.lookup(P("a"))
    cache.get(bit)
    assert cache.version == v1  # reads and LRU order do not count
    cache.put(ok(P("a", shapes=((9,),))))
    v2 = cache.version
    assert v2 != v1
    cache.erase(bit)
    v3 = cache.version
    assert v3 != v2
    cache.put(ok(P("b")))  # takes the freed bit: erasing it already counted
    assert cache.lookup(P("b")) == (HIT, bit)
    cache.put(ok(P("c")))
    cache.put(ok(P("d")))  # evicts the older of the two: a bit changes meaning
    assert cache.version != v3


def test_set_bits_lists_positions_ascending():
    assert set_bits(0) == []
    assert set_bits(1) == [0]
    assert set_bits(0b1011000) == [3, 4, 6]
    rng = random.Random(7)
    for _ in range(50):
        mask = rng.getrandbits(700)
        assert set_bits(mask) == [b for b in range(700) if mask >> b & 1]


def test_set_bits_of_sparse_wide_and_dense_masks():
    # Each of its three ways: a few bits high up, many bits in a wide mask, a narrow dense one.
    for mask in (
        1 << 1000,
        (1 << 1000) | (1 << 3) | 1,
        ((1 << 200) - 1) << 1000,
        (1 << 300) - 1,
        (1 << 64) - 1,
        (1 << 2000) - 1,
    ):
        assert set_bits(mask) == [b for b in range(mask.bit_length()) if mask >> b & 1]


def test_cache_touch_all_orders_eviction_like_touch():
    a, b = ResponseCache(3), ResponseCache(3)
    for cache in (a, b):
        for i in range(3):
            cache.put(ok(P(f"n{i}")))
    a.touch_all([0, 2])
    b.touch(0)
    b.touch(2)
    assert a.put(ok(P("n3"))) == b.put(ok(P("n3"))) == 1


def test_cache_erase_and_erase_set():
    cache = ResponseCache(8)
    for name in ("a", "b", "c"):
        cache.put(ok(P(name)))
    bit_b = cache.lookup(P("b"))[1]
    cache.erase(bit_b)
    cache.erase(bit_b)  # erasing twice is harmless
    assert cache.lookup(P("b"))[0] == MISS and len(cache) == 2
    assert cache.erase_set(0) and len(cache) == 0
    assert cache.erase_set(5) == []


def test_cache_remembers_every_process_set_by_set_and_name():
    # Non-members treat a smaller set's bits as set (the engine's foreign mask), so
    # responses of every set are cached, keyed by (set id, name).
    cache = ResponseCache(8)
    assert cache.put(ok(P("a", set_id=2))) is None
    state, bit = cache.lookup(P("a", set_id=2))
    assert state == HIT and cache.bit_of((2, "a")) == bit
    assert cache.lookup(P("a", set_id=0)) == (MISS, -1)
    assert len(cache) == 1


def test_cache_bit_assignment_is_deterministic():
    # Two ranks applying the same sequence of puts/touches/erases agree on every bit.
    rng = random.Random(7)
    ops = []
    for _ in range(400):
        choice = rng.random()
        name = f"n{rng.randrange(12)}"
        if choice < 0.6:
            ops.append(("put", name, rng.randrange(3)))
        elif choice < 0.85:
            ops.append(("touch", name, 0))
        else:
            ops.append(("erase", name, 0))

    def replay():
        cache = ResponseCache(5)
        history = []
        for op, name, variant in ops:
            state, bit = cache.lookup(P(name, shapes=((variant + 1,),)))
            if op == "put":
                history.append(("evicted", cache.put(ok(P(name, shapes=((variant + 1,),))))))
            elif bit >= 0 and op == "touch":
                cache.touch(bit)
            elif bit >= 0:
                cache.erase(bit)
            history.append((state, bit, len(cache)))
        return history, sorted(cache._bit_of.items())

    assert replay() == replay()
    history, table = replay()
    assert len(table) <= 5
    assert any(e[0] == "evicted" and e[1] is not None for e in history)


def test_cache_bits_follow_hits_invalidations_and_foreign_sets():
    bits = CacheBits(ResponseCache(capacity=2), rank=0)
    a, b = allreduce_response("a"), allreduce_response("b", set_id=1)
    assert bits.put(a, members={0, 1}) is None
    assert bits.put(b, members={1, 2}) is None  # rank 0 is not a member of set 1
    assert bits.foreign_mask == 0b10
    hit = entry_of(a)
    assert bits.admit(hit) and hit.bit == 0 and bits.hit_mask == 0b01
    assert bits.status_masks(joined=False, full=0b11) == (0b11, 0b01)
    assert bits.status_masks(joined=True, full=0b11) == (0b11, 0)
    changed = entry_of(a, shape=(5,))
    assert not bits.admit(changed) and bits.invalid_mask == 0b01
    assert bits.invalidate(0b01) == [hit] and hit.bit == -1 and bits.invalid_mask == 0
    assert bits.cache.bit_of(a.key) is None
    # Eviction returns the entry that waited on the evicted bit.
    waiting = entry_of(b)
    bits.admit(waiting)
    assert bits.put(allreduce_response("c"), members={0, 1}) is None  # bit 0 was free again
    assert bits.put(allreduce_response("d"), members={0, 1}) is waiting


def test_take_ready_marks_bits_used_and_releases_their_entries():
    bits = CacheBits(ResponseCache(capacity=8), rank=0)
    entries = []
    for name in "abc":
        response = allreduce_response(name)
        bits.put(response, members={0})
        entries.append(entry_of(response))
        bits.admit(entries[-1])
    assert bits.take_ready(0b101) == [0, 2]
    assert bits.hit_mask == 0b010 and entries[0].bit == -1 and entries[1].bit == 1
    assert bits.unhit_all() == [entries[1]] and bits.hit_mask == 0


def _plan(tag: str) -> Plan:
    return Plan([[tag]], [], None)


def test_plans_are_kept_per_ready_bits_while_the_cache_version_stays():
    plans = PlanCache(limit=3)
    assert plans.get(0b11, version=7) is None
    loop, loss = plans.add(0b11, _plan("loop")), plans.add(0b100, _plan("loss"))
    assert plans.get(0b11, 7) is loop and plans.get(0b100, 7) is loss
    assert plans.get(0b1, 7) is None and len(plans) == 2


def test_a_peek_guesses_without_dropping_and_a_new_version_drops_every_plan():
    plans = PlanCache()
    plans.get(0b1, version=1)
    plan = plans.add(0b1, _plan("a"))
    assert plans.peek(0b1, 1) is plan
    assert plans.peek(0b1, 2) is None and plans.get(0b1, 1) is plan  # peek kept it
    assert plans.get(0b1, 2) is None and len(plans) == 0
    assert plans.peek(0b1, 1) is None


def test_plans_past_the_limit_start_afresh_and_clear_forgets_the_version():
    plans = PlanCache(limit=2)
    plans.get(0, version=5)
    for ready in (1, 2):
        plans.add(ready, _plan(str(ready)))
    plans.add(4, _plan("4"))
    assert len(plans) == 1 and plans.get(4, 5) is not None and plans.get(1, 5) is None
    plans.clear()
    assert plans.peek(4, 5) is None and plans.get(4, 5) is None
