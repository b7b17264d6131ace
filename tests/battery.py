#!/usr/bin/python3
"""Bad input against the kreg binary, as a user would give it; counts outcomes.

Usage: tests/battery.py KREG PLUGIN_DIR [--cases N] [--seed S]

Categories: single-bit flips and cuts of a binary table, mutated .npy
headers, malformed flags, kills of a sweep with resumes, concurrent
tuners on one table. For each case an outcome:
  clean  - one error line "kreg CMD: ..." on stderr, exit 1 or 2
           (or success where the input was still valid);
  crash  - killed by a signal, a sanitizer report, or a multi-line error;
  hang   - no answer within the time limit;
  lost   - a failing command changed a file it was given, or a table lost
           an entry it had.
Prints a Markdown table; exits 1 if any case crashed, hung or lost data.
Needs no NumPy.
"""
import argparse
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

LIMIT = 60  # seconds per command


def run(kreg, plugins, args, timeout=LIMIT):
    try:
        p = subprocess.run([kreg, "--plugin-path", plugins] + args, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    return p


def outcome(p, ok_allowed=True):
    """clean, crash or hang for one finished (or timed-out) command."""
    if p is None:
        return "hang"
    err = p.stderr.decode("utf-8", "replace")
    if p.returncode < 0 or "Sanitizer" in err or "runtime error" in err:
        return "crash"
    if p.returncode == 0:
        return "clean" if ok_allowed else "crash"
    if p.returncode not in (1, 2):
        return "crash"
    lines = [l for l in err.splitlines() if not l.startswith("kreg") or ": warning: " not in l]
    if len(lines) != 1 or not re.match(r"kreg( [a-z]+)*: ", lines[0]):
        return "crash"
    if any(ord(c) < 0x20 for c in lines[0]):
        return "crash"  # an unescaped control byte reached the terminal
    return "clean"


def npy(shape, descr="<f4", header=None):
    if header is None:
        dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
        header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, dims)
    body = header.encode("latin-1")
    pad = (64 - (10 + len(body) + 1) % 64) % 64
    body += b" " * pad + b"\n"
    count = 1
    for d in shape:
        count *= d
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body + b"\x00" * (4 * count)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kreg")
    ap.add_argument("plugins")
    ap.add_argument("--cases", type=int, default=200, help="cases per random category")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    work = tempfile.mkdtemp(prefix="kreg_battery_")
    results = {}

    def count(category, result, what=""):
        if result != "clean":
            print("%s: %s: %s" % (category, result, what), file=sys.stderr)
        results.setdefault(category, {"cases": 0, "clean": 0, "crash": 0, "hang": 0, "lost": 0})
        results[category]["cases"] += 1
        results[category][result] += 1

    def tune(db, dims="batch=2,n=300,k=4", extra=()):
        return run(a.kreg, a.plugins, ["tune", "topk", "--dims", dims, "--variants", "sort,heap", "--strategy",
                                       "exhaustive", "--reps", "2", "--db", db] + list(extra))

    # A real binary table.
    table = os.path.join(work, "t.lut")
    p = tune(table)
    assert p is not None and p.returncode == 0, p and p.stderr
    good = open(table, "rb").read()

    # 1. Bit flips and cuts of the binary table: every command refuses it
    # and leaves it as it was.
    for i in range(a.cases):
        damaged = bytearray(good)
        if i % 4 == 3:
            damaged = damaged[: rng.randrange(len(damaged))]
        else:
            bit = rng.randrange(len(damaged) * 8)
            damaged[bit // 8] ^= 1 << (bit % 8)
        path = os.path.join(work, "flipped.lut")
        open(path, "wb").write(damaged)
        cmd = rng.choice([["query", "topk", "--dims", "batch=2,n=300,k=4", "--db", path], ["db", "show", path],
                          ["tune", "topk", "--dims", "batch=2,n=300,k=4", "--reps", "2", "--db", path]])
        p = run(a.kreg, a.plugins, cmd)
        r = outcome(p, ok_allowed=False)
        if r == "clean" and open(path, "rb").read() != bytes(damaged):
            r = "lost"
        count("damaged binary tables", r, "%s -> %s" % (" ".join(cmd), p and p.stderr))

    # 2. Mutated .npy headers (and data cut short).
    base = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 8), }"
    alphabet = "{}()[]',:\"<>fiu248 TrueFalse\\\n\t\x00\x1b\x7f\xe9shapedescrfortran_order0123456789-"
    for i in range(a.cases):
        h = list(base)
        for _ in range(rng.randrange(1, 4)):
            at = rng.randrange(len(h) + 1)
            op = rng.randrange(3)
            if op == 0 and h:
                del h[min(at, len(h) - 1)]
            elif op == 1:
                h.insert(at, rng.choice(alphabet))
            elif h:
                h[min(at, len(h) - 1)] = rng.choice(alphabet)
        data = npy((3, 8), header="".join(h))
        if i % 10 == 9:
            data = data[: rng.randrange(len(data))]
        path = os.path.join(work, "in.npy")
        open(path, "wb").write(data)
        p = run(a.kreg, a.plugins, ["run", "topk/sort", "--input", "input=" + path, "--dims", "k=2"])
        count("mutated .npy files", outcome(p), "%r -> %s" % ("".join(h), p and p.stderr))

    # 3. Malformed flags and contradictions.
    bad = [
        ["run", "topk/sort", "--dims", "batch=-1,n=10,k=1"],
        ["run", "topk/sort", "--dims", "batch=1,n=10,k=11"],
        ["run", "topk/sort", "--dims", "batch=1,n=99999999999,k=1"],
        ["run", "topk/sort", "--dims", "batch=100000,n=100000000,k=1"],
        ["run", "topk/sort", "--dims", "batch=2,n=10,k=1", "--threads", "100000"],
        ["run", "topk/sort", "--dims", "batch=2,n=10,k=1", "--threads", "-1"],
        ["run", "topk/sort", "--dims", "batch=2,n=10,k=1", "--param", "method=x"],
        ["run", "topk/blockwise", "--dims", "batch=2,n=100,k=4", "--param", "m_schedule=,"],
        ["run", "topk/blockwise", "--dims", "batch=2,n=100,k=4", "--param", "num_blocks=8", "--param",
         "num_blocks=16"],
        ["run", "topk/sort", "--dims", "batch=2,n=10,k=1", "--dtype", "f64"],
        ["run", "gmm/reference", "--dims", "m=8,k=4,n=6,groups=-2"],
        ["run", "allreduce/ring", "--dims", "count=10"],
        ["run", "allreduce/ring", "--ranks", "0", "--dims", "count=10"],
        ["run", "sharded_matmul/plain", "--mesh", "2x", "--dims", "m=8,k=8,n=8"],
        ["tune", "topk", "--dims", "batch=2,n=10,k=1", "--budget", "-1", "--db", os.path.join(work, "b.lut")],
        ["tune", "topk", "--dims", "batch=2,n=10,k=1", "--db", work],
        ["query", "topk", "--dims", "batch=2,n=10,k=1", "--db", os.path.join(work, "missing.lut")],
        ["run", "topk/nonexistent", "--dims", "batch=2,n=10,k=1"],
        ["frobnicate"],
        ["run", "topk/sort", "--dims", "batch=2,n=10,k=1", "--input", "input=/dev/null"],
    ]
    for args in bad:
        p = run(a.kreg, a.plugins, args)
        count("malformed flags", outcome(p, ok_allowed=False), "%s -> %s" % (" ".join(args), p and p.stderr))

    # 4. A sweep killed at a random moment, then resumed: the table always
    # loads, and the resumed sweep completes every problem.
    for i in range(max(4, a.cases // 20)):
        db = os.path.join(work, "killed%d.lut" % i)
        proc = subprocess.Popen([a.kreg, "--plugin-path", a.plugins, "tune", "topk", "--dims", "batch=4,n=20000,k=8",
                                 "--variants", "sort,heap,radix", "--strategy", "exhaustive", "--reps", "3", "--db",
                                 db], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.05, 1.5))
        proc.send_signal(rng.choice([signal.SIGKILL, signal.SIGINT, signal.SIGTERM]))
        proc.wait()
        r = "clean"
        if os.path.exists(db):
            s = run(a.kreg, a.plugins, ["db", "show", db])
            r = outcome(s)
        p = run(a.kreg, a.plugins, ["tune", "topk", "--dims", "batch=4,n=20000,k=8", "--variants", "sort,heap,radix",
                                    "--strategy", "exhaustive", "--reps", "3", "--db", db])
        if r == "clean":
            r = outcome(p, ok_allowed=True)
        if r == "clean" and (p.returncode != 0 or b"topk/" not in p.stdout):
            r = "lost"
        count("sweeps killed and resumed", r)

    # 5. Concurrent tuners on one table: every problem ends up in it.
    db = os.path.join(work, "shared.lut")
    procs = []
    for i in range(8):
        procs.append(subprocess.Popen([a.kreg, "--plugin-path", a.plugins, "tune", "topk", "--dims",
                                       "batch=2,n=%d,k=4" % (300 + i), "--variants", "sort", "--strategy",
                                       "exhaustive", "--reps", "2", "--db", db], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE))
    for i, proc in enumerate(procs):
        try:
            _, err = proc.communicate(timeout=LIMIT * 2)
            r = "clean" if proc.returncode == 0 else "crash"
        except subprocess.TimeoutExpired:
            proc.kill()
            r = "hang"
        count("concurrent tuners on one table", r)
    shown = run(a.kreg, a.plugins, ["db", "show", db])
    for i in range(8):
        if shown is None or ("n=%d," % (300 + i)).encode() not in shown.stdout:
            results["concurrent tuners on one table"]["lost"] += 1
            results["concurrent tuners on one table"]["clean"] -= 1

    shutil.rmtree(work, ignore_errors=True)
    print("| category | cases | clean errors (or valid runs) | crashes | hangs | data lost |")
    print("|---|---:|---:|---:|---:|---:|")
    bad_total = 0
    for category, r in results.items():
        print("| %s | %d | %d | %d | %d | %d |" % (category, r["cases"], r["clean"], r["crash"], r["hang"], r["lost"]))
        bad_total += r["crash"] + r["hang"] + r["lost"]
    return 1 if bad_total else 0


if __name__ == "__main__":
    raise SystemExit(main())
