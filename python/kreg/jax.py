"""kreg's topk, gmm and tgmm as JAX operations: XLA FFI custom calls (CPU, CUDA).

    import jax, jax.numpy as jnp, kreg.jax

    values, indices = jax.jit(lambda x: kreg.jax.topk(x, 64))(x)
    out = kreg.jax.gmm(lhs, rhs, group_sizes)              # lhs [m, k], rhs [groups, k, n]
    grads = jax.grad(lambda l, r: kreg.jax.gmm(l, r, gs).sum(), (0, 1))(lhs, rhs)

The handlers live in ``libkreg_xla.so`` beside this file (a C library: XLA's
FFI and kreg's registry, no Python), registered for the CPU and CUDA platforms
as ``kreg_topk``, ``kreg_gmm`` and ``kreg_tgmm``. Which kernel runs is asked
of the tuning tables once per traced shape, at trace time (``TuningDb.query``:
the shipped tables, with ``use_table(path)``'s in front), and handed to the
handler as attributes (kernel, configuration, threads); the handler parses
each configuration once. Where JAX and kreg both see a CUDA GPU, each call is
a ``jax.lax.platform_dependent`` of two: the CPU table's answer for the CPU,
the GPU's (``device="cuda"``) for CUDA, whose handler takes XLA's device
buffers in place and runs on XLA's stream. gmm's and tgmm's tables are keyed
by a data class that their group sizes decide, which a trace does not see: the
trace asks for ``balanced`` (every computed group at most twice the mean), the
common case of a trained router.

Semantics are kreg's (``kreg list``; docs/DESIGN.md §4): top-k ranks NaN
above +inf, equal values by ascending index, short row ranges fill with -1
and ∓inf; gmm's rows past the groups and those of groups outside
``[group_offset, group_offset + local_groups)`` are ``existing_out`` or 0.
Gradients (``jax.custom_vjp``) and ``jax.vmap`` are described on each
function and in docs/DESIGN.md ("Framework bindings"). Errors are kreg's
one-line messages: at trace time as ValueError (k > n, a dtype kreg does not
take), at run time (negative group sizes, rows past m) as JAX's runtime
error carrying them.
"""

import ctypes
import functools
import math
import operator
import os

import jax
import jax.numpy as jnp
import numpy as np

from . import TuningDb, _registry, machine

__all__ = ["topk", "gmm", "tgmm", "use_table", "choice"]

_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libkreg_xla.so")
_TARGETS = {"topk": "kreg_topk", "gmm": "kreg_gmm", "tgmm": "kreg_tgmm"}


def _register():
    if not os.path.exists(_LIBRARY):
        raise ImportError(f"kreg.jax: {_LIBRARY} is missing: kreg builds it where CMake's KREG_FRAMEWORK_PYTHON "
                          "names a Python with jax")
    lib = ctypes.CDLL(_LIBRARY)
    for op, target in _TARGETS.items():
        for platform in ("cpu", "CUDA"):
            handler = getattr(lib, f"kreg_xla_{op}_{platform.lower()}")
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(handler), platform=platform)
    return lib


def _has_cuda():
    """Whether JAX and kreg both see a CUDA GPU. Where only JAX does, calls
    lower the CPU's answer for every platform, which the CUDA handler
    refuses (a CPU kernel), naming it."""
    try:
        jax_gpus = jax.devices("cuda")
    except RuntimeError:  # no CUDA backend in this jaxlib, or no GPU
        return False
    return bool(jax_gpus) and bool(machine()["gpus"])


_lib = _register()
_CUDA = _has_cuda()
_table = TuningDb()


def use_table(path=None):
    """Asks ``path``'s table (in front of the shipped ones) from now on;
    None: the shipped tables alone. Shapes traced already keep their answer
    (jit's cache holds it)."""
    global _table
    _table = TuningDb() if path is None else TuningDb(path)
    _answer.cache_clear()


_DTYPES = {jnp.dtype(jnp.float32): "f32", jnp.dtype(jnp.bfloat16): "bf16", jnp.dtype(jnp.int32): "i32"}


def _dtype_name(dtype):
    """kreg's name for a JAX dtype; other dtypes keep numpy's name, which
    kreg refuses with its own message."""
    return _DTYPES.get(jnp.dtype(dtype), jnp.dtype(dtype).name)


@functools.lru_cache(maxsize=4096)
def _answer(op, dims, dtype, with_, data_class, device):
    answer = _table.query(op, dict(dims), dtype=dtype, with_=with_, data_class=data_class, registry=_registry(None),
                          device=device, record=True)
    config = " ".join(f"{name}={','.join(map(str, v)) if isinstance(v, list) else v}"
                      for name, v in answer["params"].items())
    return answer["kernel"], config, int(answer["threads"])


