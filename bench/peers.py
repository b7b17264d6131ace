#!/usr/bin/env python3
"""NumPy and JAX top-k against the kreg command line, on the same .npy input.

    python3 bench/peers.py sort heap --shapes b1_n1000000_k100 --reps 5
    python3 bench/peers.py radix --param radix:first_bits=11 --input x.npy --k 64

For each shape it writes (once, cached) a float32 normal(0, 1) input with a
fixed seed, then times, as medians over --reps runs after a warm-up:
  numpy  np.argpartition(-x, k-1, axis=1)[:, :k], then those k sorted per row
         by value descending, ties by ascending index (np.lexsort);
  jax    jax.jit(lambda x: jax.lax.top_k(x, k)) on the CPU backend, input
         already on the device, block_until_ready();
  kreg   `kreg run topk/VARIANT --input input=FILE.npy --json --reps N`
         (its own in-process median) for each VARIANT given,
and compares kreg's indices (--save-outputs) with NumPy's and JAX's: the
number of rows that differ exactly, and as sets (tie order may differ).

Everything runs on 2 threads: the process is pinned to 2 CPUs (XLA sizes
its CPU thread pool from the CPUs it may run on), OMP_NUM_THREADS,
OPENBLAS_NUM_THREADS and MKL_NUM_THREADS are 2, and kreg gets --threads 2.
Needs `pip install numpy jax` (--install runs it).
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHAPES = ["b128_n201088_k64", "b32_n201088_k64", "b64_n32768_k2048", "b1_n1000000_k100"]
THREADS = 2
SEED = 1


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("variants", nargs="*", default=["sort"], help="kreg topk variants (default: sort)")
    p.add_argument("--shapes", default=",".join(SHAPES),
                   help="comma-separated bB_nN_kK labels (default: all four)")
    p.add_argument("--input", help="use this float32 [batch, n] .npy instead of generated inputs")
    p.add_argument("--k", type=int, help="k for --input")
    p.add_argument("--reps", type=int, default=5, help="timed runs per implementation (default 5)")
    p.add_argument("--param", action="append", default=[],
                   help="VARIANT:NAME=VALUE passed to kreg as --param NAME=VALUE (repeatable)")
    p.add_argument("--check", action="store_true", help="also run kreg's --check (slow: a full sort)")
    p.add_argument("--kreg", default=str(ROOT / "build/release/bin/kreg"), help="the kreg binary")
    p.add_argument("--workdir", default=str(ROOT / "build/peers"), help="inputs and kreg outputs")
    p.add_argument("--install", action="store_true", help="pip install numpy and jax if missing")
    a = p.parse_args()
    if (a.input is None) != (a.k is None):
        p.error("--input and --k go together")
    if a.reps < 1:
        p.error("--reps must be >= 1")
    return a


def limit_threads(n):
    """Caps every runtime at n threads of execution; call before importing
    numpy or jax. Returns the CPUs pinned to."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    cpus = sorted(os.sched_getaffinity(0))[:n]
    os.sched_setaffinity(0, cpus)
    return cpus


def import_peers(install):
    """(numpy, jax or None), installing or explaining what is missing."""
    def missing():
        import importlib.util
        return [m for m in ("numpy", "jax") if importlib.util.find_spec(m) is None]
    if missing() and install:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing()], check=True)
    if "numpy" in missing():
        sys.exit(f"peers.py: needs NumPy: {sys.executable} -m pip install numpy jax  (or pass --install)")
    import numpy
    jax = None
    if "jax" in missing():
        print(f"peers.py: no JAX, skipping it ({sys.executable} -m pip install jax)", file=sys.stderr)
    else:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        import jax
    return numpy, jax


def parse_shape(label):
    try:
        b, n, k = label.split("_")
        assert b[0] == "b" and n[0] == "n" and k[0] == "k"
        return int(b[1:]), int(n[1:]), int(k[1:])
    except (ValueError, AssertionError, IndexError):
        sys.exit(f"peers.py: bad shape '{label}' (expected e.g. b32_n201088_k64)")


def median_ms(fn, reps):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def numpy_topk(np, x, k):
    part = np.argpartition(-x, k - 1, axis=1)[:, :k]
    vals = np.take_along_axis(x, part, axis=1)
    order = np.lexsort((part, -vals), axis=-1)  # value descending, then index
    return np.take_along_axis(part, order, axis=1)


