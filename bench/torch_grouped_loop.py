#!/usr/bin/env python3
"""PyTorch's grouped matmuls on the CPU, gmm_bench's shapes: the torch peers.

    PYTHONPATH=build/release/python KREG_TABLE_PATH=build/release/share/kreg/tables \
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
  grouped  torch._grouped_mm (every tensor of the inputs' dtype; its out too);
  kreg     torch.ops.kreg.gmm / tgmm on the same tensors, out in the inputs'
           dtype as torch's (the table's answer; gmm_bench's kreg rows
           write f32), a new out each call as torch._grouped_mm's;
  kreg out the same through kreg.Dispatcher().run(..., out=), into the
           loop's preallocated out (a new 512 MiB tgmm out costs its page
           faults on every call);
the kreg columns are left out where kreg's Python package is not on
PYTHONPATH. Ratios: kreg out / loop, kreg / grouped.
The loop's out is f32 for f32 inputs, bf16 for bf16 (torch.mm's out has
its inputs' dtype). Each contestant's figure is the median of --reps timed
calls after two untimed ones; with --rounds R, a row's contestants run in
turn R times and the median of the R medians is given. GFLOP/s =
2 * sum(sizes) * k * n / time.
"""
import argparse
import re
import statistics
import time

import torch

try:
    import kreg.torch  # noqa: F401 (registers torch.ops.kreg)
except ImportError:
    kreg = None

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
    p.add_argument("--rounds", type=int, default=1, help="each row's contestants in turn, this many times")
    p.add_argument("--only", default="", help="a regular expression: run only the rows whose name matches")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads; k={K}, n={N}; medians of {args.reps}; GFLOP/s\n")
    print("| op / shape / dtype | torch.mm loop | torch._grouped_mm | kreg | kreg out | kreg out / loop | kreg / grouped |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    dispatcher = kreg.Dispatcher() if kreg is not None else None
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
                offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)
                gs = torch.tensor(sizes, dtype=torch.int32)
                fns = {"loop": lambda: loop_call(op, a, b, sizes, out),
                       "grouped": lambda: torch._grouped_mm(a, b, offs=offs)}
                if kreg is not None:
                    fns["kreg"] = ((lambda: torch.ops.kreg.gmm(a, b, gs)) if op == "gmm" else
                                   (lambda: torch.ops.kreg.tgmm(a, b, gs)))
                    fns["kreg out"] = lambda: dispatcher.run(op, lhs=a, rhs=b, group_sizes=gs, out={"out": out})
                times = {f: [] for f in fns}
                failed = {}
                for _ in range(args.rounds):
                    for f, fn in fns.items():
                        if f in failed:
                            continue
                        try:
                            times[f].append(median_ms(fn, args.reps))
                        except (RuntimeError, NotImplementedError) as e:
                            failed[f] = f"fails: {str(e).splitlines()[0][:80]}"
                gf = {f: gflop * 1e3 / statistics.median(t) for f, t in times.items() if t}
                cells = [failed.get(f, f"{gf[f]:.1f}" if f in gf else "-") for f in ("loop", "grouped", "kreg", "kreg out")]
                for ours, peer in (("kreg out", "loop"), ("kreg", "grouped")):
                    cells.append(f"{gf[ours] / gf[peer]:.2f}" if ours in gf and peer in gf else "-")
                print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
                del a, b, out


if __name__ == "__main__":
    main()
