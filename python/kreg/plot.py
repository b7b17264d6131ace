"""Pictures of a kreg tuning table, drawn with matplotlib.

    python3 -m kreg.plot TABLE --out DIR [--key SUBSTRING]
    kreg db plot TABLE --out DIR [--key SUBSTRING]       (the same)

TABLE is a kreg table (.txtpb, .lut, binary), or one exported with `kreg db
export TABLE --json`. Writes into DIR, for each problem key with at least two successful
measurements, KEY.png (every candidate's median time, coloured by variant;
the best starred; failures listed) and, for each variant with two numeric
parameters of several values, KEY_VARIANT_P1xP2.png (a heat map of the best
median over those two); and for each op and dtype, winners_OP_DTYPE.png (the
winning variant for each shape, on the two dims that vary most).
"""

import argparse
import json
import math
import re
import sys
from pathlib import Path

# What errors begin with: "kreg plot", or the command that ran this one
# (`kreg db plot` passes --prog), so its errors read as its own.
_PROG = sys.argv[sys.argv.index("--prog") + 1] if "--prog" in sys.argv[:-1] else "kreg plot"

try:
    import matplotlib
except ImportError:
    if __name__ == "__main__":
        sys.exit(f"{_PROG}: needs matplotlib (Debian: apt-get install python3-matplotlib; or pip install matplotlib)")
    raise

matplotlib.use("Agg")
import numpy as np  # noqa: E402  (after choosing the backend)
from matplotlib.colors import LogNorm  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402  (no pyplot: nothing left open on an error)
from matplotlib.patches import Patch, Rectangle  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullLocator  # noqa: E402
from matplotlib.transforms import offset_copy  # noqa: E402

MAX_BARS = 40      # the fastest candidates drawn as labelled bars; the rest only as dots
MAX_FAILURES = 10  # failed candidates listed by name; the rest counted
UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "µs"), (1.0, "ns"))
PLAIN = FuncFormatter(lambda v, _: f"{v:.4g}")  # 400 rather than 4x10^2 on log axes


def _plain_log(axis, lo, hi):
    """Plain numbers on a log axis; minor ticks labelled (all, or 2 and 5) when it spans few decades."""
    shown = range(1, 10) if hi / lo < 10 else (2, 5) if hi / lo < 1e3 else ()
    axis.set_major_formatter(PLAIN)
    axis.set_minor_formatter(FuncFormatter(
        lambda v, _: f"{v:.4g}" if round(v / 10 ** math.floor(math.log10(v))) in shown else ""))


class Problem(Exception):
    """An error reported as one line `kreg plot: ...` (or --prog's)."""


# ---------------------------------------------------------------- reading


def _param_value(p):
    """A config param's value: an int, a tuple of ints (a list) or a string."""
    if "list_value" in p:
        return tuple(int(v) for v in p["list_value"].get("values", []))
    if "choice" in p:
        return p["choice"]
    return int(p.get("int_value", 0))  # proto3 JSON may leave out a zero


def _measurements(entry):
    """(ok, failed): dicts with variant, params, threads, ns, partial, status, error.

    ok holds the entry's OK trials and, for candidates measured only in a halving
    sweep's early rounds, their partial measurement (fewer repetitions)."""
    ok, failed, seen = [], [], set()
    for partial, trials in ((False, entry.get("trials", [])), (True, entry.get("partial", []))):
        for t in trials:
            params = {p.get("name", "?"): _param_value(p) for p in t.get("config", {}).get("params", [])}
            m = dict(variant=t.get("variant", "?"), params=params, threads=int(t.get("threads", 0)),
                     ns=float(t.get("median_ns", 0)), partial=partial,
                     status=t.get("status", "UNSPECIFIED"), error=t.get("error", ""),
                     signal=int(t.get("signal", 0)))
            ident = (m["variant"], repr(sorted(params.items())), m["threads"])
            if ident in seen:
                continue
            seen.add(ident)
            if m["status"] == "OK" and m["ns"] > 0:
                ok.append(m)
            elif not partial:
                failed.append(m)
    ok.sort(key=lambda m: m["ns"])
    return ok, failed


