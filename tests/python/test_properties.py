"""Properties of the Python argument path, by Hypothesis (Debian's
python3-hypothesis): arrays of every dtype and byte order, strided and
reversed views, shapes from empty to odd, outputs that alias the input or
each other, and absurd numbers (k, threads, group sizes). Every call either
returns what NumPy computes, or raises ValueError, TypeError, OverflowError
or MemoryError with a one-line message; none crashes, and none writes its
inputs."""

import numpy as np
import pytest

import kreg

hypothesis = pytest.importorskip("hypothesis", reason="python3-hypothesis is not installed")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)
ERRORS = (ValueError, TypeError, OverflowError, MemoryError)
DTYPES = ["<f4", ">f4", "<f8", "<i4", ">i4", "<i8", "<u2", ">u2", "<f2", "|b1"]
ABSURD = st.sampled_from([-(2 ** 63), -(2 ** 31), -1, 2 ** 31, 2 ** 32 + 3, 2 ** 62, 10 ** 30])


def topk_indices(x, k):
    """kreg's top-k order (largest): NaN above +inf, ties by ascending index."""
    x = x.astype(np.float64)
    out = np.empty((x.shape[0], k), np.int64)
    for r, row in enumerate(x):
        nan = np.isnan(row)
        order = np.lexsort((np.arange(row.size), -np.where(nan, 0.0, row), ~nan))
        out[r] = order[:k]
    return out


@st.composite
def views(draw):
    """An array of any listed dtype, 0 to 3 dims, as a plain, reversed,
    stepped or transposed view."""
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0, 7), min_size=ndim, max_size=ndim)))
    x = draw(hnp.arrays(dtype, shape))
    how = draw(st.sampled_from(["plain", "reversed", "stepped", "transposed"]))
    if ndim and how == "reversed":
        x = x[..., ::-1]
    elif ndim and how == "stepped":
        x = x[..., ::2]
    elif ndim > 1 and how == "transposed":
        x = x.T
    return x


def expect_clean_error(error):
    message = str(error)
    assert message and "\n" not in message, repr(message)


@SETTINGS
@given(x=views(), k=st.one_of(st.integers(-2, 9), ABSURD), threads=st.one_of(st.integers(-2, 3), ABSURD))
def test_topk_takes_its_arguments_or_refuses_them(x, k, threads):
    before = x.tobytes()
    try:
        out = kreg.run("topk/heap", input=x, k=k, threads=threads)
    except ERRORS as e:
        expect_clean_error(e)
        return
    finally:
        assert x.tobytes() == before, "the input was written"
    # Accepted: a native-order f32 or bf16 (uint16 bits) matrix, a k it can
    # take, a thread count within bounds.
    assert x.dtype in (np.dtype("<f4"), np.dtype("<u2")) and x.ndim == 2, x.dtype
    assert 0 <= k <= x.shape[1] and 0 <= threads <= 1024
    values = kreg.bf16_to_float32(x) if x.dtype == np.dtype("<u2") else x
    np.testing.assert_array_equal(out["indices"], topk_indices(values, k))


@SETTINGS
@given(data=st.data())
def test_outputs_that_alias_are_refused(data):
    batch, n = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 8))
    k = data.draw(st.integers(1, n))
    buf = np.zeros(batch * n + 2 * batch * k + 8, np.float32)
    a = data.draw(st.integers(0, buf.size - batch * n))
    b = data.draw(st.integers(0, buf.size - batch * k))
    x = buf[a:a + batch * n].reshape(batch, n)
    x[...] = np.arange(batch * n, dtype=np.float32).reshape(batch, n) % 5
    values = buf[b:b + batch * k].reshape(batch, k)
    shared_indices = data.draw(st.booleans())
    if shared_indices:
        c = data.draw(st.integers(0, buf.size - batch * k))
        indices = buf[c:c + batch * k].view(np.int32).reshape(batch, k)
    else:
        c, indices = None, np.zeros((batch, k), np.int32)

    def overlap(p, q, size_p, size_q):
        return p < q + size_q and q < p + size_p

    aliased = overlap(a, b, batch * n, batch * k) or (
        shared_indices and (overlap(a, c, batch * n, batch * k) or overlap(b, c, batch * k, batch * k)))
    before = x.copy()
    try:
        kreg.run("topk/heap", input=x, k=k, out={"values": values, "indices": indices})
    except ValueError as e:
        assert aliased and "share memory" in str(e), str(e)
        np.testing.assert_array_equal(x, before)
        return
    assert not aliased
    np.testing.assert_array_equal(indices, topk_indices(before, k))


@SETTINGS
@given(sizes=st.lists(st.one_of(st.integers(-3, 6), st.sampled_from([-(2 ** 31), 2 ** 30, 2 ** 31 - 1])),
                     min_size=0, max_size=5),
       m=st.integers(0, 12), k=st.integers(1, 4), n=st.integers(1, 4))
def test_gmm_group_sizes_are_taken_or_refused(sizes, m, k, n):
    rng = np.random.default_rng(len(sizes) * 131 + m)
    lhs = rng.standard_normal((m, k)).astype(np.float32)
    rhs = rng.standard_normal((len(sizes), k, n)).astype(np.float32)
    group_sizes = np.array(sizes, np.int32)
    try:
        out = kreg.run("gmm/tiled", lhs=lhs, rhs=rhs, group_sizes=group_sizes)
    except ERRORS as e:
        expect_clean_error(e)
        assert any(s < 0 for s in sizes) or sum(sizes) > m or not sizes, (sizes, m)
        return
    assert all(s >= 0 for s in sizes) and sum(sizes) <= m
    want = np.zeros((m, n), np.float64)
    start = 0
    for g, s in enumerate(sizes):
        want[start:start + s] = lhs[start:start + s].astype(np.float64) @ rhs[g].astype(np.float64)
        start += s
    np.testing.assert_allclose(out["out"], want, rtol=1e-4, atol=1e-4)
