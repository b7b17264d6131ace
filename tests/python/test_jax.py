"""kreg.jax: topk, gmm and tgmm as XLA FFI custom calls, under jax.jit.

Against jax.lax.top_k and jax.lax.ragged_dot, and NumPy references of kreg's
semantics (float64 for the grouped matmuls); gradients against jax.grad of
references written in jax.numpy; vmap; errors. Skipped where JAX is not
installed. Tolerances for gmm and tgmm: |got - want| <= atol * (reduction
length) + rtol * |want|, f32 out 1e-5 / 1e-5 and bf16 out 1e-2 / 1/128, a
bound on the size of these tests' normal inputs (the op's own check,
DESIGN.md §4, scales with the terms' magnitudes instead); gradients, sums
of two such products, twice that.
"""

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed here (pip install jax to run this)")
jnp = pytest.importorskip("jax.numpy")
kjax = pytest.importorskip("kreg.jax", reason="kreg.jax needs libkreg_xla (built where CMake finds jax)")

from topk_cases import adversarial_rows, topk_reference  # noqa: E402

RNG = np.random.default_rng(7)
F32, BF16 = jnp.float32, jnp.bfloat16


# ---- top-k -------------------------------------------------------------------------------------------------------

def check_topk(values, indices, x, k, largest=True, starts=None, ends=None):
    """Indices in kreg's order; values the input's own bits there, the worst
    value on padding."""
    values, indices = np.asarray(values), np.asarray(indices)
    x32 = np.asarray(jnp.asarray(x, F32))
    want = topk_reference(x32, k, largest, starts, ends)
    np.testing.assert_array_equal(indices, want)
    rows = np.arange(x32.shape[0])[:, None]
    picked = np.asarray(x)[rows, np.maximum(want, 0)]
    fill = np.asarray(jnp.asarray(-np.inf if largest else np.inf, values.dtype))
    expect = np.where(want >= 0, picked, fill)
    assert values.dtype == np.asarray(x).dtype
    assert (values.view(np.uint8) == expect.view(np.uint8)).all() or np.array_equal(
        values.astype(np.float32), expect.astype(np.float32), equal_nan=True)


topk_jit = jax.jit(kjax.topk, static_argnames=("k", "largest"))


@pytest.mark.parametrize("shape,k", [((3, 1000), 10), ((7, 257), 257), ((1, 1), 1), ((4, 5000), 300),
                                     ((2, 3, 50), 7), ((64,), 5)])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_equals_lax_top_k(shape, k, largest):
    x = RNG.standard_normal(shape).astype(np.float32)   # distinct: one right answer
    values, indices = topk_jit(x, k=k, largest=largest)
    want_values, want_indices = jax.lax.top_k(x if largest else -x, k)
    np.testing.assert_array_equal(values, want_values if largest else -want_values)
    np.testing.assert_array_equal(indices, want_indices)
    assert indices.dtype == jnp.int32 and values.shape == shape[:-1] + (k,)


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_topk_adversarial_rows_in_kregs_order(largest, dtype):
    x = jnp.asarray(adversarial_rows(301, RNG), dtype)
    for k in (0, 1, 17, 301):
        values, indices = topk_jit(x, k=k, largest=largest)
        check_topk(values, indices, x, k, largest)
    # Where there is no NaN, lax.top_k agrees on the values (its ties go by
    # ascending index too).
    finite = x[:5]
    values, indices = topk_jit(finite, k=40, largest=largest)
    want, _ = jax.lax.top_k(finite if largest else -finite, 40)
    np.testing.assert_array_equal(np.asarray(values, np.float32), np.asarray(want if largest else -want, np.float32))


def test_topk_bf16_equals_lax_top_k():
    x = jnp.asarray(RNG.standard_normal((5, 700)), BF16)
    values, indices = topk_jit(x, k=33)
    want_values, _ = jax.lax.top_k(x, 33)
    assert values.dtype == BF16
    np.testing.assert_array_equal(np.asarray(values, np.float32), np.asarray(want_values, np.float32))
    check_topk(values, indices, x, 33)


def test_topk_row_ranges_pad_short_rows():
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    starts = np.array([0, 10, 60, 5], np.int32)
    ends = np.array([64, 20, 62, 5], np.int32)
    for largest in (True, False):
        values, indices = jax.jit(lambda x, s, e: kjax.topk(x, 8, largest, s, e))(x, starts, ends)
        check_topk(values, indices, x, 8, largest, starts, ends)
        values, indices = jax.jit(lambda x, e: kjax.topk(x, 8, largest, row_ends=e))(x, ends)
        check_topk(values, indices, x, 8, largest, None, ends)


