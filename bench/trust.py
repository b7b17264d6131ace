#!/usr/bin/env python3
"""Can the tuner's answers be trusted? Measured through the `kreg` command line.

    python3 bench/trust.py search --family topk     # budgeted search against exhaustive
    python3 bench/trust.py nearest --family topk    # nearest answers against fresh tunes
    python3 bench/trust.py defaults                 # measured defaults against this machine's table

search: for each of the family's five shapes, one exhaustive sweep and
--runs independent halving sweeps, each into a fresh table, timed around
the process. Then every table's choice is run (`kreg run OP --db TABLE`) in
--rounds interleaved rounds (the tables in rotated order each round), so
drift on a shared machine falls on all alike. A halving run passes when its
choice is exhaustive's, or its median ratio to exhaustive's choice is at
most 1.03, or the rounds' ratios straddle 1 (the two measurements' own
spread cannot tell them apart); and its sweep took at most 25% of
exhaustive's time.

nearest: tunes a grid of shapes (halving) into one table, and each held-out
shape exhaustively into its own; then runs, interleaved, the grid table's
answer for each held-out shape (nearest), its fresh best, and the op's
default with nothing tuned. A nearest answer that is the fresh best's
kernel and parameters counts as 1 (its runs' ratio, shown beside it, is
the machine's noise). Goal: nearest's median ratio to the fresh best
at most 1.05, none above 1.20, and on average no worse than the default.

defaults: for each shape of this machine's shipped table, the default kreg
derives from the other machines' shipped tables (`--machine strict`, this
machine's table left out) against this machine's tuned choice, interleaved.

scaling: each kernel of SCALING run on 1, 2, 4, ... threads up to all cores
(`kreg run KERNEL --threads T`), the thread counts interleaved per round.

Prints markdown on stdout, progress on stderr. Pure standard library.
"""
import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Per family: (op, dims, extra flags) of five shapes to search, a grid and
# held-out shapes for nearest answers.
FAMILIES = {
    "topk": {
        "search": [("topk", "batch=32,n=201088,k=64", []), ("topk", "batch=64,n=32768,k=2048", []),
                   ("topk", "batch=1,n=1000000,k=100", []), ("topk", "batch=16,n=4096,k=8", []),
                   ("topk", "batch=128,n=32000,k=50", [])],
        "grid": [("topk", f"batch={b},n={n},k={k}", []) for b in (4, 64) for n in (4096, 131072) for k in (16, 1024)],
        "held_out": [("topk", d, []) for d in ("batch=16,n=16384,k=64", "batch=8,n=65536,k=256",
                                               "batch=32,n=8192,k=32", "batch=2,n=100000,k=100",
                                               "batch=128,n=4096,k=512", "batch=24,n=50000,k=16")],
    },
    "gmm": {
        "search": [("gmm", "m=2048,k=1024,n=1024,groups=8", ["--partition", "balanced"]),
                   ("gmm", "m=2048,k=1024,n=1024,groups=32", ["--partition", "skewed"]),
                   ("gmm", "m=1024,k=2048,n=512,groups=4", ["--partition", "balanced"]),
                   ("tgmm", "m=2048,k=512,n=512,groups=8", ["--partition", "balanced"]),
                   ("tgmm", "m=2048,k=512,n=512,groups=32", ["--partition", "skewed"])],
        "grid": [("gmm", f"m={m},k={k},n=512,groups={g}", ["--partition", "balanced"])
                 for m in (512, 2048) for k in (256, 1024) for g in (4, 16)],
        "held_out": [("gmm", d, ["--partition", "balanced"]) for d in ("m=1024,k=512,n=512,groups=8",
                                                                       "m=768,k=384,n=512,groups=4",
                                                                       "m=1536,k=768,n=512,groups=12")],
    },
    "collectives": {
        "search": [("allreduce", "count=1048576", ["--ranks", "2"]), ("allreduce", "count=4096", ["--ranks", "3"]),
                   ("allgather", "count=262144", ["--ranks", "2"]), ("reduce_scatter", "count=65536", ["--ranks", "4"]),
                   ("sharded_matmul", "m=256,k=256,n=256", ["--mesh", "2x1", "--ranks", "2"])],
        "grid": [("allreduce", f"count={c}", ["--ranks", "2"]) for c in (1024, 65536, 4194304)],
        "held_out": [("allreduce", d, ["--ranks", "2"]) for d in ("count=8192", "count=524288")],
    },
}

