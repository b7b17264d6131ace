"""kreg's top-k and grouped matmuls as PyTorch operators.

    import torch, kreg.torch

    values, indices = torch.ops.kreg.topk(logits, 8)              # or kreg.torch.topk
    out = torch.ops.kreg.gmm(lhs, rhs, group_sizes)               # rows of group g times rhs[g]
    grad_rhs = torch.ops.kreg.tgmm(lhs.t().contiguous(), dout, group_sizes)

Importing this module registers ``torch.ops.kreg.topk``, ``gmm`` and
``tgmm`` with ``torch.library``: each has a fake (meta) implementation, so
shapes propagate under ``torch.compile(fullgraph=True)`` and
``torch.export``, and an autograd formula in C++ (docs/DESIGN.md §9,
Framework bindings). Every call goes through one kreg Dispatcher: the table's choice
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


# The C++ shim (python/src/torch) defines the ops, their CPU and CUDA
# kernels, which run through the bridge into the Dispatcher, and their
# autograd kernels.
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
