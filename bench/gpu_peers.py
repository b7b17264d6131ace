#!/usr/bin/env python3
"""kreg's CUDA kernels against PyTorch on the GPU, in one run.

    python3 bench/gpu_peers.py --kreg build/gpu-bundle/bin/kreg [--reps 20] [--db gpu.txtpb] [--budget 10]

For each workload of the GPU issue it times, on GPU 0, as medians of --reps
runs, each with the L2 flushed first (a write of twice its size) and timed
with CUDA events, as `kreg run --device cuda` times:
  floor  the fastest full read of the input (torch.sum; for gmm the bytes
         of lhs, rhs and out at the read's rate, or the tensor-core time);
  torch  torch.topk, or torch._grouped_mm (bf16, offsets on the GPU);
  kreg   `kreg tune OP --device cuda` of the workload into --db (every CUDA
         variant and configuration, checked against the CPU reference;
         with --budget, the tuner's search within that many seconds),
         then `kreg run OP --db DB --device cuda --reps N --json`: the
         table's choice, timed the same way (not checked again: the sweep
         checked it, and gmm's reference, double sums on the CPU, costs
         seconds a call at these sizes).
The skewed gmm's group sizes are fixed (a Zipf-like split of the rows,
written to an .npy both sides read), so kreg and PyTorch multiply the same
groups. Prints a Markdown table (the figures for bench/RESULTS.md), one
row per workload as it is measured; a workload whose kreg or torch side
fails gets a row saying so and the others still run; exits non-zero if
any failed. Needs PyTorch with CUDA.
"""
import argparse
import json
import pathlib
import struct
import subprocess
import sys
import tempfile

import torch

WORKLOADS = [
    # name, op, dims, dtype, group split (gmm)
    ("top-k f32 128x201088, k=64", "topk", "batch=128,n=201088,k=64", "f32", None),
    ("top-k f32 64x32768, k=2048", "topk", "batch=64,n=32768,k=2048", "f32", None),
    ("top-k bf16 128x201088, k=64", "topk", "batch=128,n=201088,k=64", "bf16", None),
    ("gmm bf16 MoE-skewed m=4096,k=2048,n=1024,G=64", "gmm", "m=4096,k=2048,n=1024,groups=64", "bf16", "skewed"),
    ("gmm bf16 balanced m=8192,k=2048,n=1024,G=8", "gmm", "m=8192,k=2048,n=1024,groups=8", "bf16", "balanced"),
]


def dims_of(text):
    return {k: int(v) for k, v in (item.split("=") for item in text.split(","))}


def group_sizes(m, groups, split):
    if split == "balanced":
        sizes = [m // groups] * groups
    else:  # Zipf-like: group i gets rows in proportion to 1 / (i + 1)
        weights = [1.0 / (i + 1) for i in range(groups)]
        sizes = [int(m * w / sum(weights)) for w in weights]
    sizes[0] += m - sum(sizes)
    return sizes


def write_i32_npy(path, values):
    header = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }" % len(values)
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%di" % len(values), *values))


def timed(fn, reps):
    """Median microseconds of fn() over reps runs, each after an L2 flush."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(2 * l2 // 4 + 1024, dtype=torch.float32, device="cuda")
    times = []
    for i in range(reps + 3):
        flush.fill_(i)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(stop) * 1e3)
    times.sort()
    return times[len(times) // 2]


def torch_side(op, dims, dtype, sizes, reps):
    """(floor us, torch us, torch's call) for one workload."""
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    if op == "topk":
        x = torch.randn(dims["batch"], dims["n"], device="cuda").to(dt)
        floor = timed(lambda: torch.sum(x, dtype=torch.float32), reps)
        return floor, timed(lambda: torch.topk(x, dims["k"], dim=1), reps), "torch.topk"
    m, k, n, g = dims["m"], dims["k"], dims["n"], dims["groups"]
    a = torch.randn(m, k, device="cuda").to(dt)
    w = torch.randn(g, n, k, device="cuda").to(dt)
    offs = torch.tensor(sizes, device="cuda", dtype=torch.int32).cumsum(0).to(torch.int32)
    # The floor: the bytes every tile must move at the read's rate, or the
    # tensor-core time, whichever is longer.
    everything = torch.cat([a.flatten(), w.flatten()])
    read = timed(lambda: torch.sum(everything, dtype=torch.float32), reps)
    dense = timed(lambda: torch.mm(a, w[0].t()), reps)
    floor = max(read * (a.numel() + w.numel() + m * n) / everything.numel(), dense)
    call = lambda: torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
    call()
    return floor, timed(call, reps), "torch._grouped_mm"


class KregFailed(Exception):
    pass


def kreg(args, *words):
    r = subprocess.run([args.kreg, *words], capture_output=True, text=True)
    if r.returncode != 0:
        raise KregFailed(f"kreg {' '.join(words)}: {r.stderr.strip()}")
    return r.stdout


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--kreg", default=str(pathlib.Path(__file__).resolve().parent.parent / "build/release/bin/kreg"))
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--db", help="the table the sweeps go into (default: a temporary one)")
    p.add_argument("--budget", type=float, default=0, help="seconds per workload's sweep (default 0: no limit)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_peers: PyTorch sees no CUDA GPU")
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="kreg_gpu_peers_"))
    db = args.db or str(tmp / "gpu.txtpb")
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}; medians of {args.reps} runs, "
          "cold L2, CUDA events\n")
    print("| workload | read floor | torch | kreg (the table's choice after kreg tune --device cuda) | "
          "kreg x floor | torch / kreg |")
    print("|---|---:|---:|---|---:|---:|")
    failed = 0
    for name, op, dims_text, dtype, split in WORKLOADS:
        dims = dims_of(dims_text)
        extra, sizes = [], None
        if split is not None:
            sizes = group_sizes(dims["m"], dims["groups"], split)
            npy = tmp / f"sizes_{split}.npy"
            write_i32_npy(npy, sizes)
            extra = ["--input", f"group_sizes={npy}"]
        try:
            floor, peer, peer_name = torch_side(op, dims, dtype, sizes, args.reps)
            kreg(args, "tune", op, "--device", "cuda", "--dims", dims_text, "--dtype", dtype, "--db", db,
                 "--budget", str(args.budget), *extra)
            ran = json.loads(kreg(args, "run", op, "--db", db, "--no-shipped", "--device", "cuda", "--dims",
                                  dims_text, "--dtype", dtype, "--reps", str(args.reps), "--json", *extra))
        except (KregFailed, RuntimeError) as e:
            failed += 1
            print(f"| {name} | FAILED: {' '.join(str(e).split())[:400]} | | | | |", flush=True)
            continue
        ours = ran["median_ns"] / 1e3
        params = " ".join(f"{k}={v}" for k, v in (ran.get("params") or {}).items())
        print(f"| {name} | {floor:.1f} us | {peer_name} {peer:.1f} us | {ran['kernel']} {params} {ours:.1f} us | "
              f"{ours / floor:.2f} | {peer / ours:.2f} |", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
