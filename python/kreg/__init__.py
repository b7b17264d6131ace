"""kreg from Python: run any kernel on your arrays, ask a tuning table, tune.

    import numpy as np, kreg

    x = np.random.default_rng(0).standard_normal((8, 4096), dtype=np.float32)
    out = kreg.run("topk/heap", input=x, k=64)          # {"values": ..., "indices": ...}
    db = kreg.TuningDb("topk.lut")
    db.query("topk", {"batch": 8, "n": 4096, "k": 64})   # as `kreg query --json`
    kreg.Dispatcher(db).run("topk", input=x, k=64)      # the table's choice
    kreg.tune("topk", {"batch": 8, "n": 4096, "k": 64}, "topk.lut", budget=30)

Arrays are NumPy arrays, PyTorch tensors, JAX or CuPy arrays: anything with
the buffer protocol or ``__dlpack__``; they are used where they are, never
copied. CUDA arrays (a ``__dlpack__`` on a CUDA device) run kreg's CUDA
kernels on their device, in place, on ``stream=`` (a CUDA stream's handle,
``torch.cuda.current_stream().cuda_stream``; default 0, the legacy default
stream), not waited for: work the caller enqueues on that stream after the
call sees its results. Their outputs are the caller's (``out=``). An op's tensors, dims and attributes are keyword arguments named as
the op declares them (``kreg list`` or ``Registry().ops()``); dims an array
gives may be left out. Outputs come back as a dict of NumPy arrays, or are
written into yours with ``out={"values": array, ...}``. bfloat16 travels as
PyTorch's ``torch.bfloat16`` or as NumPy ``uint16`` arrays holding the bits
(``float32_to_bf16`` / ``bf16_to_float32``); bf16 outputs come back as such.

Errors are exceptions carrying kreg's one-line message: ValueError for bad
arguments, FileNotFoundError / OSError for files, MemoryError, RuntimeError.
Messages go to stderr at the level of ``KREG_LOG`` or ``set_log_level``.
"""

from . import _kreg
from ._kreg import Kernel, install_prefix, log_level, machine, set_log_level

__version__ = _kreg.__version__  # CMakeLists.txt's project(kreg VERSION ...)

__all__ = [
    "Registry", "Kernel", "TuningDb", "Dispatcher", "run", "tune", "machine", "install_prefix",
    "set_log_level", "log_level", "bf16_to_float32", "float32_to_bf16",
]


class Registry(_kreg.Registry):
    """The kernels of the plugins found beside kreg's library (or installed
    with it), then on ``plugin_path`` (a path, a colon-separated list, or a
    list) and ``KREG_PLUGIN_PATH``.

    ``kernels(op="")``, ``kernel(name)``, ``kernel_info(name)`` (as in ``kreg
    list --json``), ``ops()``, ``files``, ``refusals`` (plugins refused, and
    why), and ``run(kernel, *, params={}, out=None, dtype="", threads=0,
    device=None, stream=None, **args)``."""


_default_registry = None


def _registry(registry):
    global _default_registry
    if registry is not None:
        return registry
    if _default_registry is None:
        _default_registry = Registry()
    return _default_registry


def run(kernel, *, registry=None, params=None, out=None, dtype="", threads=0, device=None, stream=None, **args):
    """Runs ``kernel`` ("op/variant") once on ``args``; returns {output: array}.

    ``params``: the kernel's parameters ({"simd": "avx2"}), its defaults
    otherwise; ``dtype``: for tensors no array decides (``kreg run --dtype``);
    ``threads``: 0 for all cores; ``device``: where the arrays are by
    default; ``"cuda"`` with host arrays runs a CUDA kernel on GPU 0, the
    arrays copied there and its outputs back. On CUDA arrays (all on one
    device, every output given in ``out``) the kernel runs there in place,
    enqueued on ``stream`` (a handle; default 0, the legacy default stream)
    and not waited for."""
    return _registry(registry).run(kernel, params=params or {}, out=out, dtype=dtype, threads=threads,
                                   device=device or "", stream=stream, **args)