def _dims(key):
    return [(d.get("name", "?"), int(d.get("value", 0))) for d in key.get("dims", [])]


def _extras(key):
    """The key's fields beyond op, dtype, dims and machine: the data class, and any other as NAME=V."""
    return [f"{v}" if k == "data_class" else f"{k}={v}" for k, v in key.items()
            if k not in ("op", "dtype", "dims", "machine_id") and v]


def _dtype(key):
    parts = [p for p in key.get("dtype", "").split(",") if p]
    return parts[0] if parts and len(set(parts)) == 1 else ",".join(parts) or "any"


def key_label(key):
    """`gmm bf16 m=512 k=256 n=256 [skewed]`, as matched by --key."""
    dims = " ".join(f"{n}={v}" for n, v in _dims(key))
    extra = "".join(f" [{e}]" for e in _extras(key))
    return f"{key.get('op', '?')} {_dtype(key)} {dims}{extra}"


def _safe(text):
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-") or "x"


def _key_stem(key):
    parts = [key.get("op", "op"), _dtype(key)] + [f"{n}{v}" for n, v in _dims(key)] + _extras(key)
    return "_".join(_safe(p) for p in parts)


def _config_label(m):
    def show(v):
        return "[" + ",".join(map(str, v)) + "]" if isinstance(v, tuple) else str(v)
    text = " ".join([m["variant"]] + [f"{n}={show(v)}" for n, v in m["params"].items()])
    return text + (f" on {m['threads']} thr" if m["threads"] else "")


def _machine_label(machines, mid):
    m = machines.get(mid, {})
    cores = f", {m['cores']} cores" if m.get("cores") else ""
    return f"{m.get('cpu_model', 'unknown machine')}{cores} ({mid[:8] or 'no id'})"


def _unit(ns):
    return next((s, u) for s, u in UNITS if ns >= s)


def _fmt(ns, unit):
    v = ns / unit[0]
    return f"{v:.3g} {unit[1]}" if v < 1000 else f"{v:.0f} {unit[1]}"


def _colours(variants):
    cmap = matplotlib.colormaps["tab10" if len(variants) <= 10 else "tab20"]
    return {v: cmap(i % cmap.N) for i, v in enumerate(sorted(variants))}


# ---------------------------------------------------------------- per key