def test_topk_vmap_folds_into_batch():
    x = RNG.standard_normal((3, 4, 100)).astype(np.float32)
    values, indices = jax.jit(jax.vmap(lambda r: kjax.topk(r, 6)))(x)
    want_values, want_indices = jax.lax.top_k(x, 6)
    np.testing.assert_array_equal(values, want_values)
    np.testing.assert_array_equal(indices, want_indices)
    ends = np.array([[50, 3, 100, 7]] * 3, np.int32)
    values, indices = jax.vmap(lambda r, e: kjax.topk(r, 6, row_ends=e))(x, ends)
    for b in range(3):
        check_topk(values[b], indices[b], x[b], 6, True, None, ends[b])


def test_topk_gradient_scatters_to_the_chosen_indices():
    x = RNG.standard_normal((3, 2, 90)).astype(np.float32)
    w = RNG.standard_normal((3, 2, 9)).astype(np.float32)
    got = jax.jit(jax.grad(lambda x: (kjax.topk(x, 9)[0] * w).sum()))(x)
    want = jax.grad(lambda x: (jax.lax.top_k(x, 9)[0] * w).sum())(x)
    np.testing.assert_array_equal(got, want)
    # A short range's padding (-1) takes no gradient.
    ends = np.array([4, 90], np.int32)
    got = jax.grad(lambda x: (kjax.topk(x, 9, row_ends=ends)[0] * w[0]).sum())(x[0])
    assert (got[0, 4:] == 0).all() and np.count_nonzero(got[0]) == 4
    got = jax.grad(lambda x: kjax.topk(x, 9)[0].sum())(jnp.asarray(x, BF16))
    assert got.dtype == BF16 and float(got.astype(F32).sum()) == 3 * 2 * 9


# ---- gmm and tgmm ------------------------------------------------------------------------------------------------

def gmm_np(lhs, rhs, sizes, transpose_rhs=False, offset=0, existing=None):
    lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    rhs = rhs.swapaxes(1, 2) if transpose_rhs else rhs
    out = np.zeros((lhs.shape[0], rhs.shape[2])) if existing is None else np.asarray(existing, np.float64).copy()
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for i in range(rhs.shape[0]):
        a, b = starts[offset + i], starts[offset + i + 1]
        out[a:b] += lhs[a:b] @ rhs[i]
    return out


def tgmm_np(lhs, rhs, sizes, offset=0, local=None):
    lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    local = len(sizes) - offset if local is None else local
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return np.stack([lhs[:, starts[offset + i]:starts[offset + i + 1]] @ rhs[starts[offset + i]:starts[offset + i + 1]]
                     for i in range(local)]) if local else np.zeros((0, lhs.shape[0], rhs.shape[1]))


def close(got, want, reduction, bf16=False, factor=1.0):
    """The bound in this module's docstring; NaN meets NaN."""
    atol, rtol = (1e-2, 1 / 128) if bf16 else (1e-5, 1e-5)
    got = np.asarray(jnp.asarray(got, F32), np.float64)
    bound = factor * (atol * max(reduction, 1) + rtol * np.abs(want))
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all(), "NaN where the reference has none, or none where it has"
    assert (np.abs(got - want)[~nan] <= bound[~nan]).all(), np.abs(got - want).max()


PARTITIONS = [  # m, k, n, group sizes: plain, empty groups, rows past the groups, tiles not dividing, no rows
    (64, 32, 48, [10, 0, 30, 24]),
    (37, 17, 5, [0, 20, 0]),           # rows 20..36 past the groups
    (130, 65, 33, [1, 63, 0, 0, 66]),
    (5, 3, 2, [0, 0, 0]),
    (0, 4, 4, [0, 0]),
]


def operands(m, k, n, groups, dtype=np.float32, transpose_rhs=False):
    lhs = RNG.standard_normal((m, k)).astype(np.float32)
    rhs = RNG.standard_normal((groups, n, k) if transpose_rhs else (groups, k, n)).astype(np.float32)
    return jnp.asarray(lhs, dtype), jnp.asarray(rhs, dtype)


