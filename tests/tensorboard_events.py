#!/usr/bin/python3
"""`loom train --tensorboard-dir` against a reader written here from the
formats alone: TFRecord framing (a little-endian u64 length, its masked
CRC-32C, the data, the data's masked CRC-32C; every CRC checked, CRC-32C
computed bit by bit here) around Event protobufs decoded field by field from
TensorFlow's numbering. The file starts with "brain.Event:2"; every step's
"lm loss" is the metrics file's loss (as a float32) and every tag Megatron-LM
logs is there; a resumed run writes a new file that starts with a
SessionLog START at its first step; a file with one byte changed is refused
by the reader, so the check can fail.
Usage: tests/tensorboard_events.py MPIEXEC LOOM WORKDIR"""
import glob
import json
import os
import shutil
import struct
import subprocess
import sys

mpiexec, loom, work = sys.argv[1], sys.argv[2], sys.argv[3]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
failures = 0


def check(ok, what):
    global failures
    failures += not ok
    print(f"{'ok' if ok else 'FAIL'}: {what}")


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, at):
    value, shift = 0, 0
    while True:
        b = buf[at]
        at += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, at


def fields(buf):
    """(field number, wire type, value) of a protobuf message, in order."""
    at, out = 0, []
    while at < len(buf):
        key, at = varint(buf, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = varint(buf, at)
        elif wire == 1:
            value, at = buf[at:at + 8], at + 8
        elif wire == 2:
            n, at = varint(buf, at)
            value, at = buf[at:at + n], at + n
        elif wire == 5:
            value, at = buf[at:at + 4], at + 4
        else:
            raise ValueError(f"wire type {wire}")
        out.append((number, wire, value))
    return out


def records(path):
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at < len(data):
        head = data[at:at + 8]
        (n,) = struct.unpack("<Q", head)
        if struct.unpack("<I", data[at + 8:at + 12])[0] != masked(head):
            raise ValueError(f"record at byte {at}: the length's CRC is wrong")
        body = data[at + 12:at + 12 + n]
        if len(body) != n or struct.unpack("<I", data[at + 12 + n:at + 16 + n])[0] != masked(body):
            raise ValueError(f"record at byte {at}: the data's CRC is wrong")
        at += 16 + n
        yield body


def events(path):
    """Each event as a dict: step, version, scalars {tag: value}, session status."""
    out = []
    for body in records(path):
        e = {"scalars": {}}
        for number, wire, value in fields(body):
            if number == 1 and wire == 1:
                e["wall_time"] = struct.unpack("<d", value)[0]
            elif number == 2 and wire == 0:
                e["step"] = value
            elif number == 3 and wire == 2:
                e["version"] = value.decode()
            elif number == 5 and wire == 2:
                for n2, w2, v in fields(value):
                    if n2 == 1 and w2 == 2:
                        parts = {k: x for k, _, x in fields(v)}
                        e["scalars"][parts[1].decode()] = struct.unpack("<f", parts[2])[0]
            elif number == 6 and wire == 2:
                e["session"] = dict((k, x) for k, _, x in fields(value)).get(1, 0)
        out.append(e)
    return out


def train(*args, ranks=1):
    cmd = [loom, "train"] + list(args)
    if ranks > 1:
        cmd = [mpiexec, "--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS", "-np", str(ranks)] + cmd
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def losses(metrics):
    with open(metrics) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if "step" in r}


tb, ckpt, metrics = os.path.join(work, "tb"), os.path.join(work, "ckpt"), os.path.join(work, "m.jsonl")
train("--steps", "4", "--eval-every", "2", "--tensorboard-dir", tb, "--metrics", metrics, "--pp", "2", ranks=2)
files = sorted(glob.glob(os.path.join(tb, "events.out.tfevents.*")))
check(len(files) == 1, f"one event file after the first run ({len(files)})")
first = events(files[0])
check(first[0].get("version") == "brain.Event:2", "the file starts with brain.Event:2")
by_step = {}
for e in first:
    for tag, value in e["scalars"].items():
        by_step.setdefault(e.get("step"), {})[tag] = value
want = losses(metrics)
check(len(want) == 4 and all(abs(by_step[s]["lm loss"] - struct.unpack("<f", struct.pack("<f", want[s]))[0]) == 0 for s in want),
      f"lm loss at steps {sorted(want)} equals the metrics file's")
megatron = {"lm loss", "learning-rate", "grad-norm", "batch-size", "iteration-time", "throughput", "mem-max-allocated-bytes"}
check(all(megatron <= set(by_step[s]) for s in want), "every step has Megatron-LM's tags")
check({"lm loss validation", "lm loss validation ppl"} <= set(by_step[2]) and "lm loss validation" not in by_step[1],
      "evaluations at steps 2 and 4 only")
# Two steps, then resumed from step 2: a second file, beginning with a START at step 3, then
# steps 3 and 4 with the uninterrupted run's losses.
tb2 = os.path.join(work, "tb2")
for more in (["--steps", "2"], ["--steps", "4", "--resume"]):
    train("--eval-every", "0", "--tensorboard-dir", tb2, "--ckpt", ckpt, "--pp", "2", *more, ranks=2)
files = sorted(glob.glob(os.path.join(tb2, "events.out.tfevents.*")), key=os.path.getmtime)
check(len(files) == 2, f"a second event file after the resume ({len(files)})")
second = events(files[-1])
check(len(second) > 1 and second[1].get("session") == 1 and second[1].get("step") == 3,
      "the resumed file starts with SessionLog START at step 3")
resumed = {e["step"]: e["scalars"]["lm loss"] for e in second if "lm loss" in e["scalars"]}
check(sorted(resumed) == [3, 4] and all(resumed[s] == by_step[s]["lm loss"] for s in resumed),
      f"the resumed file holds steps 3 and 4 with the uninterrupted run's losses ({resumed})")
# The reader can fail: one byte changed in a copy.
broken = os.path.join(work, "broken")
with open(files[0], "rb") as f:
    data = bytearray(f.read())
data[len(data) // 2] ^= 0x40
with open(broken, "wb") as f:
    f.write(data)
try:
    events(broken)
    check(False, "a changed byte is found")
except ValueError as e:
    check("CRC is wrong" in str(e), f"a changed byte is found: {e}")
shutil.rmtree(work)
sys.exit(1 if failures else 0)
