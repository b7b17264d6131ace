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

collectives_bench's JSON (alone, and under mpirun; same flags), named
threads/<op>/<variant>/r<P>/<size>, mpi/<op>/<variant>/r<P>/<size> and
peer/memcpy/<size>, gives one table per (backend, op, ranks): per size each
variant's median time, and for mpi its speed-up over Open MPI's own
(mpi/<op>/peer_mpi), for threads its bus bandwidth as a fraction of
memcpy's bandwidth at that size (peer/memcpy).

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


def collective_runs(paths):
    """{name without /manual_time: (median us, busbw or bw in bytes/s)} of collectives_bench."""
    runs = collections.defaultdict(list)
    for path in paths:
        with open(path) as f:
            for b in json.load(f)["benchmarks"]:
                name = b.get("run_name", b["name"]).replace("/manual_time", "")
                if not name.startswith(("threads/", "mpi/", "peer/memcpy/")) or b.get("error_occurred"):
                    continue
                if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
                    continue
                us = b["real_time"] * TO_MS[b.get("time_unit", "ns")] * 1e3
                runs[name].append((us, b.get("busbw", b.get("bw", 0.0))))
    return {name: sorted(v)[len(v) // 2] for name, v in runs.items()}


def print_collectives(runs):
    """One table per (backend, op, ranks): sizes down, variants across."""
    tables = collections.defaultdict(lambda: collections.defaultdict(dict))  # (backend, op, r) -> size -> variant
    for name, value in runs.items():
        parts = name.split("/")
        if parts[0] in ("threads", "mpi"):
            backend, op, variant, ranks, size = parts
            tables[(backend, op, ranks)][size][variant] = value
    memcpy = {name.split("/")[2]: v for name, v in runs.items() if name.startswith("peer/memcpy/")}
    for (backend, op, ranks), sizes in tables.items():
        variants = sorted({v for row in sizes.values() for v in row if v != "peer_mpi"})
        what = "vs Open MPI" if backend == "mpi" else "busbw / memcpy bw"
        print(f"### {backend} {op} {ranks}: median us ({what})\n")
        print("| size | " + " | ".join(variants) + (" | Open MPI |" if backend == "mpi" else " | memcpy GB/s |"))
        print("|---|" + "---:|" * (len(variants) + 1))
        for size, row in sizes.items():
            cells = []
            for v in variants:
                if v not in row:
                    cells.append("-")
                    continue
                us, busbw = row[v]
                if backend == "mpi":
                    peer = row.get("peer_mpi", (None,))[0]
                    cells.append(f"{us:.1f} ({ratio(peer, us, '{:.2f}x')})")
                else:
                    bw = memcpy.get(size, (None, None))[1]
                    cells.append(f"{us:.1f} ({ratio(busbw, bw, '{:.0%}')})")
            last = (f"{row['peer_mpi'][0]:.1f}" if "peer_mpi" in row else "-") if backend == "mpi" else (
                f"{memcpy[size][1] / 1e9:.2f}" if size in memcpy else "-")
            print(f"| {size} | " + " | ".join(cells) + f" | {last} |")
        print()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", nargs="+", help="Google Benchmark JSON file(s)")
    args = parser.parse_args()
    collectives = collective_runs(args.json)
    if collectives:
        print_collectives(collectives)
        return
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
