"""kreg on PyTorch CUDA tensors in place, on the GPU (scripts/gpu_check.sh,
step cuda-arrays): kreg.run and Dispatcher.run on a caller's stream (the
current one and a side stream), and torch.ops.kreg's CUDA kernels on
PyTorch's stream, each against PyTorch on the same stream without a host
synchronisation in between; then kreg.jax's CUDA custom calls under
jax.jit against jax.lax.top_k and jax.lax.ragged_dot (values and
gradients), where this Python has JAX with CUDA. Prints one line per
check; exits non-zero if one fails.

    PYTHONPATH=build/release/python python3 scripts/gpu_arrays.py
"""

import os
import sys

import torch

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX beside PyTorch on one GPU

import kreg

try:
    import kreg.torch  # noqa: F401  torch.ops.kreg (built against one PyTorch version)
    shim_error = None
except Exception as e:  # noqa: BLE001  reported as a failed check
    shim_error = f"{type(e).__name__}: {e}"

failed = []


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}")
    if not ok:
        failed.append(name)


def topk_out(x, k):
    return {"values": torch.empty(x.shape[0], k, device=x.device), "indices":
            torch.empty(x.shape[0], k, dtype=torch.int32, device=x.device)}


def same_topk(out, x, k):
    want = torch.topk(x, k)  # on the same stream: after kreg's kernel
    return torch.equal(out["values"], want.values) and torch.equal(out["indices"].long(), want.indices)


def main():
    if not torch.cuda.is_available():
        print("PyTorch sees no GPU: skipped")
        return 0
    torch.manual_seed(0)
    x = torch.randn(64, 50000, device="cuda")
    k = 32

    out = topk_out(x, k)
    kreg.run("topk/cuda_radix", input=x, k=k, out=out, stream=torch.cuda.current_stream().cuda_stream)
    check("kreg.run topk/cuda_radix on the current stream", same_topk(out, x, k))

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        y = x * 2  # enqueued on the side stream: kreg must run after it there
        out = topk_out(y, k)
        kreg.run("topk/cuda_radix", input=y, k=k, out=out, stream=side.cuda_stream)
        check("kreg.run on a side stream", same_topk(out, y, k))
    torch.cuda.synchronize()

    d = kreg.Dispatcher()
    out = topk_out(x, k)
    d.run("topk", input=x, k=k, out=out, stream=torch.cuda.current_stream().cuda_stream)
    check("Dispatcher.run topk", same_topk(out, x, k), str(d.last))

    if shim_error is not None:
        check("import kreg.torch", False, shim_error)
    else:
        check_torch_ops(x, k)
    try:
        kreg.run("topk/cuda_radix", input=x, k=k, out={"values": torch.empty(64, k)})
        check("mixed host and CUDA arrays refused", False, "it ran")
    except ValueError as e:
        check("mixed host and CUDA arrays refused", "must all be on the host or all on one CUDA device" in str(e), str(e))
    torch.cuda.synchronize()
    check_jax()
    return 1 if failed else 0


def check_torch_ops(x, k):
    values, indices = torch.ops.kreg.topk(x, k)
    want = torch.topk(x, k)
    check("torch.ops.kreg.topk on CUDA", values.is_cuda and torch.equal(values, want.values) and
          torch.equal(indices.long(), want.indices))

    lhs = torch.randn(1024, 256, device="cuda", dtype=torch.bfloat16)
    rhs = torch.randn(4, 256, 128, device="cuda", dtype=torch.bfloat16)
    sizes = torch.tensor([100, 0, 500, 424], dtype=torch.int32, device="cuda")
    got = torch.ops.kreg.gmm(lhs, rhs, sizes, out_dtype=torch.float32)
    starts = [0, 100, 100, 600]
    want = torch.cat([lhs[s:s + n].float() @ rhs[g].float() for g, (s, n) in
                      enumerate(zip(starts, sizes.tolist()))])
    err = (got - want).abs().max().item()
    check("torch.ops.kreg.gmm on CUDA (bf16 in, f32 out)", got.is_cuda and err < 1e-2 * want.abs().max().item(),
          f"max error {err}")


def check_jax():
    try:
        import jax
        import jax.numpy as jnp
        import numpy as np

        import kreg.jax as kj
    except Exception as e:  # noqa: BLE001
        print(f"kreg.jax does not import here ({type(e).__name__}: {e}): its CUDA checks skipped")
        return
    if not kj._CUDA:
        check("kreg.jax sees JAX's and kreg's GPU", False, f"jax: {jax.devices()}, kreg: {kreg.machine()['gpus_why_none']}")
        return
    gpu = jax.devices("cuda")[0]
    rng = np.random.default_rng(1)
    x = jax.device_put(rng.standard_normal((64, 50000)).astype(np.float32), gpu)
    kernel = kj.choice("topk", {"batch": 64, "n": 50000, "k": 32, "largest": 1}, dtype="input=f32", device="cuda")[0]
    values, indices = jax.jit(lambda x: kj.topk(x, 32))(x)
    want_values, want_indices = jax.lax.top_k(x, 32)
    check(f"kreg.jax.topk on CUDA ({kernel})", values.devices() == {gpu} and
          bool(jnp.array_equal(values, want_values)) and bool(jnp.array_equal(indices, want_indices)))

    sizes = jnp.array([100, 0, 500, 424], jnp.int32)
    lhs = jax.device_put(rng.standard_normal((1024, 256)).astype(np.float32), gpu)
    rhs = jax.device_put(rng.standard_normal((4, 256, 128)).astype(np.float32), gpu)
    got = jax.jit(kj.gmm)(lhs, rhs, sizes)
    want = jax.lax.ragged_dot(lhs, rhs, sizes, precision=jax.lax.Precision.HIGHEST)
    err = float(jnp.abs(got - want).max())
    check("kreg.jax.gmm on CUDA (f32)", got.devices() == {gpu} and err < 1e-3 * float(jnp.abs(want).max()),
          f"max error {err}")
    grads = jax.jit(jax.grad(lambda l, r: (kj.gmm(l, r, sizes) ** 2).sum(), (0, 1)))(lhs, rhs)
    want_grads = jax.grad(lambda l, r: (jax.lax.ragged_dot(l, r, sizes, precision=jax.lax.Precision.HIGHEST) ** 2)
                          .sum(), (0, 1))(lhs, rhs)
    errs = [float(jnp.abs(g - w).max() / jnp.abs(w).max()) for g, w in zip(grads, want_grads)]
    check("kreg.jax.gmm gradients on CUDA (gmm and tgmm)", max(errs) < 1e-3, f"relative errors {errs}")


if __name__ == "__main__":
    sys.exit(main())
