"""CUDA arrays taken in place (a __dlpack__ on kDLCUDA), on the host-memory
stand-in device: tests/plugins/host_device_backend.cc is the CUDA backend
(its "GPU" is this process's memory) and host_device_plugin.cc its kernels.
The arrays are FakeCudaArray: host memory that __dlpack__ reports on a CUDA
device. Each test runs in a process of its own, since the backend is chosen
once per process (KREG_CUDA_BACKEND): `python test_device_arrays.py CHECK
PLUGIN` runs one check_* function.
"""

import ctypes
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

# DLPack (dlpack/dlpack.h), as far as kreg reads it.
kDLCPU, kDLCUDA, kDLCUDAManaged = 1, 2, 13
DTYPES = {np.dtype(np.float32): (2, 32), np.dtype(np.int32): (0, 32)}  # (kDLFloat, bits), (kDLInt, bits)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class FakeCudaArray:
    """`host` (a NumPy array, kept compact) that DLPack reports on CUDA
    device `device_id`: what kreg sees of a GPU array, over memory the
    stand-in device reads. Records the stream each __dlpack__ was asked for."""

    def __init__(self, host, device_id=0, device_type=kDLCUDA):
        self.host = np.ascontiguousarray(host)
        self.device = (device_type, device_id)
        self.streams = []
        self._shape = (ctypes.c_int64 * max(self.host.ndim, 1))(*self.host.shape)
        code, bits = DTYPES[self.host.dtype]
        self._managed = DLManagedTensor()
        t = self._managed.dl_tensor
        t.data = self.host.ctypes.data
        t.device = DLDevice(device_type, device_id)
        t.ndim = self.host.ndim
        t.dtype = DLDataType(code, bits, 1)
        t.shape = self._shape  # strides NULL: compact

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        # No destructor: the tensor is this object's, which the call holds.
        return _capsule_new(ctypes.addressof(self._managed), b"dltensor", None)


def fake_like(shape, dtype, **kw):
    return FakeCudaArray(np.full(shape, -7, dtype), **kw)


def topk_reference(x, k):
    idx = np.argsort(-x, axis=1, kind="stable")[:, :k].astype(np.int32)
    return np.take_along_axis(x, idx, 1), idx


def stand_in(plugin):
    import kreg
    reg = kreg.Registry(plugin_path=plugin)
    backend = ctypes.CDLL(os.environ["KREG_CUDA_BACKEND"])  # the one kreg loaded
    backend.kreg_host_device_last_stream.restype = ctypes.c_void_p
    return kreg, reg, lambda: backend.kreg_host_device_last_stream() or 0


def tuned_dispatcher(kreg, reg):
    """A Dispatcher whose table answers topk/host_device for topk_call's
    shape on the stand-in GPU (its default would be the first CUDA kernel,
    topk/cuda_radix where it is built, which needs a real GPU)."""
    db = os.path.join(tempfile.mkdtemp(), "t.txtpb")
    kreg.tune("topk", {"batch": 6, "n": 300, "k": 20}, db, registry=reg, device="cuda", variants=["host_device"],
              strategy="exhaustive", reps=1, warmup=0)
    return kreg.Dispatcher(db, registry=reg, shipped=False)


def topk_call(k=20):
    x = np.random.default_rng(3).standard_normal((6, 300)).astype(np.float32)
    arrays = dict(input=FakeCudaArray(x))
    out = dict(values=fake_like((6, k), np.float32), indices=fake_like((6, k), np.int32))
    return x, arrays, out


# ---- checks, each run in a process of its own -------------------------------------

