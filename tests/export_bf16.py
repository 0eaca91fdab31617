#!/usr/bin/python3
"""bf16 export against PyTorch: `loom ckpt export --dtype bf16` writes, for
llm.c's format (version 5) and for safetensors ("BF16"), exactly the bits
PyTorch's own fp32 -> bfloat16 conversion (round to nearest even) gives for
the fp32 export of the same model, with the same header and layout.
Exits 77 (skipped) where Debian's python3-torch is not installed.
Usage: tests/export_bf16.py LOOM WORKDIR"""
import json
import os
import shutil
import struct
import subprocess
import sys

try:
    import torch
except ImportError:
    # In CI (scripts/test.sh sets LOOM_REQUIRE_REFERENCES=1) the reference is required: its absence fails.
    required = os.environ.get("LOOM_REQUIRE_REFERENCES") == "1"
    print("%s: no torch (Debian's python3-torch) for the reference conversion%s"
          % (("FAIL", " (required: LOOM_REQUIRE_REFERENCES=1)") if required else ("SKIP", "")))
    sys.exit(1 if required else 77)

loom, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
MODEL = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "300", "--seq", "32", "--seed", "5"]


def export(fmt, dtype, out):
    path = os.path.join(work, out)
    subprocess.run([loom, "ckpt", "export", "--format", fmt, "--dtype", dtype, "-o", path] + MODEL, check=True,
                   stdout=subprocess.DEVNULL)
    with open(path, "rb") as f:
        return f.read()


def as_bf16_bits(fp32_bytes):
    t = torch.frombuffer(bytearray(fp32_bytes), dtype=torch.float32)
    return t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()


failures = 0

# llm.c: a 256-int header (version 3 for fp32, 5 for bf16), then the values.
a, b = export("llmc", "fp32", "a.bin"), export("llmc", "bf16", "b.bin")
ha, hb = struct.unpack("<256i", a[:1024]), struct.unpack("<256i", b[:1024])
if (ha[1], hb[1]) != (3, 5) or ha[:1] + ha[2:] != hb[:1] + hb[2:]:
    print("FAIL: llm.c headers: fp32 version %d, bf16 version %d, other fields equal: %s" % (ha[1], hb[1], ha[2:] == hb[2:]))
    failures += 1
want = as_bf16_bits(a[1024:])
if len(a) - 1024 == 0 or b[1024:] != want:
    print("FAIL: llm.c bf16 values differ from torch's conversion (%d vs %d bytes)" % (len(b) - 1024, len(want)))
    failures += 1


# Values random weights almost never hold: exact ties (to even, both ways),
# signs, the largest float (past bf16's largest: inf), inf, subnormals. They
# go in through an fp32 llm.c file and --init-from.
special = [0x3F808000, 0x3F818000, 0xBF808000, 0xBF818000, 0x3F808001, 0x3F807FFF, 0x7F7FFFFF, 0x7F800000,
           0xFF800000, 0x00000001, 0x00018000, 0x80000000, 0x477FE000, 0x477FF000]
tricky = bytearray(a)
tricky[1024:1024 + 4 * len(special)] = struct.pack("<%dI" % len(special), *special)
src = os.path.join(work, "tricky.bin")
with open(src, "wb") as f:
    f.write(tricky)
out = os.path.join(work, "tricky16.bin")
subprocess.run([loom, "ckpt", "export", "--init-from", src, "--format", "llmc", "--dtype", "bf16", "-o", out], check=True,
               stdout=subprocess.DEVNULL)
with open(out, "rb") as f:
    got = f.read()[1024:]
if got != as_bf16_bits(bytes(tricky[1024:])):
    print("FAIL: ties, inf and subnormals differ from torch's conversion: %s vs %s" %
          (got[:2 * len(special)].hex(), as_bf16_bits(bytes(tricky[1024:1024 + 4 * len(special)])).hex()))
    failures += 1


# safetensors: an 8-byte header length, the JSON header, then the data.
def tensors(data):
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return header, data[8 + n:]


sa, sb = export("safetensors", "fp32", "a.safetensors"), export("safetensors", "bf16", "b.safetensors")
(ta, da), (tb, db) = tensors(sa), tensors(sb)
checked = 0
for name, info in ta.items():
    other = tb.get(name)
    lo, hi = info["data_offsets"]
    if info["dtype"] != "F32" or not other or other["dtype"] != "BF16" or other["shape"] != info["shape"]:
        print("FAIL: safetensors %s: %s vs %s" % (name, info, other))
        failures += 1
        continue
    blo, bhi = other["data_offsets"]
    if db[blo:bhi] != as_bf16_bits(da[lo:hi]):
        print("FAIL: safetensors %s: bf16 values differ from torch's conversion" % name)
        failures += 1
    checked += 1
if checked == 0 or checked != len(tb):
    print("FAIL: compared %d safetensors tensors of %d" % (checked, len(tb)))
    failures += 1
print("%s: llm.c and %d safetensors tensors in bf16 match PyTorch's conversion" % ("FAIL" if failures else "ok", checked))
shutil.rmtree(work)
sys.exit(1 if failures else 0)
