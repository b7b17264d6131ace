#!/usr/bin/env python3
"""What the tuner is worth, measured through the `kreg` command line.

    python3 bench/tuner_worth.py                      # the three seed shapes, ~4 min here
    python3 bench/tuner_worth.py --shape batch=128,n=201088,k=64   # ~4 min more

For each shape it tunes topk twice, into two fresh tables: `--strategy
exhaustive` and `--strategy halving` (wall time of each with time.monotonic
around the process). Then it re-measures, with `kreg run --reps N`, in
interleaved rounds so that drift on a shared machine hits every entry alike:

  * the tuned winner: `kreg run topk --db EXHAUSTIVE` (and `--db HALVING`);
  * the registry default: `kreg run topk --db EMPTY` (what kreg runs with
    nothing tuned: the Lut's default preference, radix then sort);
  * each variant at its default config (`kreg run topk/V`) and at the best
    config the exhaustive sweep found for it (`--param ...`).

Each figure is the median over rounds of kreg's own median. The tune-time
medians are not compared with each other: they were taken minutes apart.
Prints markdown. Pure standard library.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SEED_SHAPES = ["batch=32,n=201088,k=64", "batch=64,n=32768,k=2048", "batch=1,n=1000000,k=100"]
# The target for halving: within 3% of the exhaustive optimum in at
# most 25% of its time.
TARGET_BEST, TARGET_TIME = 1.03, 0.25


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def kreg(args, binary):
    out = subprocess.run([binary] + args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"tuner_worth: kreg {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def parse_textproto(text):
    """kreg db export's text format (one field per line) -> nested dicts of lists."""
    root = {}
    stack = [root]
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.endswith("{"):
            child = {}
            stack[-1].setdefault(line[:-1].strip(), []).append(child)
            stack.append(child)
        elif line == "}":
            stack.pop()
        else:
            name, _, value = line.partition(":")
            value = value.strip()
            stack[-1].setdefault(name.strip(), []).append(json.loads(value) if value.startswith('"') else value)
    return root


def config_params(trial):
    """A stored trial's config as kreg run's NAME=VALUE parameters."""
    params = []
    for p in trial.get("config", [{}])[0].get("params", []):
        if "int_value" in p:
            value = p["int_value"][0]
        elif "list_value" in p:
            value = ",".join(p["list_value"][0].get("values", []))
        else:
            value = p["choice"][0]
        params.append(f"{p['name'][0]}={value}")
    return params


def winners(db_path, binary):
    """(overall best trial, {variant: its fastest OK trial}) of a one-entry table."""
    entry = parse_textproto(kreg(["db", "export", db_path], binary))["entries"][0]
    per_variant = {}
    for t in entry.get("trials", []):
        if t["status"][0] != "OK":
            continue
        v = t["variant"][0]
        if v not in per_variant or float(t["median_ns"][0]) < float(per_variant[v]["median_ns"][0]):
            per_variant[v] = t
    return entry["best"][0], per_variant


def default_configs(binary):
    """{variant: its default NAME=VALUE parameters} of every available topk kernel."""
    out = {}
    for plugin in json.loads(kreg(["list", "--json"], binary))["plugins"]:
        for k in plugin["kernels"]:
            if k["kernel"].startswith("topk/") and k["available"] and not k["reference"]:
                out[k["variant"]] = [f"{name}={param_text(value)}" for name, value in k["default_params"].items()]
    return out


def param_text(value):
    """A --param value as kreg reads it: lists as 5,8,12."""
    return ",".join(str(v) for v in value) if isinstance(value, list) else str(value)


def describe(trial):
    return " ".join([f"topk/{trial['variant'][0]}"] + config_params(trial))


def tune(shape, strategy, db_path, args):
    cmd = ["tune", "topk", "--dims", shape, "--db", db_path, "--strategy", strategy,
           "--max-list-len", str(args.max_list_len), "--json"]
    start = time.monotonic()
    out = json.loads(kreg(cmd, args.kreg))
    out["wall_s"] = time.monotonic() - start
    return out


def measure_all(entries, shape, args):
    """entries: {label: kreg run arguments}. Median over rounds of kreg's median, in ms."""
    runs = {label: [] for label in entries}
    meta = {}
    for r in range(args.rounds):
        log(f"  re-measuring, round {r + 1}/{args.rounds}")
        for label, run_args in entries.items():
            out = json.loads(kreg(["run"] + run_args + ["--dims", shape, "--reps", str(args.reps), "--json"],
                                  args.kreg))
            runs[label].append(out["median_ns"] / 1e6)
            meta[label] = out
    return {label: (statistics.median(v), min(v), max(v)) for label, v in runs.items()}, meta