def check_registry_run_in_place(plugin):
    kreg, reg, last_stream = stand_in(plugin)
    x, arrays, out = topk_call()
    got = kreg.run("topk/host_device", registry=reg, out=out, k=20, **arrays)
    values, indices = topk_reference(x, 20)
    assert got["values"] is out["values"] and got["indices"] is out["indices"]
    assert (out["values"].host == values).all() and (out["indices"].host == indices).all()
    # Asked for on the stream kreg ran on: the legacy default stream, which
    # DLPack numbers 1 and CUDA's handle is 0.
    assert arrays["input"].streams == [1] and out["values"].streams == [1], arrays["input"].streams
    assert last_stream() == 0
    # A caller's stream: exported for it, run on it.
    x, arrays, out = topk_call()
    kreg.run("topk/host_device", registry=reg, out=out, k=20, stream=0x5eed, device="cuda", **arrays)
    assert arrays["input"].streams == [0x5eed] and out["indices"].streams == [0x5eed]
    assert last_stream() == 0x5eed
    assert (out["indices"].host == indices).all()
    # Managed memory is the device's too.
    managed = FakeCudaArray(x, device_type=kDLCUDAManaged)
    x2, _, out = topk_call()
    reg.run("topk/host_device", input=managed, k=20, out=out)
    assert (out["values"].host == values).all()


def check_gmm_in_place(plugin):
    kreg, reg, last_stream = stand_in(plugin)
    rng = np.random.default_rng(5)
    lhs = rng.standard_normal((8, 4)).astype(np.float32)
    rhs = rng.standard_normal((2, 4, 3)).astype(np.float32)
    sizes = np.array([3, 5], np.int32)
    want = np.concatenate([lhs[:3] @ rhs[0], lhs[3:] @ rhs[1]])
    out = fake_like((8, 3), np.float32)
    reg.run("gmm/host_device", lhs=FakeCudaArray(lhs), rhs=FakeCudaArray(rhs), group_sizes=FakeCudaArray(sizes),
            out={"out": out}, stream=77)
    assert np.allclose(out.host, want, rtol=1e-5, atol=1e-5), (out.host, want)
    assert last_stream() == 77


def check_dispatcher_in_place(plugin):
    kreg, reg, last_stream = stand_in(plugin)
    d = tuned_dispatcher(kreg, reg)
    x, arrays, out = topk_call()
    d.run("topk", out=out, k=20, stream=0xabc, **arrays)
    assert d.last["kernel"] == "topk/host_device", d.last
    assert (out["indices"].host == topk_reference(x, 20)[1]).all()
    assert arrays["input"].streams == [0xabc] and last_stream() == 0xabc
    # The same shape on host arrays is the CPU's: its own answer.
    d.run("topk", input=x, k=20)
    assert d.last["kernel"] != "topk/host_device", d.last


def check_bridge_on_stream(plugin):
    """kreg_bridge_run_on_stream, as a framework shim calls it (ctypes
    standing in for the shim): topk's layout, kreg/topk/layout.h."""
    kreg, reg, last_stream = stand_in(plugin)
    d = tuned_dispatcher(kreg, reg)
    _, dispatcher, run_on_stream = d._dispatcher._bridge()
    x, arrays, out = topk_call()
    tensors = (ctypes.POINTER(DLTensor) * 6)()  # input, row_starts, row_ends, values, indices, stats
    for i, a in ((0, arrays["input"]), (3, out["values"]), (4, out["indices"])):
        tensors[i] = ctypes.pointer(a._managed.dl_tensor)
    dims = (ctypes.c_int64 * 3)(6, 300, 20)  # batch, n, k
    attrs = (ctypes.c_int64 * 1)(1)          # largest

    class Args(ctypes.Structure):
        _fields_ = [("struct_size", ctypes.c_size_t), ("flags", ctypes.c_uint32), ("tensors", ctypes.c_void_p),
                    ("num_tensors", ctypes.c_size_t), ("dims", ctypes.c_void_p), ("num_dims", ctypes.c_size_t),
                    ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_size_t)]

    args = Args(ctypes.sizeof(Args), 0, ctypes.addressof(tensors), 6, ctypes.addressof(dims), 3,
                ctypes.addressof(attrs), 1)
    fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int32,
                          ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t)(run_on_stream)
    error = ctypes.create_string_buffer(512)
    assert fn(dispatcher, b"topk", ctypes.addressof(args), 0, 0x77, error, 512) == 0, error.value
    assert (out["indices"].host == topk_reference(x, 20)[1]).all() and last_stream() == 0x77
    # kreg's errors come back as a code and a line.
    assert fn(dispatcher, b"topk", ctypes.addressof(args), 3, 0x77, error, 512) == 1, error.value
    assert b"no CUDA device 3" in error.value, error.value


