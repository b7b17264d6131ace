#!/usr/bin/env python3
"""kreg's grouped matmuls against torch._grouped_mm on the CPU, same threads.

    python3 bench/cpu_grouped_peers.py --kreg build/gpu-bundle/bin/kreg [--threads 16] [--reps 10]

gmm_bench (plugins/gmm/bench.cc) times kreg against oneDNN per group but
has no PyTorch peer; this is that peer, on gmm_bench's shapes: gmm and
tgmm, skewed (m=4096, 64 groups, gmm_bench's Zipf-like sizes, seed 42, 16
empty) and balanced (m=8192, 8 equal groups), k=2048, n=1024, f32 and
bf16 (every tensor bf16, the output included, as torch._grouped_mm makes
it). For each:
  torch  torch._grouped_mm on CPU tensors with torch.set_num_threads(T):
         gmm lhs [m, k] x rhs [G, k, n], tgmm lhs [k, m] x rhs [m, n] ->
         [G, k, n], offsets the sizes' cumulative sums; the median wall
         time of --reps calls after two untimed ones;
  kreg   `kreg run OP --db TABLE --threads T --reps R --json`, the same
         group sizes from an .npy: the kernel and parameters the tables
         answer for this machine (the shipped ones for its class, else the
         most similar machine's), timed by kreg's own measurement.
GFLOP/s = 2 * sum(sizes) * k * n / time. Prints a Markdown table (kreg /
torch, and kreg's bf16 over its own f32) and exits non-zero if a kreg run
failed (the other rows are still printed). Needs PyTorch; the issue's
goals (issue 26, 16-core Xeon with AMX): skewed bf16 >= 2x torch, bf16 >=
1.7x kreg's own f32.
"""
import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from gpu_peers import write_i32_npy  # bench/, the folder this script runs from

K, N = 2048, 1024
SHAPES = [("skewed", 4096, 64), ("balanced", 8192, 8)]  # gmm_bench's kShapes, the goals' first
MASK64 = (1 << 64) - 1


class MT19937_64:
    """std::mt19937_64, whose sequence the C++ standard fixes."""

    def __init__(self, seed):
        self.mt = [seed & MASK64]
        for i in range(1, 312):
            self.mt.append((6364136223846793005 * (self.mt[-1] ^ (self.mt[-1] >> 62)) + i) & MASK64)
        self.index = 312

    def __call__(self):
        if self.index >= 312:
            for i in range(312):
                x = (self.mt[i] & 0xFFFFFFFF80000000) | (self.mt[(i + 1) % 312] & 0x7FFFFFFF)
                xa = (x >> 1) ^ (0xB5026F5AA96619E9 if x & 1 else 0)
                self.mt[i] = self.mt[(i + 156) % 312] ^ xa
            self.index = 0
        y = self.mt[self.index]
        self.index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        return (y ^ (y >> 43)) & MASK64