def run_description(out):
    params = " ".join(f"{k}={param_text(v)}" for k, v in out["params"].items())
    return f"{out['kernel']} {params}".strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kreg", default="build/release/bin/kreg")
    parser.add_argument("--shape", action="append", help="NAME=V,... (repeatable; default: the seed shapes)")
    parser.add_argument("--max_list_len", type=int, default=2,
                        help="kreg tune --max_list_len (m_schedule lists); 2 is kreg's default")
    parser.add_argument("--reps", type=int, default=20, help="kreg run --reps for each re-measurement")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved re-measurement rounds")
    parser.add_argument("--keep", help="folder for the tables (default: a temporary one, removed)")
    args = parser.parse_args()
    shapes = args.shape or SEED_SHAPES
    defaults = default_configs(args.kreg)
    started = time.monotonic()

    folder = args.keep or tempfile.mkdtemp(prefix="kreg_tuner_worth_")
    os.makedirs(folder, exist_ok=True)
    # A table with nothing tuned: every query gets the default answer.
    empty = os.path.join(folder, "empty.txtpb")
    with open(empty, "w") as f:
        f.write("schema_version: 1\n")

    worth_tables, halving_rows = [], []
    for shape in shapes:
        label = shape.replace("batch=", "b").replace(",n=", "_n").replace(",k=", "_k")
        dbs = {}
        tuned = {}
        for strategy in ("exhaustive", "halving"):
            dbs[strategy] = os.path.join(folder, f"{label}_{strategy}.kdb")
            for stale in (dbs[strategy], dbs[strategy] + ".lock"):
                if os.path.exists(stale):
                    os.remove(stale)
            log(f"{shape}: kreg tune --strategy {strategy}")
            tuned[strategy] = tune(shape, strategy, dbs[strategy], args)
            best = tuned[strategy]["best"]
            log(f"  {best['kernel'] if best else 'no candidate succeeded'}  ({tuned[strategy]['wall_s']:.1f} s)")
        best = {s: winners(dbs[s], args.kreg)[0] for s in dbs}
        _, per_variant = winners(dbs["exhaustive"], args.kreg)

        entries = {
            "tuned winner (exhaustive table)": ["topk", "--db", dbs["exhaustive"]],
            "tuned winner (halving table)": ["topk", "--db", dbs["halving"]],
            "registry default (empty table)": ["topk", "--db", empty],
        }
        for v in defaults:
            entries[f"topk/{v} default"] = [f"topk/{v}"]
            # A variant whose best is its default is measured once.
            if v in per_variant and config_params(per_variant[v]) != defaults[v]:
                entries[f"topk/{v} tuned"] = [f"topk/{v}"] + [a for p in config_params(per_variant[v])
                                                              for a in ("--param", p)]
        ms, meta = measure_all(entries, shape, args)

        # Tuner's worth: the tuned winner against every default.
        winner_ms = ms["tuned winner (exhaustive table)"][0]
        rows = [f"#### {label} (f32; medians of {args.rounds} rounds of `kreg run --reps {args.reps}`)", "",
                "| entry | kernel and config | median ms | rounds min-max ms | tuned winner faster by |",
                "|---|---|---:|---:|---:|"]
        for name, (value, low, high) in ms.items():
            rows.append(f"| {name} | {run_description(meta[name])} | {value:.3f} | {low:.3f}-{high:.3f} | "
                        f"{value / winner_ms:.2f}x |")
        worth_tables.append("\n".join(rows) + "\n")

        # Halving against exhaustive.
        same = config_params(best["exhaustive"]) == config_params(best["halving"]) and \
            best["exhaustive"]["variant"] == best["halving"]["variant"]
        exh_ms, halv_ms = winner_ms, ms["tuned winner (halving table)"][0]
        best_ratio = 1.0 if same else halv_ms / exh_ms
        time_ratio = tuned["halving"]["wall_s"] / tuned["exhaustive"]["wall_s"]
        met = "yes" if best_ratio <= TARGET_BEST and time_ratio <= TARGET_TIME else "no"
        halving_rows.append(
            f"| {label} | {tuned['exhaustive']['counts']['candidates']} | {describe(best['exhaustive'])} | "
            f"{tuned['exhaustive']['wall_s']:.1f} | {describe(best['halving'])} | {tuned['halving']['wall_s']:.1f} | "
            f"{exh_ms:.3f} | {halv_ms:.3f} | {best_ratio:.3f}{' (same config)' if same else ''} | "
            f"{time_ratio:.1%} | {met} |")

    print(f"kreg tune --max_list_len {args.max_list_len} (--reps 10, the default, for both strategies); "
          f"re-measured with kreg run --reps {args.reps}, {args.rounds} interleaved rounds; "
          f"total {time.monotonic() - started:.0f} s\n")
    print("### The tuner's worth\n")
    print("\n".join(worth_tables))
    print("### Halving against exhaustive\n")
    print("Wall times are whole `kreg tune` processes into fresh tables. The two winners are re-measured "
          "together above; with the same config the ratio is 1 by definition.\n")
    print("| shape | candidates | exhaustive winner | exhaustive s | halving winner | halving s | "
          "exhaustive winner ms | halving winner ms | halving / exhaustive best | halving time | "
          f"within {TARGET_BEST - 1:.0%} in <= {TARGET_TIME:.0%} |")
    print("|---|---:|---|---:|---|---:|---:|---:|---:|---:|---|")
    print("\n".join(halving_rows))
    if not args.keep:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