gmm_jit = jax.jit(kjax.gmm, static_argnames=("transpose_rhs", "group_offset", "preferred_element_type"))
tgmm_jit = jax.jit(kjax.tgmm, static_argnames=("group_offset", "num_actual_groups", "preferred_element_type"))


@pytest.mark.parametrize("m,k,n,sizes", PARTITIONS)
@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_gmm_equals_float64_and_ragged_dot(m, k, n, sizes, transpose_rhs):
    lhs, rhs = operands(m, k, n, len(sizes), transpose_rhs=transpose_rhs)
    gs = np.array(sizes, np.int32)
    out = gmm_jit(lhs, rhs, gs, transpose_rhs=transpose_rhs)
    close(out, gmm_np(lhs, rhs, sizes, transpose_rhs), k)
    if sum(sizes) == m:
        ragged = jax.lax.ragged_dot(lhs, rhs.swapaxes(1, 2) if transpose_rhs else rhs, gs)
        np.testing.assert_allclose(out, ragged, rtol=1e-5, atol=1e-5 * k)


def test_gmm_local_groups_existing_out_and_dtypes():
    m, k, n, sizes = 50, 24, 16, [5, 10, 0, 20, 5]
    gs = np.array(sizes, np.int32)
    lhs, rhs = operands(m, k, n, 3)              # groups 1..3 are local
    existing = RNG.standard_normal((m, n)).astype(np.float32)
    out = gmm_jit(lhs, rhs, gs, group_offset=1, existing_out=existing)
    close(out, gmm_np(lhs, rhs, sizes, offset=1, existing=existing), k)
    lhs16, rhs16 = operands(m, k, n, 3, BF16)
    out = gmm_jit(lhs16, rhs16, gs, group_offset=1, preferred_element_type=F32)
    assert out.dtype == F32
    close(out, gmm_np(lhs16, rhs16, sizes, offset=1), k)
    out = gmm_jit(lhs16, rhs16, gs, group_offset=1)
    assert out.dtype == BF16
    close(out, gmm_np(lhs16, rhs16, sizes, offset=1), k, bf16=True)


def test_gmm_nan_stays_in_its_row():
    m, k, n, sizes = 40, 16, 8, [10, 20, 5]     # rows 35..39 past the groups
    lhs, rhs = operands(m, k, n, 3)
    lhs = lhs.at[3, 2].set(jnp.nan).at[37, 0].set(jnp.nan)
    out = np.asarray(gmm_jit(lhs, rhs, np.array(sizes, np.int32)))
    assert np.isnan(out[3]).all() and not np.isnan(np.delete(out, 3, axis=0)).any()
    close(out, gmm_np(lhs, rhs, sizes), k)


@pytest.mark.parametrize("m,k,n,sizes", PARTITIONS)
def test_tgmm_equals_float64(m, k, n, sizes):
    lhs = jnp.asarray(RNG.standard_normal((k, m)), F32)
    rhs = jnp.asarray(RNG.standard_normal((m, n)), F32)
    gs = np.array(sizes, np.int32)
    close(tgmm_jit(lhs, rhs, gs), tgmm_np(lhs, rhs, sizes), m)
    if len(sizes) > 1:
        out = tgmm_jit(lhs, rhs, gs, group_offset=1, num_actual_groups=len(sizes) - 1)
        close(out, tgmm_np(lhs, rhs, sizes, offset=1), m)
    out = tgmm_jit(jnp.asarray(lhs, BF16), jnp.asarray(rhs, BF16), gs, preferred_element_type=F32)
    close(out, tgmm_np(jnp.asarray(lhs, BF16), jnp.asarray(rhs, BF16), sizes), m)


def group_masks(sizes, m, offset, local):
    starts = np.concatenate([[0], np.cumsum(sizes)])
    rows = np.arange(m)
    return jnp.asarray(np.stack([(rows >= starts[offset + i]) & (rows < starts[offset + i + 1])
                                 for i in range(local)]), F32)


def gmm_jnp(lhs, rhs, sizes, transpose_rhs=False, offset=0):
    """The grouped matmul in jax.numpy (masks), for jax.grad."""
    rhs = rhs.swapaxes(1, 2) if transpose_rhs else rhs
    mask = group_masks(sizes, lhs.shape[0], offset, rhs.shape[0])
    return jnp.einsum("gm,mk,gkn->mn", mask, lhs, rhs)