# Kernels and problems whose time on 1 to all cores `scaling` measures: long
# and short rows, many and few, large and tiny matmuls.
SCALING = [("topk/heap", "batch=1,n=1000000,k=100", []), ("topk/heap", "batch=128,n=201088,k=64", []),
           ("topk/heap", "batch=16,n=4096,k=8", []), ("topk/radix", "batch=64,n=32768,k=2048", []),
           ("topk/heap", "batch=2,n=1000,k=8", []), ("topk/radix", "batch=4,n=3000,k=32", []),
           ("gmm/tiled", "m=2048,k=1024,n=1024,groups=8", ["--partition", "balanced"]),
           ("gmm/onednn", "m=2048,k=1024,n=1024,groups=8", ["--partition", "balanced"]),
           ("gmm/tiled", "m=64,k=64,n=64,groups=2", ["--partition", "balanced"])]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Kreg:
    def __init__(self, binary, plugins):
        self.binary = binary
        self.plugins = plugins

    def __call__(self, args, env=None):
        cmd = [self.binary] + (["--plugin-path", self.plugins] if self.plugins else []) + args
        full_env = dict(os.environ, KREG_TABLE_PATH="")  # no shipped tables unless `env` names some
        full_env.update(env or {})
        out = subprocess.run(cmd, capture_output=True, text=True, env=full_env)
        if out.returncode != 0:
            sys.exit(f"trust: {' '.join(cmd)}: {out.stderr.strip()}")
        return out.stdout

    def tune(self, shape, db, strategy, budget=0):
        op, dims, extra = shape
        start = time.monotonic()
        self(["tune", op, "--dims", dims, "--db", db, "--strategy", strategy, "--timeout", "30"] + extra +
             (["--budget", str(budget)] if budget else []))
        return time.monotonic() - start

    def choice(self, shape, db, env=None, flags=()):
        """The kernel, params and thread count the table answers with, as one string."""
        op, dims, extra = shape
        # query asks for a data class where run and tune generate it.
        extra = ["--data-class" if x == "--partition" else x for x in extra]
        answer = json.loads(self(["query", op, "--dims", dims, "--db", db, "--json"] + extra + list(flags),
                                 env).splitlines()[0])
        params = " ".join(f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}"
                          for k, v in answer["params"].items())
        threads = answer.get("threads", 0)
        on = f" on {threads} thread{'s' if threads > 1 else ''}" if threads else ""
        return f"`{answer['kernel']}{' ' + params if params else ''}{on}`"

    def run_median(self, shape, db, reps, env=None, flags=()):
        op, dims, extra = shape
        out = self(["run", op, "--db", db, "--dims", dims, "--reps", str(reps), "--json"] + extra + list(flags), env)
        return json.loads(out.splitlines()[0])["median_ns"]

    def kernel_median(self, kernel, dims, extra, threads, reps):
        out = self(["run", kernel, "--dims", dims, "--threads", str(threads), "--reps", str(reps), "--json"] + extra)
        return json.loads(out.splitlines()[0])["median_ns"]


def interleaved(kreg, shape, entries, rounds, reps):
    """entries: name -> (db, env, flags). Median ns per entry per round, rotated order."""
    names = list(entries)
    times = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            db, env, flags = entries[n]
            times[n].append(kreg.run_median(shape, db, reps, env, flags))
    return times


def empty_table(scratch):
    """A table with nothing in it: what kreg answers untuned."""
    path = os.path.join(scratch, "empty.txtpb")
    with open(path, "w") as f:
        f.write("schema_version: 2\n")
    return path