def run_kreg(args, variant, path, k, outdir):
    """(median ms, indices) from the kreg command line."""
    params = [p.split(":", 1)[1] for p in args.param if p.split(":", 1)[0] == variant]
    cmd = [args.kreg, "run", f"topk/{variant}", "--input", f"input={path}", "--dims", f"k={k}",
           "--save-outputs", str(outdir), "--json", "--reps", str(args.reps), "--threads", str(THREADS)]
    for p in params:
        cmd += ["--param", p]
    if args.check:
        cmd.append("--check")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        lines = (r.stderr.strip() or r.stdout.strip()).splitlines()
        why = lines[-1] if lines else f"exit status {r.returncode}"
        return None, None, why.replace("|", "/")
    result = json.loads(r.stdout.strip().splitlines()[-1])
    note = "" if result["check"] == "skipped" else f"check {result['check']}"
    return result["median_ns"] / 1e6, outdir / "indices.npy", note


def differing_rows(np, a, b):
    """'exact differing rows (differing as sets)' between two index arrays."""
    if a is None or b is None:
        return "-"
    exact = int(np.any(a != b, axis=1).sum())
    sets = int(np.any(np.sort(a, axis=1) != np.sort(b, axis=1), axis=1).sum())
    return f"{exact} ({sets})" if exact else "0 (equal)"


def main():
    args = parse_args()
    cpus = limit_threads(THREADS)
    np, jax = import_peers(args.install)
    if not os.access(args.kreg, os.X_OK):
        sys.exit(f"peers.py: no kreg binary at {args.kreg}: cmake --preset release && "
                 "cmake --build --preset release")
    work = pathlib.Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)

    cases = []  # (label, path, k)
    if args.input:
        cases.append((f"{pathlib.Path(args.input).name} k={args.k}", pathlib.Path(args.input), args.k))
    else:
        for label in args.shapes.split(","):
            batch, n, k = parse_shape(label)
            path = work / f"normal_b{batch}_n{n}_seed{SEED}.npy"
            if not path.exists():
                rng = np.random.default_rng(SEED)
                np.save(path, rng.standard_normal((batch, n), dtype=np.float32))
            cases.append((label, path, k))

    print(f"threads: {THREADS} (pinned to CPUs {cpus}; OMP/OPENBLAS/MKL_NUM_THREADS={THREADS}; "
          f"kreg --threads {THREADS}); medians of {args.reps} runs; "
          f"numpy {np.__version__}, jax {jax.__version__ if jax else 'absent'}\n")
    for label, path, k in cases:
        x = np.load(path)
        if x.dtype != np.float32 or x.ndim != 2:
            sys.exit(f"peers.py: {path} must be float32 [batch, n], got {x.dtype} {x.shape}")
        rows = []  # (name, ms, indices, note)
        result = {}
        ms = median_ms(lambda: result.__setitem__("idx", numpy_topk(np, x, k)), args.reps)
        rows.append(("numpy argpartition+lexsort", ms, result["idx"], ""))
        np_idx = result["idx"]
        jax_idx = None
        if jax:
            f = jax.jit(lambda a: jax.lax.top_k(a, k))
            xd = jax.device_put(x)
            ms = median_ms(lambda: result.__setitem__("out", jax.block_until_ready(f(xd))), args.reps)
            jax_idx = np.asarray(result["out"][1])
            rows.append(("jax.lax.top_k (jit, cpu)", ms, jax_idx, ""))
        for variant in args.variants:
            outdir = work / f"out_{label.replace(' ', '_').replace('=', '')}_{variant}"
            ms, idx_path, note = run_kreg(args, variant, path, k, outdir)
            idx = np.load(idx_path) if idx_path else None
            rows.append((f"kreg topk/{variant}", ms, idx, note))

        print(f"### {label} (float32 normal, seed {SEED})\n")
        print("| implementation | median ms | vs numpy | rows != numpy (as sets) | rows != jax (as sets) | note |")
        print("|---|---:|---:|---:|---:|---|")
        base = rows[0][1]
        for name, ms, idx, note in rows:
            if ms is None:
                print(f"| {name} | failed | | | | {note} |")
                continue
            vs_np = "-" if name.startswith("numpy") else differing_rows(np, idx, np_idx)
            vs_jax = "-" if name.startswith("jax") else differing_rows(np, idx, jax_idx)
            print(f"| {name} | {ms:.3f} | {base / ms:.2f}x | {vs_np} | {vs_jax} | {note} |")
        print(f"\n({x.shape[0]} rows)\n")


if __name__ == "__main__":
    main()