def tgmm_jnp(lhs, rhs, sizes, offset=0, local=None):
    local = len(sizes) - offset if local is None else local
    return jnp.einsum("gm,km,mn->gkn", group_masks(sizes, lhs.shape[1], offset, local), lhs, rhs)


@pytest.mark.parametrize("transpose_rhs", [False, True])
@pytest.mark.parametrize("offset", [0, 1])
def test_gmm_gradients(transpose_rhs, offset):
    m, k, n, sizes = 45, 12, 10, [7, 0, 20, 11]      # rows 38..44 past the groups
    gs = np.array(sizes, np.int32)
    lhs, rhs = operands(m, k, n, len(sizes) - offset, transpose_rhs=transpose_rhs)
    d_out = jnp.asarray(RNG.standard_normal((m, n)), F32)
    f = jax.jit(lambda a, b: kjax.gmm(a, b, gs, transpose_rhs=transpose_rhs, group_offset=offset))
    _, vjp = jax.vjp(f, lhs, rhs)
    _, want_vjp = jax.vjp(lambda a, b: gmm_jnp(a, b, sizes, transpose_rhs, offset), lhs, rhs)
    for got, want, reduction in zip(vjp(d_out), want_vjp(d_out), (n, m)):
        close(got, np.asarray(want, np.float64), reduction, factor=2)
    if offset == 0 and not transpose_rhs:                # and against ragged_dot's own gradient
        sizes_all = np.array([7, 0, 20, 18], np.int32)
        g = jax.grad(lambda a, b: (kjax.gmm(a, b, sizes_all) * d_out).sum(), (0, 1))(lhs, rhs)
        r = jax.grad(lambda a, b: (jax.lax.ragged_dot(a, b, sizes_all) * d_out).sum(), (0, 1))(lhs, rhs)
        for got, want, reduction in zip(g, r, (n, m)):
            close(got, np.asarray(want, np.float64), reduction, factor=2)


def test_gmm_gradient_of_existing_out_and_bf16():
    m, k, n, sizes = 30, 8, 6, [10, 15]
    gs = np.array(sizes, np.int32)
    lhs, rhs = operands(m, k, n, 2, BF16)
    existing = jnp.zeros((m, n), F32)
    d_lhs, d_rhs, d_existing = jax.grad(lambda a, b, e: kjax.gmm(a, b, gs, existing_out=e).sum(), (0, 1, 2))(
        lhs, rhs, existing)
    assert d_lhs.dtype == BF16 and d_rhs.dtype == BF16
    np.testing.assert_array_equal(d_existing, np.ones((m, n)))
    want = jax.grad(lambda a, b: gmm_jnp(a.astype(F32), b.astype(F32), sizes).sum(), (0, 1))(lhs, rhs)
    close(d_lhs, np.asarray(want[0], np.float64), n, bf16=True, factor=2)
    close(d_rhs, np.asarray(want[1], np.float64), m, bf16=True, factor=2)


@pytest.mark.parametrize("offset,local", [(0, None), (1, 2)])
def test_tgmm_gradients(offset, local):
    m, k, n, sizes = 40, 9, 7, [5, 0, 25, 6]          # rows 36..39 past the groups
    gs = np.array(sizes, np.int32)
    lhs = jnp.asarray(RNG.standard_normal((k, m)), F32)
    rhs = jnp.asarray(RNG.standard_normal((m, n)), F32)
    groups = len(sizes) - offset if local is None else local
    d_out = jnp.asarray(RNG.standard_normal((groups, k, n)), F32)
    f = jax.jit(lambda a, b: kjax.tgmm(a, b, gs, group_offset=offset, num_actual_groups=local))
    _, vjp = jax.vjp(f, lhs, rhs)
    _, want_vjp = jax.vjp(lambda a, b: tgmm_jnp(a, b, sizes, offset, local), lhs, rhs)
    for got, want, reduction in zip(vjp(d_out), want_vjp(d_out), (n, k)):
        close(got, np.asarray(want, np.float64), reduction, factor=2)