def choice(op, dims, *, dtype, with_="", data_class="", device="cpu"):
    """What a trace of ``op`` with ``dims`` (a dict of dims and integer
    attributes, as ``kreg query``) runs on ``device`` ("cpu" or "cuda"):
    (kernel, config, threads)."""
    return _answer(op, tuple(sorted(dims.items())), dtype, with_, data_class, device)


def _call(op, dims, operands, outs, attrs, vmap_method, **query):
    """The custom call of ``op`` on ``operands`` giving ``outs``, with
    ``attrs``; on each platform JAX lowers it for, it runs what the tables
    answer there for ``dims`` and ``query`` (choice's dtype, with_,
    data_class)."""
    def on(device):
        kernel, config, threads = choice(op, dims, **query, device=device)
        call = jax.ffi.ffi_call(_TARGETS[op], outs, vmap_method=vmap_method)
        return lambda *xs: call(*xs, kernel=kernel, config=config, threads=np.int64(threads), **attrs)

    if not _CUDA:
        return on("cpu")(*operands)
    return jax.lax.platform_dependent(*operands, cpu=on("cpu"), cuda=on("cuda"))


def _i64(value):
    return np.int64(int(value))


# ---- topk -------------------------------------------------------------------------------------------------------


def _topk_call(x, row_starts, row_ends, k, largest):
    lead, n = x.shape[:-1], x.shape[-1]
    present = [(name, a) for name, a in (("row_starts", row_starts), ("row_ends", row_ends)) if a is not None]
    dims = {"batch": math.prod(lead), "n": n, "k": k, "largest": int(largest)}
    outs = (jax.ShapeDtypeStruct(lead + (k,), x.dtype), jax.ShapeDtypeStruct(lead + (k,), jnp.int32))
    attrs = {"largest": _i64(largest), "has_row_starts": _i64(row_starts is not None),
             "has_row_ends": _i64(row_ends is not None)}
    # The handler folds leading dims into batch, so vmap only adds one more.
    return _call("topk", dims, (x, *(a for _, a in present)), outs, attrs, "broadcast_all",
                 dtype=f"input={_dtype_name(x.dtype)}", with_=",".join(name for name, _ in present))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _topk(x, row_starts, row_ends, k, largest):
    return _topk_call(x, row_starts, row_ends, k, largest)


def _topk_fwd(x, row_starts, row_ends, k, largest):
    values, indices = _topk_call(x, row_starts, row_ends, k, largest)
    return (values, indices), (indices, x.shape[-1])


def _topk_bwd(k, largest, res, cotangents):
    indices, n = res
    d_values = cotangents[0]
    # Each chosen element gets its value's cotangent; -1 (a short range's
    # fill) points past the row and is dropped.
    where = jnp.where(indices < 0, n, indices)
    zeros = jnp.zeros(indices.shape[:-1] + (n,), d_values.dtype)
    d_x = jax.vmap(lambda z, i, d: z.at[i].set(d, mode="drop"))(
        zeros.reshape(-1, n), where.reshape(-1, where.shape[-1]), d_values.reshape(-1, d_values.shape[-1]))
    return d_x.reshape(zeros.shape), None, None


_topk.defvjp(_topk_fwd, _topk_bwd)


def topk(x, k, largest=True, row_starts=None, row_ends=None):
    """The k largest (``largest=False``: smallest) elements of each row of
    ``x`` [..., n] (float32 or bfloat16) and their columns: (values [..., k]
    in x's dtype, indices [..., k] int32). ``row_starts`` / ``row_ends``
    (int32 [...]) limit each row to columns [start, end); a range with fewer
    than k elements fills its tail with index -1 and -inf (+inf smallest).
    Order as kreg's: NaN of either sign above +inf, -0 equal to +0, ties by
    ascending index.

    Leading dims fold into kreg's batch; ``jax.vmap`` adds its axis to them
    (one kreg call). Gradient: the values' cotangent scattered to the chosen
    indices, zero elsewhere (indices and the ranges have none)."""
    x = jnp.asarray(x)
    if x.ndim == 0:
        raise ValueError("kreg.jax.topk: x must have at least one dim [..., n]")
    k = operator.index(k)
    ranges = [None if a is None else jnp.asarray(a) for a in (row_starts, row_ends)]
    for name, a in zip(("row_starts", "row_ends"), ranges):
        if a is not None and a.shape != x.shape[:-1]:
            raise ValueError(f"kreg.jax.topk: {name} has shape {a.shape}; expected x's leading dims {x.shape[:-1]}")
    return _topk(x, ranges[0], ranges[1], k, bool(largest))


