#!/usr/bin/env python3
"""kreg's ops inside PyTorch and JAX against the frameworks' own, and against
kreg called eagerly, on the seed shapes and one small shape.

    PYTHONPATH=build/release/python KREG_TABLE_PATH=build/release/share/kreg/tables \\
        build/venv/bin/python bench/frameworks.py [--rounds 5] [--only torch|jax] [--shapes NAME,...]

Shapes: top-k 128x201088 k=64 f32 and bf16, 64x32768 k=2048 f32, 1x1024 k=8
f32 (the per-call overhead); gmm skewed (m=4096 k=2048 n=1024, 64 groups with
gmm_bench's Zipf sizes) and balanced
(m=8192, 8 groups), f32 and bf16. For each, in one process, the rounds
interleave:
  kreg.run     kreg's Dispatcher eagerly on NumPy views of the same data
               (Dispatcher.run: the table's choice, as the ops use)
  torch.kreg   torch.compile(fullgraph=True) of a function calling
               torch.ops.kreg.topk / gmm
  torch        torch.compile of torch.topk / torch._grouped_mm
  torch.kreg eager, torch eager   the same two called eagerly
  jax.kreg     jax.jit of kreg.jax.topk / gmm
  jax          jax.jit of jax.lax.top_k / jax.lax.ragged_dot
Each figure is the median over the rounds of one round's median time per
call (a round times `calls` calls after one warm call); ratios are to
kreg.run and to the framework's own op. Both frameworks get 2 threads.
"""
import argparse
import statistics
import time

import numpy as np

from cpu_grouped_peers import group_sizes  # gmm_bench's partitions; bench/ is this script's folder


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--only", choices=["torch", "jax"], help="one framework")
    p.add_argument("--shapes", help="comma-separated shape names (default: all)")
    a = p.parse_args()
    if a.rounds < 1:
        p.error("--rounds must be >= 1")
    return a


TOPK = {"topk_128x201088_k64": (128, 201088, 64, "f32"), "topk_128x201088_k64_bf16": (128, 201088, 64, "bf16"),
        "topk_64x32768_k2048": (64, 32768, 2048, "f32"), "topk_1x1024_k8": (1, 1024, 8, "f32")}
GMM = {"gmm_skewed_f32": (4096, 2048, 1024, 64, True, "f32"), "gmm_skewed_bf16": (4096, 2048, 1024, 64, True, "bf16"),
       "gmm_balanced_f32": (8192, 2048, 1024, 8, False, "f32"), "gmm_balanced_bf16": (8192, 2048, 1024, 8, False, "bf16")}


# Each of kreg's rows against the framework's own op called the same way.
PEERS = {"torch.kreg": "torch", "torch.kreg eager": "torch eager", "jax.kreg": "jax"}


def calls_for(name):
    return 2000 if name == "topk_1x1024_k8" else 3 if name.startswith("gmm") else 10


