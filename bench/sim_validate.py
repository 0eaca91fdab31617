#!/usr/bin/env python3
"""`loom sim` against `loom train` on this machine: calibrate, predict, measure.

Calibrates two profiles (`loom sim calibrate`: two ranks of one core each,
and one rank of two threads with the first's links), then for two model
shapes and eight layouts that fit two cores without oversubscription
predicts the step time with `loom sim` and measures it with `loom train`
(the fastest of the steps after the first: this machine is shared, and other
work only ever slows a step down; calibration too keeps each measurement's
best), and prints the table the README shows.

  bench/sim_validate.py build/loom [--steps 12] [--seconds 0.5]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

SHAPES = {
    "A": ["--layers", "4", "--hidden", "256", "--heads", "4", "--vocab", "512", "--seq", "128"],
    "B": ["--layers", "8", "--hidden", "384", "--heads", "6", "--vocab", "1024", "--seq", "64"],
}
# (name, ranks, layout flags, micro-batch, global batch)
LAYOUTS = [
    ("serial, 2 threads", 1, [], 8, 32),
    ("tp 2", 2, ["--tp", "2"], 8, 32),
    ("pp 2, 1f1b, m 4", 2, ["--pp", "2"], 8, 32),
    ("pp 2, 1f1b, m 8", 2, ["--pp", "2"], 4, 32),
    ("pp 2, interleaved, m 4", 2, ["--pp", "2", "--vpp", "2", "--schedule", "interleaved"], 8, 32),
    ("pp 2, interleaved, m 8", 2, ["--pp", "2", "--vpp", "2", "--schedule", "interleaved"], 4, 32),
    ("dp 2", 2, ["--dp", "2"], 8, 32),
    ("dp 2, ZeRO-1", 2, ["--dp", "2", "--zero", "1"], 8, 32),
]


def mpirun(n):
    if n == 1:
        return []
    return ["mpirun", "-np", str(n), "-x", "OMP_NUM_THREADS=1"]


def run(cmd, env=None):
    got = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if got.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), got.stderr[-2000:]))
    return got.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("loom")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seconds", default="0.5", help="calibration: the least time of each measurement")
    a = ap.parse_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    with tempfile.TemporaryDirectory(prefix="loom_simval_") as tmp:
        two, one = os.path.join(tmp, "two.txtpb"), os.path.join(tmp, "one.txtpb")
        run(mpirun(2) + [a.loom, "sim", "calibrate", "--seconds", a.seconds, "-o", two], env)
        run([a.loom, "sim", "calibrate", "--seconds", a.seconds, "-o", one, "--links-from", two, "--threads", "2"], env)
        print("| shape | layout | predicted (ms) | measured, best step (ms) | error |")
        print("|---|---|---|---|---|")
        errs = []
        for shape, model in SHAPES.items():
            for name, ranks, layout, micro, batch in LAYOUTS:
                flags = model + layout + ["--micro-batch", str(micro), "--global-batch", str(batch)]
                pred = json.loads(run([a.loom, "sim", "--json", "--cluster", one if ranks == 1 else two] + flags, env))
                metrics = os.path.join(tmp, "m.jsonl")
                threads = ["--threads", "2"] if ranks == 1 else []
                run(mpirun(ranks) + [a.loom, "train", "--steps", str(a.steps), "--eval-every", "0", "--metrics", metrics]
                    + threads + flags, env)
                steps = [json.loads(line) for line in open(metrics)]
                os.remove(metrics)  # loom train refuses to overwrite a metrics file
                ms = [r["ms"] for r in steps if "ms" in r][1:]  # the step records (the last line is the goodput)
                measured = min(ms)
                predicted = pred["step_time_s"] * 1e3
                err = (predicted - measured) / measured
                errs.append(abs(err))
                print("| %s | %s | %.0f | %.0f | %+.1f%% |" % (shape, name, predicted, measured, 100 * err), flush=True)
        print("\nmean absolute error %.1f%%, worst %.1f%% over %d rows" % (100 * statistics.mean(errs), 100 * max(errs), len(errs)))


if __name__ == "__main__":
    main()