# ---- gmm and tgmm ------------------------------------------------------------------------------------------------


def _gmm_call(lhs, rhs, group_sizes, existing_out, transpose_rhs, group_offset, out_dtype):
    m, k = lhs.shape
    local_groups = rhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    dims = {"m": m, "k": k, "n": n, "groups": group_sizes.shape[0], "local_groups": local_groups,
            "transpose_rhs": int(transpose_rhs), "group_offset": group_offset}
    dtype = f"lhs={_dtype_name(lhs.dtype)},rhs={_dtype_name(rhs.dtype)},out={_dtype_name(out_dtype)}"
    extra = () if existing_out is None else (existing_out,)
    attrs = {"transpose_rhs": _i64(transpose_rhs), "group_offset": _i64(group_offset),
             "has_existing_out": _i64(existing_out is not None)}
    # vmap runs one call per element (each batch member has its own groups).
    return _call("gmm", dims, (lhs, rhs, group_sizes, *extra), jax.ShapeDtypeStruct((m, n), out_dtype), attrs,
                 "sequential", dtype=dtype, with_="existing_out" if existing_out is not None else "",
                 data_class="balanced")


def _tgmm_call(lhs, rhs, group_sizes, group_offset, local_groups, out_dtype):
    k, m = lhs.shape
    n = rhs.shape[1]
    dims = {"k": k, "m": m, "n": n, "groups": group_sizes.shape[0], "local_groups": local_groups,
            "group_offset": group_offset}
    dtype = f"lhs={_dtype_name(lhs.dtype)},rhs={_dtype_name(rhs.dtype)},out={_dtype_name(out_dtype)}"
    return _call("tgmm", dims, (lhs, rhs, group_sizes), jax.ShapeDtypeStruct((local_groups, k, n), out_dtype),
                 {"group_offset": _i64(group_offset)}, "sequential", dtype=dtype, data_class="balanced")