def timed(fn, calls):
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def build(name, only):
    """{label: callable} for one shape; each callable finishes its work."""
    import torch
    import kreg
    rng = np.random.default_rng(1)
    d = kreg.Dispatcher()
    fns = {}
    if name in TOPK:
        batch, n, k, dtype = TOPK[name]
        x32 = rng.standard_normal((batch, n), dtype=np.float32)
        xt = torch.from_numpy(x32)
        if dtype == "bf16":
            xt = xt.bfloat16()
        xn = xt.view(torch.uint16).numpy() if dtype == "bf16" else xt.numpy()
        fns["kreg.run"] = lambda: d.run("topk", input=xn, k=k)
        if only in (None, "torch"):
            import kreg.torch  # noqa: F401
            ours = torch.compile(lambda x: torch.ops.kreg.topk(x, k), fullgraph=True, dynamic=False)
            theirs = torch.compile(lambda x: torch.topk(x, k), fullgraph=True, dynamic=False)
            fns["torch.kreg"] = lambda: ours(xt)
            fns["torch"] = lambda: theirs(xt)
            fns["torch.kreg eager"] = lambda: torch.ops.kreg.topk(xt, k)
            fns["torch eager"] = lambda: torch.topk(xt, k)
        if only in (None, "jax"):
            import jax
            import jax.numpy as jnp
            import kreg.jax
            xj = jnp.asarray(x32, jnp.bfloat16 if dtype == "bf16" else jnp.float32)
            ours_j = jax.jit(lambda x: kreg.jax.topk(x, k))
            theirs_j = jax.jit(lambda x: jax.lax.top_k(x, k))
            fns["jax.kreg"] = lambda: jax.block_until_ready(ours_j(xj))
            fns["jax"] = lambda: jax.block_until_ready(theirs_j(xj))
        return fns
    m, k, n, groups, skewed, dtype = GMM[name]
    sizes = np.array(group_sizes(m, groups, skewed), np.int32)
    lhs32 = rng.standard_normal((m, k), dtype=np.float32)
    rhs32 = rng.standard_normal((groups, k, n), dtype=np.float32) * np.float32(k ** -0.5)
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    lhs, rhs, gs = torch.from_numpy(lhs32).to(tdtype), torch.from_numpy(rhs32).to(tdtype), torch.from_numpy(sizes)

    def host(t):
        return t.view(torch.uint16).numpy() if t.dtype == torch.bfloat16 else t.numpy()

    lhs_n, rhs_n = host(lhs), host(rhs)
    # out in the inputs' dtype, as the framework ops make it (kreg.run's
    # default out is f32: another key, another answer).
    fns["kreg.run"] = lambda: d.run("gmm", lhs=lhs_n, rhs=rhs_n, group_sizes=sizes, dtype=dtype)
    if only in (None, "torch"):
        import kreg.torch  # noqa: F401
        offs = torch.cumsum(gs, 0, dtype=torch.int32)
        ours = torch.compile(lambda a, b, s: torch.ops.kreg.gmm(a, b, s), fullgraph=True, dynamic=False)
        theirs = torch.compile(lambda a, b, o: torch._grouped_mm(a, b, offs=o), fullgraph=True, dynamic=False)
        fns["torch.kreg"] = lambda: ours(lhs, rhs, gs)
        fns["torch"] = lambda: theirs(lhs, rhs, offs)
        fns["torch.kreg eager"] = lambda: torch.ops.kreg.gmm(lhs, rhs, gs)
        fns["torch eager"] = lambda: torch._grouped_mm(lhs, rhs, offs=offs)
    if only in (None, "jax"):
        import jax
        import jax.numpy as jnp
        import kreg.jax
        jd = jnp.bfloat16 if dtype == "bf16" else jnp.float32
        lj, rj, sj = jnp.asarray(lhs32, jd), jnp.asarray(rhs32, jd), jnp.asarray(sizes)
        ours_j = jax.jit(lambda a, b, s: kreg.jax.gmm(a, b, s))
        theirs_j = jax.jit(lambda a, b, s: jax.lax.ragged_dot(a, b, s))
        fns["jax.kreg"] = lambda: jax.block_until_ready(ours_j(lj, rj, sj))
        fns["jax"] = lambda: jax.block_until_ready(theirs_j(lj, rj, sj))
    return fns


def fmt(seconds):
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def main():
    args = parse_args()
    import torch
    torch.set_num_threads(2)
    names = args.shapes.split(",") if args.shapes else list(TOPK) + list(GMM)
    for name in names:
        if name not in TOPK and name not in GMM:
            raise SystemExit(f"frameworks.py: no shape '{name}' (shapes: {', '.join(list(TOPK) + list(GMM))})")
    print(f"{'shape':28} {'impl':16} {'median':>11} {'/kreg.run':>9} {'/framework':>10}")
    for name in names:
        fns = build(name, args.only)
        times = {label: [] for label in fns}
        for _ in range(args.rounds):
            for label, fn in fns.items():
                times[label].append(timed(fn, calls_for(name)))
        med = {label: statistics.median(t) for label, t in times.items()}
        for label, t in med.items():
            peer = PEERS.get(label)
            to_peer = f"{med[peer] / t:9.2f}x" if peer in med else ""
            print(f"{name:28} {label:16} {fmt(t):>11} {med['kreg.run'] / t:8.2f}x {to_peer:>10}", flush=True)
        del fns


if __name__ == "__main__":
    main()