class TuningDb:
    """A tuning table (a file ``kreg tune`` wrote, text or binary), or an
    empty one. ``len(db)``, ``summary()``, ``to_json()`` (protobuf's JSON),
    ``to_csv()`` (a row per trial), ``query(...)``."""

    def __init__(self, path=None):
        self._db = _kreg.TuningDb() if path is None else _kreg.TuningDb(str(path))

    @property
    def path(self):
        return self._db.path or None

    def __len__(self):
        return len(self._db)

    def __repr__(self):
        return f"<kreg.TuningDb {self.path or '(empty)'}: {len(self)} problems>"

    def summary(self):
        return self._db.summary()

    def to_json(self):
        return self._db.to_json()

    def to_csv(self):
        return self._db.to_csv()

    def query(self, op, dims, *, dtype="", with_="", data_class="", threads=0, machine="similar",
              shipped=True, device="cpu", registry=None, record=False):
        """What the table answers for ``op`` with ``dims`` ({"batch": 8, ...}
        or "batch=8,..."), exactly as ``kreg query --json``: kernel, params,
        match (exact, nearest, similar, default), why, ... and
        ``explanation``, the text ``kreg query`` prints in brackets.
        ``shipped``: the tables shipped with kreg answer behind this one;
        ``machine="strict"``: only this machine's measurements;
        ``device="cuda"``: the answer for this machine's GPU.
        ``record=True``: a query made for a run (as kreg.jax's at trace
        time) appends a shape not answered exactly to ``KREG_RECORD``'s
        file, as a Dispatcher's call does."""
        return self._db.query(_registry(registry), op, dims, dtype=dtype, with_=with_, data_class=data_class,
                              threads=threads, machine=machine, shipped=shipped, device=device, record=record)


class Dispatcher:
    """Runs, for each call, what the table picks for its shape on this
    machine (with the shipped tables behind it unless ``shipped=False``).
    ``db``: a TuningDb, a path, or None (the shipped tables alone).
    ``last``: what the last run ran (kernel, params, match). ``run(...,
    device="cuda")`` asks the table for the GPU and runs its choice there,
    the (host) arrays copied over and the outputs back; on CUDA arrays it
    does so in place on ``stream``, as ``kreg.run``."""

    def __init__(self, db=None, *, registry=None, machine="similar", shipped=True):
        if db is not None and not isinstance(db, TuningDb):
            db = TuningDb(db)
        self._registry = _registry(registry)
        self._dispatcher = _kreg.Dispatcher(self._registry, None if db is None else db._db, machine, shipped)

    def run(self, op, *, out=None, dtype="", threads=0, device=None, stream=None, **args):
        """Runs op ``op`` on ``args`` with the table's choice; returns
        {output: array}."""
        return self._dispatcher.run(op, out=out, dtype=dtype, threads=threads, device=device or "", stream=stream,
                                    **args)

    @property
    def last(self):
        return self._dispatcher.last


def tune(op, dims, db, *, registry=None, progress=None, strategy="halving", budget=0.0, reps=10, warmup=3,
         variants=(), dtype="", with_="", dist="normal", seed=1, threads=0, timeout=30.0, thread_round=True,
         data_class="", device="cpu"):
    """Tunes ``op`` for ``dims`` (one problem, or a list of them) into the
    table file ``db`` (created, or added to; checkpointed as it goes), as
    ``kreg tune`` does; returns ``kreg tune --json``'s record (a list for a
    list). ``progress(p)`` is called as candidates finish, with p's key,
    done, candidates, best, best_ns, elapsed_seconds, eta_seconds; an
    exception it raises (or Ctrl-C) stops the sweep, keeping what was
    measured. ``device="cuda"``: the op's CUDA kernels on GPU 0, keyed under
    the GPU."""
    return _kreg.tune(_registry(registry), op, dims, str(db), strategy=strategy, budget=budget, reps=reps,
                      warmup=warmup, variants=list(variants), dtype=dtype, with_=with_, dist=dist, seed=seed,
                      threads=threads, timeout=timeout, thread_round=thread_round, data_class=data_class,
                      device=device, progress=progress)


def bf16_to_float32(bits):
    """NumPy uint16 bf16 bits -> float32 values (exact). Anything but uint16
    bits (a float32 array, say) is a ValueError, not reinterpreted."""
    import numpy as np
    bits = np.asarray(bits)
    if bits.dtype != np.uint16:
        raise ValueError(f"bf16_to_float32: expected uint16 bf16 bits, got dtype {bits.dtype}")
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(values):
    """float32 values -> uint16 bf16 bits, rounded to nearest even (NaN kept
    NaN, its sign kept), as kreg rounds."""
    import numpy as np
    u = np.asarray(values, dtype=np.float32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)