def _alike(a, b):
    """a and b in one dtype, as kreg's gmm takes lhs and rhs: float32 where
    they differ (a bf16 operand and a float32 cotangent)."""
    if a.dtype == b.dtype:
        return a, b
    return a.astype(jnp.float32), b.astype(jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _gmm(lhs, rhs, group_sizes, existing_out, transpose_rhs, group_offset, out_dtype):
    return _gmm_call(lhs, rhs, group_sizes, existing_out, transpose_rhs, group_offset, out_dtype)


def _gmm_fwd(lhs, rhs, group_sizes, existing_out, transpose_rhs, group_offset, out_dtype):
    out = _gmm_call(lhs, rhs, group_sizes, existing_out, transpose_rhs, group_offset, out_dtype)
    # () or None: the tree structure, static, says whether there was one.
    return out, (lhs, rhs, group_sizes, None if existing_out is None else ())


def _gmm_bwd(transpose_rhs, group_offset, out_dtype, res, d_out):
    lhs, rhs, group_sizes, had_existing = res
    local_groups = rhs.shape[0]
    g, r = _alike(d_out, rhs)
    # d lhs[rows of g] = d_out[rows] . rhs[g]^T: gmm with the other transpose.
    d_lhs = _gmm_call(g, r, group_sizes, None, not transpose_rhs, group_offset, lhs.dtype)
    if transpose_rhs:  # rhs[g] [n, k]: d rhs[g] = d_out[rows]^T . lhs[rows], tgmm(d_out^T, lhs)
        a, b = _alike(d_out.T, lhs)
    else:  # rhs[g] [k, n]: d rhs[g] = lhs[rows]^T . d_out[rows], tgmm(lhs^T, d_out)
        a, b = _alike(lhs.T, d_out)
    d_rhs = _tgmm_call(a, b, group_sizes, group_offset, local_groups, rhs.dtype)
    return d_lhs, d_rhs, None, None if had_existing is None else d_out


_gmm.defvjp(_gmm_fwd, _gmm_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _tgmm(lhs, rhs, group_sizes, group_offset, local_groups, out_dtype):
    return _tgmm_call(lhs, rhs, group_sizes, group_offset, local_groups, out_dtype)


def _tgmm_fwd(lhs, rhs, group_sizes, group_offset, local_groups, out_dtype):
    return _tgmm_call(lhs, rhs, group_sizes, group_offset, local_groups, out_dtype), (lhs, rhs, group_sizes)


def _tgmm_bwd(group_offset, local_groups, out_dtype, res, d_out):
    lhs, rhs, group_sizes = res
    # d lhs[:, rows of g] = d_out[i] . rhs[rows]^T: gmm(rhs, d_out as [n, k]
    # per group, transpose_rhs) gives its transpose [m, k].
    a, b = _alike(rhs, d_out)
    d_lhs = _gmm_call(a, b, group_sizes, None, True, group_offset, lhs.dtype).T
    # d rhs[rows of g] = lhs[:, rows]^T . d_out[i]: gmm(lhs^T, d_out).
    a, b = _alike(lhs.T, d_out)
    d_rhs = _gmm_call(a, b, group_sizes, None, False, group_offset, rhs.dtype)
    return d_lhs, d_rhs, None


_tgmm.defvjp(_tgmm_fwd, _tgmm_bwd)


def _out_dtype(name, preferred_element_type, default):
    dtype = jnp.dtype(default if preferred_element_type is None else preferred_element_type)
    if dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        raise ValueError(f"kreg.jax.{name}: preferred_element_type {dtype} is not float32 or bfloat16")
    return dtype


def gmm(lhs, rhs, group_sizes, *, transpose_rhs=False, group_offset=0, existing_out=None,
        preferred_element_type=None):
    """Grouped matmul, as megablox's gmm: ``lhs`` [m, k] rows in consecutive
    groups of ``group_sizes`` [groups] int32; ``rhs`` [local_groups, k, n]
    ([local_groups, n, k] with ``transpose_rhs``) for the groups
    ``[group_offset, group_offset + local_groups)`` (a static int: kreg's
    attribute); out [m, n] = existing_out + lhs[rows of g] . rhs[g -
    group_offset], every other row existing_out or 0. ``preferred_element_type``:
    out's dtype (float32 or bfloat16; default existing_out's, else lhs's).

    Gradients: d lhs = gmm(d_out, rhs, transpose_rhs=not transpose_rhs);
    d rhs = tgmm(lhs^T, d_out) ([k, m]: lhs is transposed, a copy), with
    transpose_rhs tgmm(d_out^T, lhs); d existing_out = d_out. ``jax.vmap``
    runs one kreg call per batch element (each has its own groups)."""
    lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
    existing_out = None if existing_out is None else jnp.asarray(existing_out)
    default = existing_out.dtype if existing_out is not None else lhs.dtype
    out_dtype = _out_dtype("gmm", preferred_element_type, default)
    if lhs.ndim != 2 or rhs.ndim != 3 or group_sizes.ndim != 1:
        raise ValueError(f"kreg.jax.gmm: expected lhs [m, k], rhs [local_groups, k, n], group_sizes [groups]; got "
                         f"{lhs.shape}, {rhs.shape}, {group_sizes.shape}")
    return _gmm(lhs, rhs, group_sizes, existing_out, bool(transpose_rhs), operator.index(group_offset), out_dtype)


def tgmm(lhs, rhs, group_sizes, *, group_offset=0, num_actual_groups=None, preferred_element_type=None):
    """Transposed grouped matmul, as megablox's tgmm: ``lhs`` [k, m],
    ``rhs`` [m, n], rows of m in consecutive groups of ``group_sizes``;
    out [local_groups, k, n], out[i] = lhs[:, rows of g] . rhs[rows of g, :]
    for g = group_offset + i, zeros for an empty group. ``num_actual_groups``
    is local_groups (default: groups - group_offset); ``preferred_element_type``
    out's dtype (default lhs's).

    Gradients: d lhs = gmm(rhs, d_out, transpose_rhs=True)^T (a transpose,
    copied); d rhs = gmm(lhs^T, d_out) (lhs transposed, a copy). ``jax.vmap``
    runs one kreg call per batch element."""
    lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
    out_dtype = _out_dtype("tgmm", preferred_element_type, lhs.dtype)
    if lhs.ndim != 2 or rhs.ndim != 2 or group_sizes.ndim != 1:
        raise ValueError(f"kreg.jax.tgmm: expected lhs [k, m], rhs [m, n], group_sizes [groups]; got "
                         f"{lhs.shape}, {rhs.shape}, {group_sizes.shape}")
    group_offset = operator.index(group_offset)
    local_groups = (group_sizes.shape[0] - group_offset if num_actual_groups is None
                    else operator.index(num_actual_groups))
    return _tgmm(lhs, rhs, group_sizes, group_offset, local_groups, out_dtype)