def _plot_key(entry, machines, colours, out, stem):
    """STEM.png, plus a heat map per variant with a 2-D numeric grid; returns the paths."""
    key = entry["key"]
    ok, failed = _measurements(entry)
    if len(ok) < 2:
        return []
    full = [m for m in ok if not m["partial"]] or ok
    bars, unit = full[:MAX_BARS], _unit(ok[0]["ns"])
    shown_fail = failed[:MAX_FAILURES]
    with_strip = len(ok) > len(bars)
    variants = sorted({m["variant"] for m in ok})
    rows = len(bars) + len(shown_fail) + (len(failed) > len(shown_fail))
    strip_h = 0.5 + 0.35 * len(variants) if with_strip else 0
    fig = Figure(figsize=(11, 1.6 + strip_h + 0.24 * rows), layout="constrained")
    axes = fig.subplots(2 if with_strip else 1, 1, squeeze=False,
                        gridspec_kw=dict(height_ratios=[strip_h, 0.24 * rows + 0.6] if with_strip else [1]))
    ax = axes[-1][0]
    times = np.array([m["ns"] for m in bars]) / unit[0]
    log = times.max() / times.min() > 10
    lo = times.min() / 1.5 if log else 0
    y = np.arange(len(bars))
    ax.barh(y, times - lo, left=lo, color=[colours[m["variant"]] for m in bars], height=0.75,
            edgecolor=["black" if i == 0 else "none" for i in y], linewidth=1.2)
    for i, m in enumerate(bars):
        note = "  best" if i == 0 else f"  ×{m['ns'] / bars[0]['ns']:.2f}"
        ax.text(times[i], i, f" {_fmt(m['ns'], unit)}{note}", va="center", fontsize=7)
    labels = [("★ " if i == 0 else "") + _config_label(m) + (" (early round)" if m["partial"] else "")
              for i, m in enumerate(bars)]
    for j, m in enumerate(shown_fail):  # failures: a red row each, the reason in the plot area
        why = m["status"] + (f" signal {m['signal']}" if m["signal"] else "") + (f": {m['error']}" if m["error"] else "")
        ax.text(0.01, len(bars) + j, "✗ " + why[:90], va="center", fontsize=7, color="firebrick",
                transform=ax.get_yaxis_transform())
        labels.append(_config_label(m))
    if len(failed) > len(shown_fail):
        labels.append(f"... {len(failed) - len(shown_fail)} more failed")
    ax.set_yticks(np.arange(len(labels)), labels, fontsize=7)
    for tick, lab in zip(ax.get_yticklabels(), labels):
        tick.set_color("black" if tick.get_position()[1] < len(bars) else "firebrick")
        tick.set_fontweight("bold" if lab.startswith("★") else "normal")
    ax.set_ylim(len(labels) - 0.5, -0.5)
    if log:
        ax.set_xscale("log")
        _plain_log(ax.xaxis, times.min(), times.max())
    ax.set_xlim(lo or 0, times.max() * (3 if log else 1.25))
    shown = f"{len(bars)} fastest of {len(full)} shown" if len(full) > len(bars) else f"{len(bars)} candidates"
    ax.set_xlabel(f"median time ({unit[1]}{', log scale' if log else ''}); {shown}"
                  + (f", {len(failed)} failed" if failed else ""), fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    if with_strip:  # every OK measurement as a dot per variant, early-round ones hollow
        sx = axes[0][0]
        rng = np.random.default_rng(0)
        for m in ok:
            row = variants.index(m["variant"]) + rng.uniform(-0.25, 0.25)
            c = colours[m["variant"]]
            sx.plot(m["ns"] / unit[0], row, "o", ms=4, alpha=0.6 if m["partial"] else 0.9,
                    mfc="none" if m["partial"] else c, mec=c)
        sx.plot(full[0]["ns"] / unit[0], variants.index(full[0]["variant"]), "*", ms=13, color="gold", mec="black")
        sx.set_xscale("log")
        _plain_log(sx.xaxis, ok[0]["ns"], ok[-1]["ns"])
        sx.tick_params(axis="x", which="both", labelsize=7)
        sx.set_yticks(range(len(variants)), variants, fontsize=8)
        sx.set_ylim(len(variants) - 0.5, -0.5)
        early = sum(m["partial"] for m in ok)
        sx.set_title(f"all {len(ok)} successful candidates, median ({unit[1]}, log scale)"
                     + (f"; hollow: {early} only from early halving rounds (fewer reps)" if early else ""),
                     fontsize=8)
        sx.grid(axis="x", alpha=0.3)
    title = f"{key_label(key)}\n{_machine_label(machines, key.get('machine_id', ''))}"
    title += f" — {entry.get('strategy', '?')} sweep" + (", incomplete" if entry.get("incomplete") else "")
    fig.suptitle(title, fontsize=10)
    ax.legend(handles=[Patch(color=colours[v], label=v) for v in variants], loc="upper left", fontsize=8,
              title="variant", title_fontsize=8, bbox_to_anchor=(1.01, 1.0))
    path = out / f"{stem}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    written = [str(path)]
    for v in variants:
        written += _plot_grid(key, v, [m for m in ok if m["variant"] == v],
                              [m for m in failed if m["variant"] == v], out / stem)
    return written


def _plot_grid(key, variant, ok, failed, stem):
    """Heat map of the best median over the variant's two numeric params of most values."""
    names = [n for n in ok[0]["params"] if all(isinstance(m["params"].get(n), int) for m in ok + failed)]
    distinct = {n: sorted({m["params"][n] for m in ok + failed}) for n in names}
    pair = sorted((n for n in names if len(distinct[n]) >= 2), key=lambda n: -len(distinct[n]))[:2]
    if len(pair) < 2:
        return []
    (px, py), unit = pair, _unit(ok[0]["ns"])
    xs, ys = distinct[px], distinct[py]
    grid = np.full((len(ys), len(xs)), np.nan)
    for m in ok:
        i, j = ys.index(m["params"][py]), xs.index(m["params"][px])
        grid[i, j] = np.fmin(grid[i, j], m["ns"] / unit[0])
    fig = Figure(figsize=(2.5 + 0.9 * len(xs), 1.6 + 0.55 * len(ys)))
    ax = fig.subplots()
    image = ax.imshow(np.ma.masked_invalid(grid), cmap="RdYlGn_r", aspect="auto",
                      norm=LogNorm(np.nanmin(grid), max(np.nanmax(grid), np.nanmin(grid) * 1.01)))
    best = np.unravel_index(np.nanargmin(grid), grid.shape)
    bad = {}  # failed candidates per cell
    for m in failed:
        cell = (m["params"].get(py), m["params"].get(px))
        bad[cell] = bad.get(cell, 0) + 1
    for (i, j), v in np.ndenumerate(grid):
        fails = bad.get((ys[i], xs[j]), 0)
        text = (f"{v:.3g}" if not math.isnan(v) else "—") + (f"\n✗{fails} failed" if fails else "")
        ax.text(j, i, text, ha="center", va="center", fontsize=8,
                fontweight="bold" if (i, j) == best else "normal")
    ax.add_patch(Rectangle((best[1] - 0.5, best[0] - 0.5), 1, 1, fill=False, lw=2.5, ec="black"))
    ax.set_xticks(range(len(xs)), xs)
    ax.set_yticks(range(len(ys)), ys)
    ax.set_xlabel(px)
    ax.set_ylabel(py)
    others = [n for n in ok[0]["params"] if n not in pair] + (["threads"] if any(m["threads"] for m in ok) else [])
    early = " (early-round measurements included)" if any(m["partial"] for m in ok) else ""
    ax.set_title(f"{key_label(key)}\n{variant}: best median ({unit[1]})"
                 + (f" over {', '.join(others)}" if others else "") + early, fontsize=8)
    bar = fig.colorbar(image, ax=ax, label=f"median ({unit[1]})")
    bar.ax.yaxis.set_major_formatter(PLAIN)
    bar.ax.yaxis.set_minor_formatter(PLAIN)
    path = stem.with_name(f"{stem.name}_{_safe(variant)}_{_safe(px)}x{_safe(py)}.png")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return [str(path)]


# ---------------------------------------------------------------- across keys


def _set_dim_axis(ax, which, values, pad):
    """Log2 scale with ticks at the values when they span powers of two, else linear.

    pad: the room left beyond the values on each side, as a share of their span."""
    values = sorted(set(values))
    lo, hi = values[0], values[-1]
    if lo > 0 and hi / lo >= 4:
        getattr(ax, f"set_{which}scale")("log", base=2)
        span = math.log2(hi / lo)
        ticks = [lo]
        for v in values[1:]:  # drop ticks too close to the previous one to be read
            if math.log2(v / ticks[-1]) > 0.07 * span:
                ticks.append(v)
        getattr(ax, f"set_{which}ticks")(ticks, [str(t) for t in ticks], fontsize=8,
                                         rotation=45 if which == "x" and len(ticks) > 6 else 0)
        getattr(ax, f"{which}axis").set_minor_locator(NullLocator())
        getattr(ax, f"set_{which}lim")(lo / 2 ** (pad[0] * span + 0.3), hi * 2 ** (pad[1] * span + 0.3))
    else:
        step = (hi - lo) or max(abs(hi), 1)
        if len(values) <= 12:
            getattr(ax, f"set_{which}ticks")(values, [str(v) for v in values], fontsize=8)
        getattr(ax, f"set_{which}lim")(lo - pad[0] * step - 0.5, hi + pad[1] * step + 0.5)


def _place_labels(ax, marks):
    """Draw each mark (x, y, dy, colour, marker, text), moving its label off the others'."""
    fig, taken = ax.figure, []
    px = fig.dpi / 72
    for x, y, dy, *_ in marks:  # the markers themselves, 10 points wide
        cx, cy = ax.transData.transform((x, y))
        taken.append((cx - 6 * px, cy + (dy - 6) * px, cx + 6 * px, cy + (dy + 6) * px))
    for x, y, dy, colour, marker, text in marks:
        ax.plot(x, y, marker, ms=10, mec="black", color=colour,
                transform=offset_copy(ax.transData, fig=fig, y=dy, units="points"))
        cx, cy = ax.transData.transform((x, y))
        width = len(text) * 7 * 0.6 * px  # a 7-point label's width, roughly
        for shift, side in [(s, d) for s in (0, 9, -9, 18, -18, 27, -27) for d in (1, -1)] + [(0, 1)]:
            left = cx + 8 * px if side > 0 else cx - 8 * px - width
            box = (left, cy + (dy + shift - 5) * px, left + width, cy + (dy + shift + 5) * px)
            if not any(b[0] < box[2] and box[0] < b[2] and b[1] < box[3] and box[1] < b[3] for b in taken):
                break  # free; if none is, the last (plain right) stays
        taken.append(box)
        ax.annotate(text, (x, y), xytext=(8 * side, dy + shift), textcoords="offset points", va="center",
                    ha="left" if side > 0 else "right", fontsize=7)


def _plot_winners(op, dtype, entries, machines, colours, out):
    keys = [dict(_dims(e["key"])) for e in entries]
    names = list(dict.fromkeys(n for k in keys for n in k))
    distinct = {n: {k.get(n) for k in keys} for n in names}
    varying = []
    for n in sorted((n for n in names if len(distinct[n]) > 1), key=lambda n: -len(distinct[n])):
        if not any(all(k.get(n) == k.get(o) for k in keys) for o in varying):  # local_groups == groups
            varying.append(n)
    axis_dims = varying[:2] or names[:1] or ["(none)"]
    two_d = len(axis_dims) == 2
    facet_of = [(e["key"].get("machine_id", ""), tuple(_extras(e["key"]))) for e in entries]
    facets = list(dict.fromkeys(facet_of))
    ncols = min(3, len(facets))
    nrows = math.ceil(len(facets) / ncols)
    fig = Figure(figsize=(6 * ncols, (4.5 if two_d else 1.8) * nrows + 0.6))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for f in range(len(facets), nrows * ncols):
        axes[f // ncols][f % ncols].set_visible(False)
    fig.suptitle(f"winning variant by shape: {op} {dtype}"
                 + (f" (labels: median time, {', '.join(varying[2:])})" if varying[2:] else " (labels: median time)"),
                 fontsize=10)
    for f, facet in enumerate(facets):  # axes first, so the layout is known before the labels are placed
        ax = axes[f // ncols][f % ncols]
        group = [k for k, fa in zip(keys, facet_of) if fa == facet]
        _set_dim_axis(ax, "x", [k.get(axis_dims[0], 0) for k in group], (0.08, 0.3))
        ax.set_xlabel(axis_dims[0])
        if two_d:
            _set_dim_axis(ax, "y", [k.get(axis_dims[1], 0) for k in group], (0.1, 0.1))
            ax.set_ylabel(axis_dims[1])
        else:
            ax.set_ylim(-1, 1)
            ax.set_yticks([])
        ax.grid(alpha=0.3)
        ax.set_title(_machine_label(machines, facet[0]) + "".join(f" [{c}]" for c in facet[1]), fontsize=8)
    fig.tight_layout()
    seen = set()
    for f, facet in enumerate(facets):
        spots = {}
        for e, k, fa in zip(entries, keys, facet_of):
            if fa == facet:
                spot = (k.get(axis_dims[0], 0), k.get(axis_dims[1], 0) if two_d else 0)
                spots.setdefault(spot, []).append((e, k))
        marks = []
        for (x, y), here in spots.items():
            for i, (e, k) in enumerate(here):  # keys at one spot (differing in other dims) stacked
                best = e.get("best") if e.get("best", {}).get("status") == "OK" else None
                variant = best.get("variant", "?") if best else "no OK trial"
                seen.add(variant)
                ns = float(best.get("median_ns", 0)) if best else 0
                text = " ".join(([_fmt(ns, _unit(ns))] if ns else [])
                                + [f"{n}={k[n]}" for n in varying[2:] if n in k])
                marks.append((x, y, (i - (len(here) - 1) / 2) * 14, colours.get(variant, "lightgrey"),
                              "o" if best else "X", text))
        _place_labels(axes[f // ncols][f % ncols], marks)
    handles = [Patch(color=colours.get(v, "lightgrey"), label=v) for v in sorted(seen)]
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 0.95), fontsize=8, title="winner")
    path = out / f"winners_{_safe(op)}_{_safe(dtype)}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return [str(path)]


def plot_table(table, out_dir, key_filter=None):
    """Draw the pictures of a parsed `kreg db export --json` table into out_dir.

    key_filter keeps the keys whose label (see key_label) contains it.
    Returns the paths of the PNGs written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    machines = {m.get("id", ""): m for m in table.get("machines", [])}
    entries = [e for e in table.get("entries", []) if "key" in e
               and (key_filter is None or key_filter in key_label(e["key"]))]
    colours = _colours({t.get("variant", "?") for e in entries
                        for t in e.get("trials", []) + e.get("partial", []) + [e.get("best", {})]})
    written, stems = [], set()
    for e in entries:
        stem = _key_stem(e["key"])
        if stem in stems:  # the same problem on another machine
            stem += "_" + _safe(e["key"].get("machine_id", "")[:8])
        while stem in stems:
            stem += "_"
        stems.add(stem)
        written += _plot_key(e, machines, colours, out, stem)
    by_op = {}
    for e in entries:
        by_op.setdefault((e["key"].get("op", "?"), _dtype(e["key"])), []).append(e)
    for (op, dtype), group in by_op.items():
        written += _plot_winners(op, dtype, group, machines, colours, out)
    return written


# ---------------------------------------------------------------- command line


def load_table(path):
    """A table as a dict: a JSON export as it is, any kreg table (text or
    binary) through kreg's own reader."""
    p = Path(path)
    if not p.is_file():
        raise Problem(f"{path}: no such file")
    raw = p.read_bytes()
    if p.suffix.lower() == ".json" or raw.lstrip()[:1] == b"{":
        text = raw.decode("utf-8", errors="replace")
    else:
        from kreg import _kreg
        try:
            text = _kreg.TuningDb(str(p)).to_json()
        except OSError as e:
            raise Problem(str(e))
    try:
        table = json.loads(text)
    except json.JSONDecodeError as e:
        raise Problem(f"{path}: not JSON ({e.msg}, line {e.lineno})")
    if not isinstance(table, dict):
        raise Problem(f"{path}: not a tuning table (a JSON object expected)")
    return table


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Problem(message)


def main(argv=None):
    parser = _Parser(prog="python3 -m kreg.plot", description="Draw PNG pictures of a kreg tuning table.")
    parser.add_argument("table", help="a `kreg db export --json` file, or a kreg table (.txtpb, .lut, binary)")
    parser.add_argument("--out", required=True, help="folder for the PNGs (created)")
    parser.add_argument("--key", help="only keys whose label contains this (e.g. 'n=4096')")
    parser.add_argument("--name", help=argparse.SUPPRESS)  # the table's name in messages (kreg db plot's file)
    parser.add_argument("--prog", default="kreg plot", help=argparse.SUPPRESS)  # what messages begin with
    try:
        args = parser.parse_args(argv)
    except Problem as e:
        print(f"{_PROG}: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    try:
        name = args.name or args.table
        table = load_table(args.table)
        if not table.get("entries"):
            raise Problem(f"{name}: no entries")
        paths = plot_table(table, args.out, args.key)
        if not paths:
            raise Problem(f"no key in {name} matches {args.key!r}")
    except Exception as e:  # every error as one line, never a traceback
        print(f"{args.prog}: " + (" ".join(str(e).split()) or type(e).__name__), file=sys.stderr)
        return 1
    print("\n".join(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