def check_errors(plugin):
    kreg, reg, _ = stand_in(plugin)

    def refused(match, **kw):
        with pytest.raises(ValueError, match=match):
            kreg.run(kw.pop("kernel", "topk/host_device"), registry=reg, k=20, **kw)

    x, arrays, out = topk_call()
    refused(r"'input' is on cuda:0 and out 'values' on the host: a call's arrays must all be on the host or all on "
            "one CUDA device", out={"values": np.zeros((6, 20), np.float32)}, **arrays)
    refused(r"'input' is on the host and out 'indices' on cuda:0", input=x, out={"indices": out["indices"]})
    refused(r"'input' is on cuda:0 and out 'values' on cuda:1",
            out={"values": fake_like((6, 20), np.float32, device_id=1)}, **arrays)
    refused(r"'values': a call on cuda:0 writes into arrays you give: pass out=\{'values': a f32 array \[6, 20\] on "
            r"cuda:0\}", **arrays)
    refused(r"device='cpu', but the arrays are on cuda:0", device="cpu", out=out, **arrays)
    refused(r"stream: only a call on CUDA arrays runs on a caller's stream", input=x, stream=5)
    refused(r"stream: expected a CUDA stream's handle", out=out, stream=-1, **arrays)
    refused(r"topk/heap runs on the CPU, not on a device", kernel="topk/heap", out=out, **arrays)
    d = kreg.Dispatcher(registry=reg, shipped=False)
    with pytest.raises(ValueError, match="device='cpu', but the arrays are on cuda:0"):
        d.run("topk", k=20, out=out, device="cpu", **arrays)
    with pytest.raises(ValueError, match="'input' is on cuda:0 and out 'values' on the host"):
        d.run("topk", k=20, out={"values": np.zeros((6, 20), np.float32)}, **arrays)


# ---- kreg.jax's CUDA handlers -----------------------------------------------------
# XLA's CPU has no CUDA stream, so these run test_kreg_xla_stand_in
# (KREG_XLA_STAND_IN): libkreg_xla's CUDA handlers built to take the fixed
# stream STAND_IN_STREAM, registered for the CPU under targets of their own.
STAND_IN_STREAM = 0x57a9d


def jax_stand_in(plugin):
    """kreg, kreg.jax, jax and the stand-in's last stream, with kreg.jax's
    calls going to the CUDA handlers over the stand-in device and asking
    the tables for the GPU ("cuda") on the CPU platform."""
    os.environ["KREG_PLUGIN_PATH"] = os.path.dirname(plugin)  # for the handlers' registry
    kreg, reg, last_stream = stand_in(plugin)
    import jax
    import kreg.jax as kj
    lib = ctypes.CDLL(os.environ["KREG_XLA_STAND_IN"])
    for op in kj._TARGETS:
        kj._TARGETS[op] = f"kreg_stand_in_{op}"
        jax.ffi.register_ffi_target(kj._TARGETS[op], jax.ffi.pycapsule(getattr(lib, f"kreg_xla_{op}_cuda")),
                                    platform="cpu")
    return kreg, reg, kj, jax, last_stream


def check_jax_traces_ask_the_gpus_table(plugin):
    """Where JAX has CUDA devices, each call lowers per platform: the CPU's
    answer for the CPU, the GPU's for CUDA (exported for both here)."""
    kreg, reg, _ = stand_in(plugin)
    os.environ["KREG_PLUGIN_PATH"] = os.path.dirname(plugin)
    import jax
    import kreg.jax as kj
    kj._registry = lambda _: reg
    db = os.path.join(tempfile.mkdtemp(), "t.txtpb")
    kreg.tune("topk", {"batch": 6, "n": 300, "k": 20}, db, registry=reg, device="cuda", variants=["host_device"],
              strategy="exhaustive", reps=1, warmup=0)
    kj.use_table(db)
    kj._CUDA = True
    x = np.zeros((6, 300), np.float32)
    exported = jax.export.export(jax.jit(lambda x: kj.topk(x, 20)), platforms=["cpu", "cuda"],
                                 disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("kreg_topk")])
    text = exported(x).mlir_module()
    cpu_kernel = kj.choice("topk", {"batch": 6, "n": 300, "k": 20, "largest": 1}, dtype="input=f32")[0]
    assert cpu_kernel != "topk/host_device"
    assert text.count("@kreg_topk") == 2, text
    assert 'kernel = "topk/host_device"' in text and f'kernel = "{cpu_kernel}"' in text, text