def search(kreg, family, args, scratch):
    shapes = FAMILIES[family]["search"]
    print(f"### Budgeted search against exhaustive: {family}\n")
    print(f"`python3 bench/trust.py search --family {family} --runs {args.runs} --rounds {args.rounds}`; "
          f"ratio: median over {args.rounds} interleaved rounds of (halving's choice / exhaustive's choice), "
          f"`kreg run --reps {args.reps}` each; [min, max] of the rounds' ratios.\n")
    print("| problem | exhaustive: choice, time | halving run | choice | time (share) | ratio [min, max] | pass |")
    print("|---|---|---|---|---|---|---|")
    passed = total = 0
    for shape in shapes:
        op, dims, extra = shape
        name = f"{op} {dims} {' '.join(extra)}".strip()
        log(f"{name}: exhaustive")
        ex_db = os.path.join(scratch, f"{op}_{len(os.listdir(scratch))}_ex.lut")
        ex_time = kreg.tune(shape, ex_db, "exhaustive")
        ex_choice = kreg.choice(shape, ex_db, flags=["--no-shipped"])
        runs = []
        for run in range(args.runs):
            log(f"{name}: halving run {run + 1}")
            db = os.path.join(scratch, f"{op}_{len(os.listdir(scratch))}_h.lut")
            runs.append((db, kreg.tune(shape, db, "halving"), kreg.choice(shape, db, flags=["--no-shipped"])))
        entries = {"exhaustive": (ex_db, None, ["--no-shipped"])}
        for i, (db, _, _) in enumerate(runs):
            entries[f"halving{i}"] = (db, None, ["--no-shipped"])
        log(f"{name}: measuring the choices")
        times = interleaved(kreg, shape, entries, args.rounds, args.reps)
        for i, (db, seconds, choice) in enumerate(runs):
            ratios = [h / e for h, e in zip(times[f"halving{i}"], times["exhaustive"])]
            ratio = statistics.median(ratios)
            same = choice == ex_choice
            share = seconds / ex_time
            ok = (same or ratio <= 1.03 or min(ratios) <= 1.0 <= max(ratios)) and share <= 0.25
            passed += ok
            total += 1
            print(f"| {name if i == 0 else ''} | {ex_choice if i == 0 else ''}{f', {ex_time:.0f} s' if i == 0 else ''} "
                  f"| {i + 1} | {'same' if same else choice} | {seconds:.0f} s ({share:.0%}) "
                  f"| {ratio:.3f} [{min(ratios):.3f}, {max(ratios):.3f}] | {'yes' if ok else 'NO'} |", flush=True)
    print(f"\n{passed} of {total} runs pass.\n")


def nearest(kreg, family, args, scratch):
    grid, held_out = FAMILIES[family]["grid"], FAMILIES[family]["held_out"]
    grid_db = os.path.join(scratch, f"{family}_grid.lut")
    empty_db = empty_table(scratch)
    for shape in grid:
        log(f"grid: {shape[1]}")
        kreg.tune(shape, grid_db, "halving")
    print(f"### Nearest answers against fresh tunes: {family}\n")
    print(f"`python3 bench/trust.py nearest --family {family} --rounds {args.rounds}`: a grid of {len(grid)} shapes "
          f"tuned (halving) into one table; each held-out shape tuned exhaustively into its own; ratios are medians "
          f"over {args.rounds} interleaved rounds of `kreg run --reps {args.reps}`.\n")
    print("| held-out problem | fresh best | nearest answer | nearest / best | default / best |")
    print("|---|---|---|---|---|")
    near_ratios, default_ratios = [], []
    for shape in held_out:
        log(f"held out: {shape[1]}")
        fresh_db = os.path.join(scratch, f"{family}_fresh_{len(os.listdir(scratch))}.lut")
        kreg.tune(shape, fresh_db, "exhaustive")
        entries = {"best": (fresh_db, None, ["--no-shipped"]), "nearest": (grid_db, None, ["--no-shipped"]),
                   "default": (empty_db, None, ["--no-shipped"])}
        times = interleaved(kreg, shape, entries, args.rounds, args.reps)
        measured = statistics.median(n / b for n, b in zip(times["nearest"], times["best"]))
        default = statistics.median(d / b for d, b in zip(times["default"], times["best"]))
        best_choice = kreg.choice(shape, fresh_db, flags=["--no-shipped"])
        near_choice = kreg.choice(shape, grid_db, flags=["--no-shipped"])
        # The same kernel and parameters are the same answer: what their runs
        # measured apart is the machine's noise, shown beside it.
        near = 1.0 if near_choice == best_choice else measured
        near_ratios.append(near)
        default_ratios.append(default)
        shown = f"1 (same; runs {measured:.3f})" if near_choice == best_choice else f"{near:.3f}"
        print(f"| {shape[0]} {shape[1]} | {best_choice} | {'same' if near_choice == best_choice else near_choice} "
              f"| {shown} | {default:.3f} |", flush=True)
    geo = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))
    print(f"\nnearest / best: median {statistics.median(near_ratios):.3f}, worst {max(near_ratios):.3f}, "
          f"geometric mean {geo(near_ratios):.3f}; default / best: geometric mean {geo(default_ratios):.3f} "
          f"(goal: median <= 1.05, worst <= 1.20, nearest no worse than the default on average).\n")