def skewed_sizes(m, groups, seed=42, exponent=1.1):
    """gmm_bench's SkewedSizes (plugins/gmm/bench.cc), step for step."""
    rank = list(range(groups))
    rng = MT19937_64(seed)
    for i in range(groups - 1, 0, -1):
        j = rng() % (i + 1)
        rank[i], rank[j] = rank[j], rank[i]
    live = groups - groups // 4
    weight = [(rank[g] + 1) ** -exponent if rank[g] < live else 0.0 for g in range(groups)]
    total = sum(w for w in weight if w)
    sizes, frac, group_of_rank = [0] * groups, [], {}
    for g in range(groups):
        if weight[g] == 0:
            continue
        quota = m * weight[g] / total
        sizes[g] = int(quota // 1)
        frac.append((-(quota - quota // 1), rank[g]))
        group_of_rank[rank[g]] = g
    frac.sort()
    i = 0
    while sum(sizes) < m:
        sizes[group_of_rank[frac[i % len(frac)][1]]] += 1
        i += 1
    return sizes


def group_sizes(m, groups, skewed):
    if skewed:
        return skewed_sizes(m, groups)
    return [m // groups + (1 if g < m % groups else 0) for g in range(groups)]


def torch_ms(op, m, sizes, dtype, reps):
    """Median milliseconds of torch._grouped_mm on this problem."""
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    g = len(sizes)
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)
    if op == "gmm":
        a, b = torch.rand(m, K).to(dt), torch.rand(g, K, N).to(dt)
    else:
        a, b = torch.rand(K, m).to(dt), torch.rand(m, N).to(dt)
    times = []
    for i in range(reps + 2):
        start = time.perf_counter()
        torch._grouped_mm(a, b, offs=offs)
        if i >= 2:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def kreg_run(args, op, m, groups, dtype, npy):
    dims = f"m={m},k={K},n={N},groups={groups}" if op == "gmm" else f"k={K},m={m},n={N},groups={groups}"
    cmd = [args.kreg, "run", op, "--db", args.db, "--dims", dims, "--dtype", dtype, "--input",
           f"group_sizes={npy}", "--threads", str(args.threads), "--reps", str(args.reps), "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"kreg {' '.join(cmd[1:])}: {r.stderr.strip()}"
    return json.loads(r.stdout), None


def default_db(kreg):
    tables = sorted((pathlib.Path(kreg).resolve().parent.parent / "share/kreg/tables").glob("*.txtpb"))
    return str(tables[0]) if tables else None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--kreg", default=str(pathlib.Path(__file__).resolve().parent.parent / "build/release/bin/kreg"))
    p.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1))
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--db", help="a table for `kreg run OP --db` (default: the first shipped one beside --kreg; "
                                "the shipped tables answer either way)")
    p.add_argument("--only", default="", help="a regular expression: run only the rows whose name matches")
    args = p.parse_args()
    args.db = args.db or default_db(args.kreg)
    if args.db is None:
        sys.exit(f"cpu_grouped_peers: no table under share/kreg/tables beside {args.kreg}; give --db")
    torch.set_num_threads(args.threads)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="kreg_cpu_peers_"))
    print(f"{os.cpu_count()} CPUs, {args.threads} threads (kreg --threads, torch.set_num_threads), torch "
          f"{torch.__version__}; k={K}, n={N}; medians of {args.reps} runs; out has the inputs' dtype\n")
    print("| op / shape / dtype | torch._grouped_mm | kreg (the tables' choice) | kreg / torch | kreg bf16 / kreg f32 |")
    print("|---|---:|---|---:|---:|")
    failed = 0
    for op in ("gmm", "tgmm"):
        for shape, m, groups in SHAPES:
            sizes = group_sizes(m, groups, shape == "skewed")
            npy = tmp / f"sizes_{shape}.npy"
            write_i32_npy(npy, sizes)
            gflop = 2.0 * sum(sizes) * K * N / 1e9
            kreg_f32 = None
            for dtype in ("f32", "bf16"):
                name = f"{op} {shape} {dtype}"
                if args.only and not re.search(args.only, name):
                    continue
                try:
                    peer = torch_ms(op, m, sizes, dtype, args.reps)
                    peer_text = f"{peer:.2f} ms ({gflop * 1e3 / peer:.0f} GFLOP/s)"
                except (RuntimeError, NotImplementedError) as e:
                    peer, peer_text = None, f"fails: {str(e).splitlines()[0][:120]}"
                ran, error = kreg_run(args, op, m, groups, dtype, npy)
                if error:
                    failed += 1
                    print(f"| {name} | {peer_text} | FAILED: {error[:300]} | | |", flush=True)
                    continue
                ours = ran["median_ns"] / 1e6
                params = " ".join(f"{k}={v}" for k, v in (ran.get("params") or {}).items())
                speedup = f"{peer / ours:.2f}" if peer else ""
                own = f"{kreg_f32 / ours:.2f}" if dtype == "bf16" and kreg_f32 else ""
                if dtype == "f32":
                    kreg_f32 = ours
                print(f"| {name} | {peer_text} | {ran['kernel']} {params}: {ours:.2f} ms ({gflop * 1e3 / ours:.0f} "
                      f"GFLOP/s) | {speedup} | {own} |", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