def check_jax_cuda_handlers_in_place(plugin):
    kreg, reg, kj, jax, last_stream = jax_stand_in(plugin)
    kernels = {op: f"{op}/host_device" for op in kj._TARGETS}
    kj.choice = lambda op, dims, **kw: (kernels[op], "", 0)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 300)).astype(np.float32)
    values, indices = jax.jit(lambda x: kj.topk(x, 20))(x)
    want_values, want_indices = topk_reference(x, 20)
    assert (np.asarray(values) == want_values).all() and (np.asarray(indices) == want_indices).all()
    assert last_stream() == STAND_IN_STREAM
    lhs = rng.standard_normal((8, 4)).astype(np.float32)
    rhs = rng.standard_normal((2, 4, 3)).astype(np.float32)
    sizes = np.array([3, 5], np.int32)
    want = np.concatenate([lhs[:3] @ rhs[0], lhs[3:] @ rhs[1]])
    assert np.allclose(jax.jit(kj.gmm)(lhs, rhs, sizes), want, rtol=1e-5, atol=1e-5)
    # The gradients run gmm with the other transpose and tgmm, on the device too.
    d_lhs, d_rhs = jax.jit(jax.grad(lambda l, r: kj.gmm(l, r, sizes).sum(), (0, 1)))(lhs, rhs)
    ones = np.ones((8, 3), np.float32)
    assert np.allclose(d_lhs, np.concatenate([ones[:3] @ rhs[0].T, ones[3:] @ rhs[1].T]), rtol=1e-5, atol=1e-5)
    assert np.allclose(d_rhs, np.stack([lhs[:3].T @ ones[:3], lhs[3:].T @ ones[3:]]), rtol=1e-5, atol=1e-5)
    # A CPU kernel is refused on the device, with kreg's line.
    kernels["topk"] = "topk/heap"
    with pytest.raises(Exception, match="topk/heap runs on the CPU, not on a device"):
        jax.block_until_ready(jax.jit(lambda x: kj.topk(x, 19))(x))


CHECKS = [name for name in dir(sys.modules[__name__]) if name.startswith("check_")]


@pytest.mark.parametrize("check", CHECKS)
def test_cuda_arrays_in_place_on_the_stand_in_device(check):
    backend, plugin = os.environ.get("KREG_HOST_DEVICE_BACKEND"), os.environ.get("KREG_HOST_DEVICE_PLUGIN")
    if not backend or not plugin:
        pytest.skip("KREG_HOST_DEVICE_BACKEND and KREG_HOST_DEVICE_PLUGIN unset (ctest sets them)")
    if check.startswith("check_jax"):
        if not os.environ.get("KREG_XLA_STAND_IN"):
            pytest.skip("KREG_XLA_STAND_IN unset (ctest sets it where libkreg_xla is built)")
        pytest.importorskip("jax")
    env = dict(os.environ, KREG_CUDA_BACKEND=backend)
    r = subprocess.run([sys.executable, __file__, check, plugin], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_torch_registers_cuda_kernels():
    """The PyTorch shim's CUDA kernels exist where it is built (they run on
    a GPU only: scripts/gpu_check.sh)."""
    torch = pytest.importorskip("torch")
    try:
        import kreg.torch  # noqa: F401
    except ImportError as e:
        pytest.skip(f"kreg.torch: {e}")
    for op in ("topk", "gmm", "tgmm"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"kreg::{op}", "CUDA"), op


if __name__ == "__main__":
    globals()[sys.argv[1]](sys.argv[2])
    print("ok")
