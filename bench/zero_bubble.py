#!/usr/bin/env python3
"""Pipeline bubbles on this machine: 1F1B, interleaved, ZB-H1 and ZB-V at pp 2.

Calibrates this machine (`loom sim calibrate`, two ranks of one core each),
then for m = 4 and 8 micro-batches and each schedule trains one model with
`loom train --trace` on two ranks (one core each, no oversubscription) and
reads the last step's measured bubble from its trace, beside the schedule's
theory (unit costs: forward 1, backward 2, or B 1 and W 1) and `loom sim`'s
prediction on the calibrated profile. Prints the table the README shows,
and with --keep DIR leaves each trace (and its SVG) there.

  bench/zero_bubble.py build/loom [--steps 4] [--keep DIR]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

MODEL = ["--layers", "8", "--hidden", "256", "--heads", "4", "--vocab", "512", "--seq", "128"]
GLOBAL_BATCH = 32
# (name, layout flags); the model's 8 layers split evenly into 2 or 4 stages.
SCHEDULES = [
    ("1f1b", ["--schedule", "1f1b"]),
    ("interleaved", ["--schedule", "interleaved", "--vpp", "2"]),
    ("zb_h1", ["--schedule", "zb_h1"]),
    ("zb_v", ["--schedule", "zb_v", "--vpp", "2"]),
]


def run(cmd, env):
    got = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if got.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), got.stderr[-2000:]))
    return got.stdout


def trace_bubble(path):
    """The measured bubble and theory a trace's metadata records."""
    with open(path) as f:
        meta = json.load(f)["loom"]
    return meta["bubble_measured"], meta["bubble_theory"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("loom")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--keep", help="a directory to leave the traces and their SVGs in")
    a = ap.parse_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    mpirun = ["mpirun", "-np", "2", "-x", "OMP_NUM_THREADS=1"]
    with tempfile.TemporaryDirectory(prefix="loom_zb_") as tmp:
        profile = os.path.join(tmp, "machine.txtpb")
        run(mpirun + [a.loom, "sim", "calibrate", "-o", profile], env)
        print("| m | schedule | theory | `loom sim` | measured |")
        print("|---|---|---|---|---|")
        for m in (4, 8):
            for name, layout in SCHEDULES:
                flags = MODEL + ["--pp", "2", "--micro-batch", str(GLOBAL_BATCH // m), "--global-batch",
                                 str(GLOBAL_BATCH)] + layout
                pred = json.loads(run([a.loom, "sim", "--json", "--cluster", profile] + flags, env))
                trace = os.path.join(tmp, "pp2_%s_m%d.json" % (name, m))
                run(mpirun + [a.loom, "train", "--steps", str(a.steps), "--eval-every", "0", "--trace", trace] + flags, env)
                measured, theory = trace_bubble(trace)
                print("| %d | %s | %.1f%% | %.1f%% | %.1f%% |" % (m, name, 100 * theory, 100 * pred["bubble"],
                                                                100 * measured), flush=True)
                if a.keep:
                    os.makedirs(a.keep, exist_ok=True)
                    kept = os.path.join(a.keep, os.path.basename(trace))
                    shutil.copy(trace, kept)
                    run([a.loom, "trace", "svg", kept, "-o", kept[:-len(".json")] + ".svg"], env)


if __name__ == "__main__":
    main()
