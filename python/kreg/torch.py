"""kreg's top-k and grouped matmuls as PyTorch operators.

    import torch, kreg.torch

    values, indices = torch.ops.kreg.topk(logits, 8)              # or kreg.torch.topk
    out = torch.ops.kreg.gmm(lhs, rhs, group_sizes)               # rows of group g times rhs[g]
    grad_rhs = torch.ops.kreg.tgmm(lhs.t().contiguous(), dout, group_sizes)

Importing this module registers ``torch.ops.kreg.topk``, ``gmm`` and
``tgmm`` with ``torch.library``: each has a fake (meta) implementation, so
shapes propagate under ``torch.compile(fullgraph=True)`` and
``torch.export``, and an autograd formula (docs/DESIGN.md, "Framework
bindings"). Every call goes through one kreg Dispatcher: the table's choice
for its shape on this machine, remembered per shape. ``use(dispatcher)``
sets that Dispatcher (default: ``kreg.Dispatcher()``, the shipped tables
with those on ``KREG_TABLE_PATH``).

The ops' CPU and CUDA kernels are C++ (python/src/torch/ops.cc): tensors
are read and written where they lie, and a call costs PyTorch's dispatch,
the Dispatcher's remembered answer and the kernel. CUDA tensors run kreg's
CUDA kernels (the table's answer for that GPU) on PyTorch's current
stream, not waited for, as PyTorch's own ops; there, group sizes and row
ranges are not validated (the kernels clamp them). Semantics are kreg's ops'
(``kreg list``): top-k returns int32 indices
(``torch.topk``: int64), orders NaN above +inf and ties by ascending index,
pads a row range shorter than k with index -1; gmm/tgmm take int32
``group_sizes``, float32 or ``torch.bfloat16`` inputs of one
dtype, ``out_dtype`` for the output (default: the inputs'). A call's tensors
must all be on one device (the CPU or one GPU), contiguous in their last
dimension (others are copied once).
Bad arguments raise kreg's one-line message as ValueError.
"""

import ctypes
import os
import threading

import torch

import kreg

__all__ = ["topk", "gmm", "tgmm", "use", "dispatcher"]

_lock = threading.Lock()
_dispatcher = None
_used = []  # every Dispatcher handed to the shim, alive for calls in flight on other threads


def use(dispatcher):
    """Routes every torch.ops.kreg call through ``dispatcher`` (a
    kreg.Dispatcher); returns the one it replaces."""
    global _dispatcher
    if not isinstance(dispatcher, kreg.Dispatcher):
        raise TypeError(f"kreg.torch.use: expected a kreg.Dispatcher, got {type(dispatcher).__name__}")
    with _lock:
        previous, _dispatcher = _dispatcher, dispatcher
        _used.append(dispatcher)
        _shim.kreg_torch_use(*dispatcher._dispatcher._bridge())
    return previous


def dispatcher():
    """The Dispatcher torch.ops.kreg calls go through."""
    global _dispatcher
    if _dispatcher is None:
        use(kreg.Dispatcher())
    return _dispatcher


# The C++ shim (python/src/torch/ops.cc) defines the ops and their CPU and
# CUDA kernels, which run through the bridge into the Dispatcher.
_SHIM = os.path.join(os.path.dirname(__file__), "_kreg_torch.so")
if not os.path.exists(_SHIM):
    raise ImportError(f"kreg.torch: {_SHIM} is missing: this kreg was built without PyTorch (configure with "
                      "KREG_FRAMEWORK_PYTHON set to a Python that has torch; scripts/venv.sh makes one)")
torch.ops.load_library(_SHIM)
_shim = ctypes.CDLL(_SHIM)
_shim.kreg_torch_use.argtypes = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t]
_shim.kreg_torch_use.restype = None


# ---- Shapes ------------------------------------------------------------------------


def _topk_shapes(input, k):
    if input.dim() != 2:
        raise ValueError(f"kreg.topk: input must be [batch, n], got {input.dim()} dimensions")
    return (input.shape[0], k)


def _gmm_shape(lhs, rhs, transpose_rhs):
    if lhs.dim() != 2 or rhs.dim() != 3:
        raise ValueError(f"kreg.gmm: lhs must be [m, k] and rhs [groups, k, n], got {lhs.dim()} and {rhs.dim()} "
                         "dimensions")
    return (lhs.shape[0], rhs.shape[1] if transpose_rhs else rhs.shape[2])


def _tgmm_shape(lhs, rhs, group_sizes, local_groups):
    if lhs.dim() != 2 or rhs.dim() != 2 or group_sizes.dim() != 1:
        raise ValueError("kreg.tgmm: lhs must be [k, m], rhs [m, n] and group_sizes [groups]")
    return (group_sizes.shape[0] if local_groups is None else local_groups, lhs.shape[0], rhs.shape[1])


# ---- Fake implementations: shapes and dtypes only, for torch.compile and export --


@torch.library.register_fake("kreg::topk")
def _topk_fake(input, k, largest=True, row_starts=None, row_ends=None):
    shape = _topk_shapes(input, k)
    return input.new_empty(shape), input.new_empty(shape, dtype=torch.int32)


@torch.library.register_fake("kreg::gmm")
def _gmm_fake(lhs, rhs, group_sizes, transpose_rhs=False, group_offset=0, existing_out=None, out_dtype=None):
    return lhs.new_empty(_gmm_shape(lhs, rhs, transpose_rhs), dtype=out_dtype or lhs.dtype)


@torch.library.register_fake("kreg::tgmm")
def _tgmm_fake(lhs, rhs, group_sizes, group_offset=0, local_groups=None, out_dtype=None):
    return lhs.new_empty(_tgmm_shape(lhs, rhs, group_sizes, local_groups), dtype=out_dtype or lhs.dtype)