def test_gmm_and_tgmm_vmap_run_per_element():
    m, k, n, groups, batch = 20, 6, 5, 3, 3
    lhs = jnp.asarray(RNG.standard_normal((batch, m, k)), F32)
    rhs = jnp.asarray(RNG.standard_normal((batch, groups, k, n)), F32)
    gs = np.array([[5, 5, 10], [0, 20, 0], [3, 0, 4]], np.int32)
    out = jax.jit(jax.vmap(kjax.gmm))(lhs, rhs, gs)
    for b in range(batch):
        close(out[b], gmm_np(lhs[b], rhs[b], gs[b]), k)
    shared = jax.vmap(kjax.gmm, in_axes=(0, None, None))(lhs, rhs[0], gs[0])   # one rhs for all
    for b in range(batch):
        close(shared[b], gmm_np(lhs[b], rhs[0], gs[0]), k)
    t = jax.vmap(kjax.tgmm)(lhs.swapaxes(1, 2), jnp.asarray(RNG.standard_normal((batch, m, n)), F32), gs)
    assert t.shape == (batch, groups, k, n)


# ---- errors: kreg's one-line messages ----------------------------------------------------------------------------

def test_trace_time_errors_are_value_errors():
    with pytest.raises(ValueError, match=r"k=.*n|k .*n"):
        topk_jit(np.zeros((2, 5), np.float32), k=6)
    with pytest.raises(ValueError, match="float16"):
        topk_jit(np.zeros((2, 5), np.float16), k=1)
    with pytest.raises(ValueError, match="lhs"):                          # kreg's gmm takes no int32 lhs
        kjax.gmm(np.zeros((4, 2), np.int32), np.zeros((1, 2, 3), np.int32), np.array([4], np.int32),
                 preferred_element_type=F32)
    with pytest.raises(ValueError, match="preferred_element_type"):
        kjax.gmm(np.zeros((4, 2), np.int32), np.zeros((1, 2, 3), np.int32), np.array([4], np.int32))


def test_run_time_errors_carry_kregs_message():
    lhs, rhs = operands(8, 4, 3, 2)
    with pytest.raises(Exception, match=r"group_sizes\[0\]=-1 is negative"):
        gmm_jit(lhs, rhs, np.array([-1, 4], np.int32)).block_until_ready()
    with pytest.raises(Exception, match="group_sizes|sum"):             # more rows than m
        tgmm_jit(lhs.T, jnp.zeros((8, 3), F32), np.array([6, 6], np.int32)).block_until_ready()
    with pytest.raises(Exception, match=r"rhs has shape \[2, 3, 3\], expected \[2, 4, 3\]"):
        gmm_jit(lhs, jnp.zeros((2, 3, 3), F32), np.array([4, 4], np.int32)).block_until_ready()
    with pytest.raises(Exception, match="row 0 has range"):              # a range past n
        kjax.topk(np.ones((1, 5), np.float32), 2, row_ends=np.array([9], np.int32)).block_until_ready()


def test_the_handler_checks_what_it_is_given():
    """The FFI target called directly, past the Python checks: the handler
    returns kreg's errors as FFI errors."""
    kernel, config, threads = kjax.choice("topk", {"batch": 2, "n": 5, "k": 2}, dtype="input=f32")
    attrs = dict(kernel=kernel, config=config, threads=np.int64(threads), largest=np.int64(1),
                 has_row_starts=np.int64(0), has_row_ends=np.int64(0))

    def call(x, k, index_dtype=jnp.int32):
        outs = (jax.ShapeDtypeStruct(x.shape[:-1] + (k,), x.dtype), jax.ShapeDtypeStruct(x.shape[:-1] + (k,), index_dtype))
        return jax.ffi.ffi_call("kreg_topk", outs)(x, **attrs)

    assert np.asarray(call(jnp.arange(10, dtype=F32).reshape(2, 5), 2)[1]).tolist() == [[4, 3], [4, 3]]
    with pytest.raises(Exception, match=r"k"):                           # k > n
        jax.block_until_ready(call(jnp.zeros((2, 5), F32), 6))
    with pytest.raises(Exception, match="not one kreg speaks"):          # a dtype kreg has no name for
        jax.block_until_ready(call(jnp.zeros((2, 5), jnp.float16), 2))
    with pytest.raises(Exception, match="indices"):                      # the wrong dtype for indices
        jax.block_until_ready(call(jnp.zeros((2, 5), F32), 2, F32))
    with pytest.raises(Exception, match="gmm/"):                         # a kernel of another op
        jax.block_until_ready(jax.ffi.ffi_call("kreg_topk", (jax.ShapeDtypeStruct((2, 2), F32),
                                                             jax.ShapeDtypeStruct((2, 2), jnp.int32)))(
            jnp.zeros((2, 5), F32), **{**attrs, "kernel": "gmm/reference", "config": ""}))
