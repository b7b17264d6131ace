#!/usr/bin/env python3
"""Per-call cost of kreg's Python entry points on a small problem, against
NumPy's own selection on the same row: a 1x1024 f32 top-k with k=8.

    PYTHONPATH=build/release/python KREG_TABLE_PATH=build/release/share/kreg/tables \\
        /usr/bin/python3 bench/python_calls.py [--rounds 7] [--calls 20000]

Each round times `calls` calls of each entry point, the entry points
interleaved; the figures are the median (and [min, max]) over the rounds of
the microseconds per call:
  registry.run   Registry.run("topk/heap", input=x, k=8)
  dispatcher.run Dispatcher(registry).run("topk", input=x, k=8) (the
                 table's answer for the shape is remembered after the first)
  kernel only    the same kernel's time inside kreg (kreg run's median)
  argpartition   numpy.argpartition(x, -8) then a sort of the 8 (NumPy's
                 top-k, the floor a Python user compares with)
"""
import argparse
import statistics
import time

import numpy as np

import kreg


def per_call_us(fn, calls):
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    x = np.random.default_rng(1).standard_normal((1, 1024), dtype=np.float32)
    registry = kreg.Registry()
    dispatcher = kreg.Dispatcher(registry=registry)

    def numpy_topk():
        i = np.argpartition(x[0], -8)[-8:]
        return i[np.argsort(-x[0][i])]

    entries = {
        "registry.run": lambda: registry.run("topk/heap", input=x, k=8),
        "dispatcher.run": lambda: dispatcher.run("topk", input=x, k=8),
        "argpartition": numpy_topk,
    }
    times = {name: [] for name in entries}
    for _ in range(args.rounds):
        for name, fn in entries.items():
            times[name].append(per_call_us(fn, args.calls))
    print(f"1x1024 f32 top-k, k=8; us per call, median [min, max] of {args.rounds} rounds of {args.calls} calls")
    print(f"dispatcher ran {dispatcher.last['kernel']} {dispatcher.last['params']}")
    for name, ts in times.items():
        print(f"{name:15s} {statistics.median(ts):7.2f}  [{min(ts):.2f}, {max(ts):.2f}]")


if __name__ == "__main__":
    main()