def defaults(kreg, args, scratch):
    machine = json.loads(kreg(["machine", "--json"]))
    tables = os.path.join(ROOT, "tuning_db", "tables")
    own = os.path.join(tables, machine["class"] + ".txtpb")
    if not os.path.exists(own):
        sys.exit(f"trust: no shipped table for this machine's class ({own}); run data/tables/retune.sh")
    others = os.path.join(scratch, "others")
    os.makedirs(others, exist_ok=True)
    for name in os.listdir(tables):
        if name.endswith(".txtpb") and name != os.path.basename(own):
            shutil.copy(os.path.join(tables, name), others)
    empty_db = empty_table(scratch)
    shapes = []
    for line in kreg(["db", "show", own]).splitlines():  # "OP DTYPE DIMS [CLASS] @MACHINE -> ..."
        key = line.split(" @")[0].split(" ")
        extra = ["--dtype", key[1].split(",")[0]] if key[1].split(",")[0] != "f32" else []
        if len(key) > 3 and key[3].startswith("[backend="):
            continue  # collectives: their defaults come from the calibrated model first
        if len(key) > 3:
            extra += ["--partition", key[3].strip("[]")]
        shapes.append((key[0], key[2], extra))
    print(f"### Measured defaults against this machine's tuned choice ({machine['class']})\n")
    print(f"`python3 bench/trust.py defaults`: the default derived from the other machine classes' shipped tables "
          f"(this class's left out, `--machine strict`) against this class's table, medians over {args.rounds} "
          f"interleaved rounds of `kreg run --reps {args.reps}`.\n")
    print("| problem | tuned here | measured default (from other machines) | default / tuned |")
    print("|---|---|---|---|")
    ratios = []
    for shape in shapes:
        log(f"defaults: {shape[0]} {shape[1]} {' '.join(shape[2])}")
        run_shape = (shape[0], shape[1], shape[2])
        entries = {"tuned": (own, {"KREG_TABLE_PATH": ""}, ["--machine", "strict"]),
                   "default": (empty_db, {"KREG_TABLE_PATH": others}, ["--machine", "strict"])}
        times = interleaved(kreg, run_shape, entries, args.rounds, args.reps)
        ratio = statistics.median(d / t for d, t in zip(times["default"], times["tuned"]))
        ratios.append(ratio)
        print(f"| {shape[0]} {shape[1]} {' '.join(shape[2])} "
              f"| {kreg.choice(run_shape, own, {'KREG_TABLE_PATH': ''}, ['--machine', 'strict'])} "
              f"| {kreg.choice(run_shape, empty_db, {'KREG_TABLE_PATH': others}, ['--machine', 'strict'])} "
              f"| {ratio:.3f} |", flush=True)
    print(f"\ndefault / tuned: median {statistics.median(ratios):.3f}, worst {max(ratios):.3f} over {len(ratios)} "
          f"problems.\n")


def scaling(kreg, args):
    cores = int(json.loads(kreg(["machine", "--json"]))["cores"])
    counts = sorted({1 << i for i in range(cores.bit_length()) if 1 << i < cores} | {cores})
    print(f"### Scaling from 1 to {cores} cores\n")
    print(f"`python3 bench/trust.py scaling --rounds {args.rounds} --reps {args.reps}`: `kreg run KERNEL --threads T "
          f"--reps {args.reps}`, median over {args.rounds} rounds (the thread counts interleaved in each).\n")
    print("| kernel, problem | " + " | ".join(f"{t} thread{'s' if t > 1 else ''}" for t in counts) +
          " | best speed-up |")
    print("|---|" + "---|" * len(counts) + "---|")
    for kernel, dims, extra in SCALING:
        log(f"scaling: {kernel} {dims}")
        times = {t: [] for t in counts}
        for r in range(args.rounds):
            for t in counts[r % len(counts):] + counts[:r % len(counts)]:
                times[t].append(kreg.kernel_median(kernel, dims, extra, t, args.reps))
        med = {t: statistics.median(v) for t, v in times.items()}
        fmt = lambda ns: f"{ns / 1e6:.2f} ms" if ns >= 1e6 else f"{ns / 1e3:.1f} us"
        best = min(counts, key=lambda t: med[t])
        print(f"| {kernel} {dims} | " + " | ".join(fmt(med[t]) for t in counts) +
              f" | {med[1] / med[best]:.1f}x on {best} |", flush=True)
    print()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["search", "nearest", "defaults", "scaling"])
    parser.add_argument("--family", choices=sorted(FAMILIES), default="topk")
    parser.add_argument("--kreg", default=os.path.join(ROOT, "build", "release", "bin", "kreg"))
    parser.add_argument("--plugin-path", default="")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    kreg = Kreg(args.kreg, args.plugin_path)
    scratch = tempfile.mkdtemp(prefix="kreg_trust_")
    try:
        if args.mode == "search":
            search(kreg, args.family, args, scratch)
        elif args.mode == "scaling":
            scaling(kreg, args)
        elif args.mode == "nearest":
            nearest(kreg, args.family, args, scratch)
        else:
            defaults(kreg, args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
