#!/usr/bin/env python3
"""Ratio tables from topk_bench's and gmm_bench's Google Benchmark JSON.

    build/release/bin/topk_bench --benchmark_repetitions=5 \\
        --benchmark_report_aggregates_only=true \\
        --benchmark_out=topk.json --benchmark_out_format=json
    python3 bench/ratios.py topk.json

Prints one markdown table per (dtype, shape): each entry's median time, its
ratio to the memory floor (floor/stream_read, 1.0 = as fast as reading the
input once), and its speed-up over topk/sort and peer/nth_element_sort.

gmm_bench's JSON (same flags; `python3 bench/ratios.py gmm.json`), named
BM_<op>/<shape>/<dtype>/<contestant>, gives one table per (op, shape,
dtype): median time, GFLOP/s (from the "flops" counter), the speed-up over
onednn_direct (oneDNN per group) and the fraction of onednn_dense (one
dense matmul of all rows: the roofline) reached.

Medians come from the "median" aggregates when present, else from the
median of the plain runs. Pure standard library.
"""
import argparse
import collections
import json
import statistics
import sys

FLOOR = "floor/stream_read"
BASELINES = ("topk/sort", "peer/nth_element_sort")
GMM_DIRECT, GMM_DENSE = "onednn_direct", "onednn_dense"  # gmm_bench's peers
TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}


def split_name(run_name):
    """'topk/sort/f32/b32_n201088_k64/real_time' -> ('topk/sort', 'f32', 'b32_...');
    gmm_bench's 'BM_gmm/skewed/f32/tiled/real_time' -> ('tiled', 'f32', 'gmm/skewed')."""
    parts = [p for p in run_name.split("/") if p != "real_time" and ":" not in p]  # min_time:0.3 etc.
    if parts[0].startswith("BM_"):
        return "/".join(parts[3:]), parts[2], parts[0][3:] + "/" + parts[1]
    return "/".join(parts[:-2]), parts[-2], parts[-1]


def is_gmm(shape):
    return shape.startswith(("gmm/", "tgmm/"))


def load(paths):
    """{(dtype, shape): {entry: (median_ms or None, error, label, gflop per call or None)}}."""
    runs = collections.defaultdict(list)  # (entry, dtype, shape) -> [ms]
    medians, errors, labels, order, gflop = {}, {}, {}, [], {}
    for path in paths:
        with open(path) as f:
            for b in json.load(f)["benchmarks"]:
                key = split_name(b.get("run_name", b["name"]))
                order.append(key)
                if b.get("label"):
                    labels[key] = b["label"]
                if b.get("error_occurred"):
                    errors[key] = b.get("error_message", "error")
                    continue
                ms = b["real_time"] * TO_MS[b.get("time_unit", "ns")]
                if "flops" in b and b.get("aggregate_name", "median") in ("mean", "median"):
                    # A rate: FLOP per call = rate * seconds per call.
                    gflop[key] = b["flops"] * ms * 1e-12
                if b.get("run_type") == "aggregate":
                    if b.get("aggregate_name") == "median":
                        medians[key] = ms
                else:
                    runs[key].append(ms)
    table = {}  # in the order the benchmarks ran
    for key in dict.fromkeys(order):
        entry, dtype, shape = key
        ms = medians.get(key)
        if ms is None and runs.get(key):
            ms = statistics.median(runs[key])
        table.setdefault((dtype, shape), {})[entry] = (ms, errors.get(key), labels.get(key, ""), gflop.get(key))
    return table


def ratio(num, den, fmt):
    return fmt.format(num / den) if num and den else "-"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", nargs="+", help="Google Benchmark JSON file(s)")
    args = parser.parse_args()
    table = load(args.json)
    if not table:
        sys.exit("ratios.py: no benchmarks in " + ", ".join(args.json))
    for dtype, shape in table:
        rows = table[(dtype, shape)]
        if is_gmm(shape):
            print_gmm(dtype, shape, rows)
            continue
        floor = rows.get(FLOOR, (None,))[0]
        base = [rows.get(b, (None,))[0] for b in BASELINES]
        print(f"### {dtype} {shape}\n")
        print("| entry | median ms | x floor | vs topk/sort | vs nth_element_sort | params |")
        print("|---|---:|---:|---:|---:|---|")
        ordered = sorted(rows.items(), key=lambda kv: (kv[1][0] is None, kv[1][0] or 0.0, kv[0]))
        for entry, (ms, error, label, _) in ordered:
            if ms is None:
                print(f"| {entry} | error: {error} | | | | |")
                continue
            print(f"| {entry} | {ms:.3f} | {ratio(ms, floor, '{:.2f}')} | "
                  f"{ratio(base[0], ms, '{:.2f}x')} | {ratio(base[1], ms, '{:.2f}x')} | {label} |")
        print()


def print_gmm(dtype, shape, rows):
    direct = rows.get(GMM_DIRECT, (None,))[0]
    dense = rows.get(GMM_DENSE, (None,))[0]
    print(f"### {shape} {dtype}\n")
    print(f"| entry | median ms | GFLOP/s | vs {GMM_DIRECT} | of {GMM_DENSE} | label |")
    print("|---|---:|---:|---:|---:|---|")
    # Per-call times by speed, then the prepare (packing) times, then errors.
    ordered = sorted(rows.items(), key=lambda kv: (kv[1][0] is None, kv[0].endswith("_pack_time"),
                                                    kv[1][0] or 0.0, kv[0]))
    for entry, (ms, error, label, gflop) in ordered:
        if ms is None:
            print(f"| {entry} | error: {error} | | | | |")
            continue
        if entry.endswith("_pack_time"):  # not a call: no rate, no ratio
            print(f"| {entry} | {ms:.3f} | - | - | - | {label} |")
            continue
        rate = f"{gflop / (ms * 1e-3):.1f}" if gflop else "-"
        print(f"| {entry} | {ms:.1f} | {rate} | {ratio(direct, ms, '{:.2f}x')} | "
              f"{ratio(dense, ms, '{:.0%}')} | {label} |")
    print()


if __name__ == "__main__":
    main()
