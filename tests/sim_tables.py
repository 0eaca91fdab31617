#!/usr/bin/env python3
"""`loom sim` against published training runs, one table at a time.

Each table in tests/sim_tables/ is a TSV of published runs with its source and
its settings in `#!` lines:

  #! cluster: NAME        the built-in cluster profile the runs are predicted on
  #! role: fit|validation fit: the profile's constants marked "fitted" were fitted on this table, once
  #! bounds: MEAN ROW     the largest mean absolute error and the largest error of any row (what CI holds):
                          a regression guard, set from an argument the table's header states (its errors
                          when admitted, rounded up), and moved only in a change of its own that says why,
                          never in the change that moves the errors
  #! target: MEAN ROW     where a table is not yet within the bounds the model aims at: those (reported, not held)
  #! flops: FORMULA       loom sim --flops, for tables that publish TFLOP/s and not tokens/s
  #! flags: ...           loom sim flags for every row
  #! tp-flags: ...        loom sim flags for the rows with tp > 1

and a tab-separated row per run: label gpus global_batch micro_batch seq tp pp cp vp ep
tokens_per_s_per_gpu tflops_per_gpu, then the row's own flags (its model).
A row's data-parallel size is gpus / (tp pp cp); vp > 1 runs the interleaved
schedule. A row is judged on its tokens/s per GPU where the table gives them
(the same error as TFLOP/s per GPU under any one FLOPs formula), else on
TFLOP/s per GPU under the table's formula.

  sim_tables.py LOOM TABLE                      check the table against its bounds
  sim_tables.py LOOM TABLE --markdown           its per-row table for docs/sim.md
  sim_tables.py LOOM TABLE --fit PROFILE        the one fit (a fit table only): the max_efficiency and half_dim
                                                PROFILE's gemm entries share, over the whole table (prints them;
                                                writes nothing); --half-dim N keeps half_dim at N
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

COLUMNS = "label gpus global_batch micro_batch seq tp pp cp vp ep tokens_per_gpu tflops_per_gpu".split()


def load(path):
    settings, rows = {"flags": "", "tp-flags": "", "flops": "megatron"}, []
    with open(path) as f:
        for line in f:
            if line.startswith("#!"):
                key, _, value = line[2:].partition(":")
                settings[key.strip()] = value.strip()
            elif line.strip() and not line.startswith("#"):
                vals = line.rstrip("\n").split("\t")
                if len(vals) < len(COLUMNS):
                    sys.exit("%s: a row needs the %d tab-separated columns %s: %s" % (path, len(COLUMNS), " ".join(COLUMNS),
                                                                                    line.strip()))
                r = dict(zip(COLUMNS, vals))
                for k in COLUMNS[1:10]:
                    r[k] = int(r[k])
                for k in ("tokens_per_gpu", "tflops_per_gpu"):
                    r[k] = None if r[k] == "-" else float(r[k])
                r["flags"] = " ".join(vals[len(COLUMNS):]).split()
                if r["gpus"] % (r["tp"] * r["pp"] * r["cp"]):
                    sys.exit("%s: row %s: %d GPUs are not tp x pp x cp x dp" % (path, r["label"], r["gpus"]))
                rows.append(r)
    for key in ("cluster", "role", "bounds"):
        if key not in settings:
            sys.exit("%s: no '#! %s:' line" % (path, key))
    if not rows:
        sys.exit("%s: no rows" % path)
    return settings, rows


def simulate(loom, cluster, settings, r):
    dp = r["gpus"] // (r["tp"] * r["pp"] * r["cp"])
    cmd = [loom, "sim", "--cluster", cluster, "--json", "--flops", settings["flops"]] + r["flags"]
    cmd += ["--seq", str(r["seq"]), "--tp", str(r["tp"]), "--pp", str(r["pp"]), "--cp", str(r["cp"]), "--dp", str(dp),
            "--ep", str(r["ep"]), "--micro-batch", str(r["micro_batch"]), "--global-batch", str(r["global_batch"])]
    if r["vp"] > 1:
        cmd += ["--vpp", str(r["vp"]), "--schedule", "interleaved"]
    cmd += settings["flags"].split() + (settings["tp-flags"].split() if r["tp"] > 1 else [])
    got = subprocess.run(cmd, capture_output=True, text=True)
    if got.returncode != 0:
        sys.exit("loom sim failed on row %s: %s\n  %s" % (r["label"], got.stderr.strip(), " ".join(cmd)))
    d = json.loads(got.stdout)
    if d["gpus"] != r["gpus"]:
        sys.exit("row %s: %d GPUs simulated, the source has %d" % (r["label"], d["gpus"], r["gpus"]))
    return d


def errors(loom, cluster, settings, rows):
    out = []
    for r in rows:
        d = simulate(loom, cluster, settings, r)
        if r["tokens_per_gpu"] is not None:
            got, want = d["tokens_per_s"] / d["gpus"], r["tokens_per_gpu"]
        else:
            got, want = d["tflops_per_gpu"], r["tflops_per_gpu"]
        out.append((r, d, got, want, (got - want) / want))
    return out


def figure(x):
    """A published or predicted figure as a table shows it: whole above 1000, else 4 significant digits."""
    return "%.0f" % x if x >= 1000 else "%.4g" % x


def summary(e):
    return sum(abs(x[4]) for x in e) / len(e), max(abs(x[4]) for x in e)


def fit(loom, settings, rows, profile, halves):
    """The profile's gemm entries share max_efficiency and half_dim (every dtype reaches the same share of its own
    peak): for each half_dim on a grid, the max_efficiency whose mean signed error is zero (by bisection); of the
    pairs whose every row is within the table's row bound, the one of lowest mean absolute error wins (of all
    pairs, when none is)."""
    row_bound = float(settings["bounds"].split()[1])
    text = open(profile).read()
    entry = re.compile(r"gemm \{ dtype: (PRECISION_[A-Z0-9]+) max_efficiency: [0-9.]+ half_dim: [0-9.]+ \}")
    if not entry.search(text):
        sys.exit("%s: no gemm entries to fit" % profile)
    best = None
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fit.txtpb")
        for half in halves:
            lo, hi = 0.2, 1.0
            for _ in range(14):
                eff = (lo + hi) / 2
                open(path, "w").write(entry.sub(lambda m: "gemm { dtype: %s max_efficiency: %.4f half_dim: %g }" %
                                                (m.group(1), eff, half), text))
                e = errors(loom, path, settings, rows)
                if sum(x[4] for x in e) > 0:
                    hi = eff
                else:
                    lo = eff
            mape, worst = summary(e)
            print("half_dim %3d: max_efficiency %.4f, mean error %.2f%%, worst %.2f%%" % (half, eff, 100 * mape, 100 * worst))
            key = (worst > row_bound, mape)
            if best is None or key < best[0]:
                best = (key, half, eff)
    print("best: half_dim %d, max_efficiency %.3f (mean error %.2f%%%s)" % (
        best[1], best[2], 100 * best[0][1], ", a row past the bound" if best[0][0] else ""))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("loom")
    ap.add_argument("table")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--fit", metavar="PROFILE")
    ap.add_argument("--half-dim", type=float, help="with --fit: keep half_dim at this and fit max_efficiency alone")
    a = ap.parse_args()
    settings, rows = load(a.table)
    if a.fit:
        if settings["role"] != "fit":
            sys.exit("%s is a validation table: nothing is fitted to it" % a.table)
        fit(a.loom, settings, rows, a.fit, [a.half_dim] if a.half_dim is not None else [0, 16, 24, 32, 40, 48, 64, 96, 128])
        return
    bound_mean, bound_row = (float(x) for x in settings["bounds"].split())
    e = errors(a.loom, settings["cluster"], settings, rows)
    mape, worst = summary(e)
    name = os.path.basename(a.table)
    if a.markdown:
        print("| run | GPUs | TP | PP | CP | VP | EP | published | predicted | error | bubble | exposed TP | exposed DP | step (s) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r, d, got, want, err in e:
            step = d["step_time_s"]
            print("| %s | %d | %d | %d | %d | %d | %d | %s | %s | %+.1f%% | %.1f%% | %.1f%% | %.1f%% | %.2f |" % (
                r["label"], r["gpus"], r["tp"], r["pp"], r["cp"], r["vp"], r["ep"], figure(want), figure(got), 100 * err,
                100 * d["bubble"], 100 * d["time_s"]["exposed_tp"] / step, 100 * d["time_s"]["exposed_dp"] / step, step))
        print("\n%s (%s, %s): mean absolute error %.2f%%, worst row %.2f%%" % (
            name, settings["role"], "tokens/s per GPU" if rows[0]["tokens_per_gpu"] else "TFLOP/s per GPU", 100 * mape, 100 * worst))
        return
    for r, d, got, want, err in e:
        print("%-24s published %8.1f, predicted %8.1f (%+.1f%%)" % (r["label"], want, got, 100 * err))
    print("%s (%s, %d rows on %s): mean absolute error %.2f%% (bound %g%%), worst row %.2f%% (bound %g%%)" % (
        name, settings["role"], len(e), settings["cluster"], 100 * mape, 100 * bound_mean, 100 * worst, 100 * bound_row))
    if "target" in settings:
        target_mean, target_row = (float(x) for x in settings["target"].split())
        met = mape <= target_mean and worst <= target_row
        print("  target: mean %g%%, every row %g%%: %s" % (100 * target_mean, 100 * target_row, "met" if met else "NOT MET"))
    if mape > bound_mean or worst > bound_row:
        sys.exit(1)


if __name__ == "__main__":
    main()
