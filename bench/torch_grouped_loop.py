#!/usr/bin/env python3
"""PyTorch's grouped matmuls on the CPU, gmm_bench's shapes: the torch peers.

    build/venv/bin/python bench/torch_grouped_loop.py [--threads 2] [--reps 5] [--only REGEX]

gmm_bench (plugins/gmm/bench.cc) times kreg against oneDNN; this times the
same problems in PyTorch, so the two can be read side by side (run both in
one window, same thread count). Shapes as gmm_bench's: skewed m=4096, 64
groups, its Zipf-like sizes (seed 42, 16 empty; cpu_grouped_peers.py's
skewed_sizes), and balanced m=8192, 8 equal groups; k=2048, n=1024. Per
(op, shape, dtype):
  loop     a Python loop of torch.mm, one per non-empty group, into slices
           of a preallocated out (torch.mm(..., out=)): gmm lhs[rows of g] x
           rhs[g]; tgmm lhs[:, rows of g] x rhs[rows of g] -> out[g]; empty
           groups' out[g] zeroed (tgmm), as the op requires;
  grouped  torch._grouped_mm (every tensor of the inputs' dtype; its out too).
The loop's out is f32 for f32 inputs, bf16 for bf16 (torch.mm's out has
its inputs' dtype). Median of --reps timed calls after two untimed ones;
GFLOP/s = 2 * sum(sizes) * k * n / time.
"""
import argparse
import re
import statistics
import time

import torch

from cpu_grouped_peers import K, N, SHAPES, group_sizes  # bench/, the folder this script runs from


def inputs(op, m, groups, dt):
    if op == "gmm":
        return torch.rand(m, K).to(dt), torch.rand(groups, K, N).to(dt)
    return torch.rand(K, m).to(dt), torch.rand(m, N).to(dt)


def loop_call(op, a, b, sizes, out):
    start = 0
    for g, rows in enumerate(sizes):
        if op == "gmm":
            if rows:
                torch.mm(a[start:start + rows], b[g], out=out[start:start + rows])
        elif rows:
            torch.mm(a[:, start:start + rows], b[start:start + rows], out=out[g])
        else:
            out[g].zero_()
        start += rows


def median_ms(fn, reps):
    times = []
    for i in range(reps + 2):
        start = time.perf_counter()
        fn()
        if i >= 2:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--only", default="", help="a regular expression: run only the rows whose name matches")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads; k={K}, n={N}; medians of {args.reps}; GFLOP/s\n")
    print("| op / shape / dtype | torch.mm loop | torch._grouped_mm |")
    print("|---|---:|---:|")
    for op in ("gmm", "tgmm"):
        for shape, m, groups in SHAPES:
            sizes = group_sizes(m, groups, shape == "skewed")
            gflop = 2.0 * sum(sizes) * K * N / 1e9
            for dtype in ("f32", "bf16"):
                name = f"{op} {shape} {dtype}"
                if args.only and not re.search(args.only, name):
                    continue
                dt = torch.bfloat16 if dtype == "bf16" else torch.float32
                a, b = inputs(op, m, groups, dt)
                out = torch.empty((m, N) if op == "gmm" else (groups, K, N), dtype=dt)
                loop = median_ms(lambda: loop_call(op, a, b, sizes, out), args.reps)
                offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)
                try:
                    grouped = f"{gflop * 1e3 / median_ms(lambda: torch._grouped_mm(a, b, offs=offs), args.reps):.1f}"
                except (RuntimeError, NotImplementedError) as e:
                    grouped = f"fails: {str(e).splitlines()[0][:80]}"
                print(f"| {name} | {gflop * 1e3 / loop:.1f} | {grouped} |", flush=True)
                del a, b, out


if __name__ == "__main__":
    main()