# ---- Autograd (docs/DESIGN.md, "Framework bindings") -----------------------------


def _topk_setup(ctx, inputs, output):
    input = inputs[0]
    ctx.shape, ctx.dtype = input.shape, input.dtype
    ctx.save_for_backward(output[1])


def _topk_backward(ctx, grad_values, grad_indices):
    (indices,) = ctx.saved_tensors
    if grad_values is None or indices.numel() == 0:
        return indices.new_zeros(ctx.shape, dtype=ctx.dtype), None, None, None, None
    # Padding (-1, past a short row range) receives nothing: a column n is
    # added to scatter into, then cut off.
    n = ctx.shape[1]
    index = torch.where(indices >= 0, indices, n).long()
    wide = grad_values.new_zeros((ctx.shape[0], n + 1), dtype=ctx.dtype)
    wide.scatter_add_(1, index, grad_values.to(ctx.dtype))
    return wide[:, :n], None, None, None, None


def _pair(a, b):
    """Two operands in one dtype: float32 where theirs differ (a bf16 rhs, a
    float32 gradient), as kreg's grouped matmuls take one dtype."""
    return (a, b) if a.dtype == b.dtype else (a.float(), b.float())


def _gmm_setup(ctx, inputs, output):
    lhs, rhs, group_sizes, transpose_rhs, group_offset, existing_out, _ = inputs
    ctx.transpose_rhs, ctx.group_offset = transpose_rhs, group_offset
    ctx.has_existing = existing_out is not None
    ctx.save_for_backward(lhs, rhs, group_sizes)


def _gmm_backward(ctx, grad):
    lhs, rhs, group_sizes = ctx.saved_tensors
    grad = grad.contiguous()
    grad_lhs = grad_rhs = None
    if ctx.needs_input_grad[0]:
        # d(lhs)[rows of g] = d(out)[rows] . W_g^T, W_g = rhs[g] (or rhs[g]^T).
        g, w = _pair(grad, rhs)
        grad_lhs = gmm(g, w, group_sizes, transpose_rhs=not ctx.transpose_rhs,
                       group_offset=ctx.group_offset).to(lhs.dtype)
    if ctx.needs_input_grad[1]:
        g, x = _pair(grad, lhs)
        if ctx.transpose_rhs:  # d(rhs[g]) = d(out)[rows]^T . lhs[rows]: [n, k]
            a, b = g.t().contiguous(), x
        else:  # d(rhs[g]) = lhs[rows]^T . d(out)[rows]: [k, n]
            a, b = x.t().contiguous(), g
        grad_rhs = tgmm(a, b, group_sizes, group_offset=ctx.group_offset, local_groups=rhs.shape[0]).to(rhs.dtype)
    grad_existing = grad if ctx.has_existing and ctx.needs_input_grad[5] else None
    return grad_lhs, grad_rhs, None, None, None, grad_existing, None


def _tgmm_setup(ctx, inputs, output):
    lhs, rhs, group_sizes, group_offset, _, _ = inputs
    ctx.group_offset = group_offset
    ctx.save_for_backward(lhs, rhs, group_sizes)


def _tgmm_backward(ctx, grad):
    lhs, rhs, group_sizes = ctx.saved_tensors
    grad = grad.contiguous()
    grad_lhs = grad_rhs = None
    if ctx.needs_input_grad[0]:
        # d(lhs)[:, rows of g] = d(out[i]) . rhs[rows]^T, so d(lhs)^T[rows] =
        # rhs[rows] . d(out[i])^T: a gmm with transpose_rhs over [k, n] blocks.
        r, g = _pair(rhs, grad)
        grad_lhs = gmm(r, g, group_sizes, transpose_rhs=True, group_offset=ctx.group_offset).t().to(lhs.dtype)
    if ctx.needs_input_grad[1]:
        # d(rhs)[rows of g] = lhs[:, rows]^T . d(out[i]).
        x, g = _pair(lhs, grad)
        grad_rhs = gmm(x.t().contiguous(), g, group_sizes, group_offset=ctx.group_offset).to(rhs.dtype)
    return grad_lhs, grad_rhs, None, None, None, None


torch.library.register_autograd("kreg::topk", _topk_backward, setup_context=_topk_setup)
torch.library.register_autograd("kreg::gmm", _gmm_backward, setup_context=_gmm_setup)
torch.library.register_autograd("kreg::tgmm", _tgmm_backward, setup_context=_tgmm_setup)


# ---- The Python front -------------------------------------------------------------


def topk(input, k, largest=True, row_starts=None, row_ends=None):
    """The k best of each row of ``input`` [batch, n], best first: (values,
    int32 indices). Differentiable in ``input``."""
    return torch.ops.kreg.topk(input, k, largest, row_starts, row_ends)


def gmm(lhs, rhs, group_sizes, *, transpose_rhs=False, group_offset=0, existing_out=None, out_dtype=None):
    """out[rows of group g] = lhs[rows] @ rhs[g - group_offset] (rhs[g]^T with
    ``transpose_rhs``) + existing_out; other rows existing_out or 0.
    Differentiable in lhs, rhs and existing_out."""
    return torch.ops.kreg.gmm(lhs, rhs, group_sizes, transpose_rhs, group_offset, existing_out, out_dtype)


def tgmm(lhs, rhs, group_sizes, *, group_offset=0, local_groups=None, out_dtype=None):
    """out[g - group_offset] = lhs[:, rows of g] @ rhs[rows of g] for the
    local groups: lhs [k, m], rhs [m, n] -> [local_groups, k, n].
    Differentiable in lhs and rhs."""
    return torch.ops.kreg.tgmm(lhs, rhs, group_sizes, group_offset, local_groups, out_dtype)


dispatcher()  # the shim's calls need one from the start
