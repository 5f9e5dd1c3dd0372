"""The engine's float16 <-> float32 casts (hvdlite/util/half_casts.py) give numpy's
bits for every float16 value and at every rounding boundary, whichever
implementation runs, and the engine's copies take them."""

import numpy as np
import pytest

from hvdlite.device.packing import NUMPY, Copy
from hvdlite.util import half_casts
from hvdlite.util.dtypes import BFLOAT16

pytestmark = pytest.mark.timeout(120)

EVERY_HALF = np.arange(1 << 16, dtype=np.uint16).view(np.float16)


def bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint16 if x.itemsize == 2 else np.uint32)


def numpy_narrowed(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return x.astype(np.float16)


def hard_float32s() -> np.ndarray:
    """float32 values around every float16 rounding boundary, both signs: each
    float16 value's bits +-1 ulp, the halfway points between neighbours +-2 ulps,
    a stride through float16's subnormal range, infinities, NaNs with and
    without payloads in float16's reach, and random bit patterns."""
    wide = EVERY_HALF.astype(np.float32)
    finite = wide[np.isfinite(wide)].astype(np.float64)
    step = np.diff(np.sort(np.unique(finite)))
    mids = np.sort(np.unique(finite))[:-1] + step / 2
    anchors = np.concatenate([finite, mids]).astype(np.float32).view(np.uint32).astype(np.int64)
    near = np.concatenate([anchors + d for d in range(-2, 3)])
    tiny = np.arange(0, 0x38800000 + (1 << 13), 97, dtype=np.int64)
    special = np.array(
        [0x7F800000, 0x7FC00000, 0x7F800001, 0x7F801FFF, 0x7F802000, 0x7FFFFFFF, 0x477FF000],
        np.int64,
    )
    noise = np.random.default_rng(7).integers(0, 1 << 32, 200_000, dtype=np.int64)
    magnitudes = np.concatenate([near, tiny, special, noise]) & 0x7FFFFFFF
    both = np.concatenate([magnitudes, magnitudes | 0x80000000])
    return both.astype(np.uint32).view(np.float32)


def test_widening_by_table_gives_every_float16_value_numpy_bits():
    out = np.empty(EVERY_HALF.size, np.float32)
    half_casts.widen_with_numpy(EVERY_HALF, out)
    assert np.array_equal(bits(out), bits(EVERY_HALF.astype(np.float32)))


def test_narrowing_rounds_as_numpy_at_every_boundary():
    x = hard_float32s()
    out = np.empty(x.size, np.float16)
    half_casts.narrow_with_numpy(x, out)
    expected = numpy_narrowed(x)
    wrong = np.flatnonzero(bits(out) != bits(expected))
    assert wrong.size == 0, [hex(v) for v in bits(x)[wrong[:5]]]


@pytest.mark.parametrize("count", [1, half_casts.CHUNK - 1, 3 * half_casts.CHUNK + 5])
def test_lengths_across_chunk_edges_and_strided_input(count):
    x = (np.random.default_rng(count).standard_normal(2 * count) * 1e-5).astype(np.float32)
    strided = x[::2]  # not contiguous: each chunk is a view all the same
    out = np.empty(count, np.float16)
    half_casts.narrow_with_numpy(strided, out)
    assert np.array_equal(bits(out), bits(numpy_narrowed(strided)))
    back = np.empty(count, np.float32)
    half_casts.widen_with_numpy(out, back)
    assert np.array_equal(bits(back), bits(out.astype(np.float32)))


def test_the_torch_casts_give_the_same_bits():
    torch = pytest.importorskip("torch")
    x = hard_float32s()
    via_torch = torch.from_numpy(x).to(torch.float16).numpy()
    finite = np.isfinite(x)  # NaN payloads are each library's own
    assert np.array_equal(bits(via_torch)[finite], bits(numpy_narrowed(x))[finite])
    assert np.array_equal(
        torch.from_numpy(EVERY_HALF.copy()).float().numpy().view(np.uint32)[~np.isnan(EVERY_HALF)],
        bits(EVERY_HALF.astype(np.float32))[~np.isnan(EVERY_HALF)],
    )


@pytest.fixture
def spied():
    """Registered casts that record their calls (and cast with numpy)."""
    calls = []

    def spy(kind):
        def cast(src, out):
            calls.append((kind, src.size))
            np.copyto(out, src, casting="unsafe")

        return cast

    kept = half_casts.register(spy("widen"), spy("narrow"))
    yield calls
    half_casts.register(*kept)


def test_registered_casts_take_writable_float16_and_leave_the_rest(spied):
    half = np.arange(6, dtype=np.float16)
    wide = np.empty(6, np.float32)
    half_casts.widen(half, wide)
    half_casts.narrow(wide, half)
    assert spied == [("widen", 6), ("narrow", 6)]
    frozen = half.copy()
    frozen.flags.writeable = False  # torch cannot wrap it without a warning
    half_casts.widen(frozen, wide)
    half_casts.copy(np.empty(6, np.float64), np.arange(6, dtype=np.float32))  # no float16
    assert spied == [("widen", 6), ("narrow", 6)]
    assert np.array_equal(wide, np.arange(6, dtype=np.float32))


def test_copy_matches_numpy_for_every_pair_and_factor(spied):
    rng = np.random.default_rng(3)
    wide = (rng.standard_normal((40, 7)) * 1e-5).astype(np.float32)
    half = wide.astype(np.float16)
    for dst_dtype, src, factor in [
        (np.float16, wide, 1.0),
        (np.float16, wide, 0.3),
        (np.float16, wide, np.float64(0.3)),  # a float64 product, rounded once by numpy
        (np.float32, half, 1.0),
        (np.int32, wide * 1e6, 1.0),
    ]:
        got = np.empty(src.shape, dst_dtype)
        half_casts.copy(got, src, factor)
        expected = np.empty(src.shape, dst_dtype)
        np.multiply(src, factor, out=expected, casting="unsafe")
        assert np.array_equal(got.view(np.uint8), expected.view(np.uint8)), (dst_dtype, factor)
    assert [kind for kind, _ in spied] == ["narrow", "narrow", "widen"]
    columns = np.empty((7, 40), np.float16).T  # not contiguous: numpy's copy
    half_casts.copy(columns, wide)
    assert np.array_equal(columns, wide.astype(np.float16)) and len(spied) == 3


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # signalling NaNs, overflows
@pytest.mark.parametrize("factor", [0.3, -2.5, 2.0**-20, 3e-6, 70000.0, 1 / 3])
@pytest.mark.parametrize("narrow", [np.float16, BFLOAT16], ids=["float16", "bfloat16"])
def test_a_scaled_16_bit_copy_is_scaled_in_float32_for_every_value(narrow, factor):
    # numpy rounds each float16 product to 16 bits (ml_dtypes' bfloat16 ones it
    # does not); the engine's rule keeps it in float32, exact there, for the sum
    # to round once
    src = EVERY_HALF.view(narrow)
    out = np.empty(src.size, np.float32)
    half_casts.copy(out, src, factor)
    expected = src.astype(np.float32) * np.float32(factor)
    assert np.array_equal(np.isnan(out), np.isnan(expected))
    finite = ~np.isnan(expected)
    assert np.array_equal(bits(out)[finite], bits(expected)[finite])
    rounded_first = np.empty_like(out)
    with np.errstate(all="ignore"):
        np.multiply(src, factor, out=rounded_first, casting="unsafe")
    if narrow == np.float16 and factor != -2.5:
        assert not np.array_equal(out[finite], rounded_first[finite])


def test_the_engine_packs_float16_through_the_casts(spied):
    half = (np.random.default_rng(5).standard_normal(1000) * 1e-5).astype(np.float16)
    buffer = np.empty(2000, np.float32)
    NUMPY.copy_many([Copy(buffer[:1000], half), Copy(buffer[1000:], half, 0.5)])
    assert [kind for kind, _ in spied] == ["widen", "widen"]
    assert np.array_equal(buffer[:1000], half.astype(np.float32))
    assert np.array_equal(buffer[1000:], half.astype(np.float32) * np.float32(0.5))
    out = np.empty(1000, np.float16)
    NUMPY.copy(out, buffer[:1000])
    assert spied[-1] == ("narrow", 1000) and np.array_equal(bits(out), bits(half))
