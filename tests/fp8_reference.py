"""fp8_math.h's FP8 conversions against an independent decoding of the formats' definitions.

The OCP 8-bit floating point specification (v1.0) defines E4M3 (bias 7, no
infinities, S.1111.111 the NaN) and E5M2 (bias 15, IEEE infinities and NaNs);
the OCP MX specification defines E8M0 (2^(c - 127), 0xff NaN). This script
decodes every code from those definitions with exact rationals, and rounds
to nearest, ties to even code, saturating at the largest finite (CUDA's
__NV_SATFINITE), by searching the sorted finite values: no bit tricks
shared with the C code. It checks every code's decoding, every bf16 value's
encoding (all 65,536), every rounding boundary between neighbouring codes
(the midpoint and the fp32 values either side of it, and the codes'
values), the saturation and underflow edges, random fp32 bit patterns, and
MXFP8's E8M0 block scales.

usage: fp8_reference.py FP8_DUMP
"""
import bisect
import math
import random
import struct
import subprocess
import sys
from fractions import Fraction

FORMATS = {"e4m3": (4, 3, 7), "e5m2": (5, 2, 15)}


def f32(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def bits32(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def decode(code, fmt):
    """The value of a code as a Fraction, or 'nan' / 'inf' / '-inf'."""
    ebits, mbits, bias = FORMATS[fmt]
    sign = -1 if code & 0x80 else 1
    e = (code >> mbits) & ((1 << ebits) - 1)
    m = code & ((1 << mbits) - 1)
    if fmt == "e4m3" and e == 15 and m == 7:
        return "nan"
    if fmt == "e5m2" and e == 31:
        return "nan" if m else ("inf" if sign > 0 else "-inf")
    if e == 0:
        return sign * Fraction(m, 1 << mbits) * Fraction(2) ** (1 - bias)
    return sign * (1 + Fraction(m, 1 << mbits)) * Fraction(2) ** (e - bias)


def finite_table(fmt):
    """The non-negative finite codes, sorted by value (each value once: +0 only)."""
    rows = [(decode(c, fmt), c) for c in range(0x80) if not isinstance(decode(c, fmt), str)]
    rows.sort()
    return [v for v, _ in rows], [c for _, c in rows]


TABLES = {fmt: finite_table(fmt) for fmt in FORMATS}


def encode(x, fmt):
    """The code nearest the fp32 value x, ties to the even code, saturating; NaN keeps its sign bit."""
    values, codes = TABLES[fmt]
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    if math.isnan(x):
        return "nan", sign
    a = abs(x)
    if math.isinf(a) or Fraction(a) >= values[-1]:
        return sign | codes[-1], sign
    a = Fraction(a)
    i = bisect.bisect_left(values, a)
    if values[i] == a:
        return sign | codes[i], sign
    lo, hi = i - 1, i
    d_lo, d_hi = a - values[lo], values[hi] - a
    pick = lo if d_lo < d_hi else hi if d_hi < d_lo else (lo if codes[lo] % 2 == 0 else hi)
    return sign | codes[pick], sign


def is_nan_code(code, fmt):
    return decode(code, fmt) == "nan"


def boundary_inputs():
    out = set()
    for fmt in FORMATS:
        values, _ = TABLES[fmt]
        ext = values + [values[-1] + (values[-1] - values[-2])]  # the next value had the format gone on
        for v0, v1 in zip(ext, ext[1:]):
            mid = (v0 + v1) / 2
            for v in (v0, v1, mid):
                f = float(v)
                for g in (f, math.nextafter(f, math.inf), math.nextafter(f, -math.inf)):
                    out.add(bits32(g))
                    out.add(bits32(g) ^ 0x80000000)
    for g in (0.0, -0.0, math.inf, -math.inf, 3.4028234663852886e38, 1e-45, 1e-40, 2.0 ** -126):
        out.add(bits32(g))
        out.add(bits32(-g))
    out.update((0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF))
    return out


def run(dump, mode, lines=None):
    r = subprocess.run([dump, mode], input=lines, capture_output=True, text=True, check=True)
    return r.stdout.split("\n")[:-1]


def check_encode(dump, inputs):
    inputs = sorted(inputs)
    got = run(dump, "encode", "".join("%08x\n" % b for b in inputs))
    assert len(got) == len(inputs), "fp8_dump printed %d codes for %d inputs" % (len(got), len(inputs))
    bad = 0
    for b, line in zip(inputs, got):
        x = f32(b)
        for fmt, text in zip(FORMATS, line.split()):
            code = int(text, 16)
            want, sign = encode(x, fmt)
            ok = is_nan_code(code, fmt) if want == "nan" else code == want
            if not ok:
                bad += 1
                if bad <= 10:
                    print("encode %s(%r = %08x): got %02x, want %s" % (fmt, x, b, code, want if want == "nan" else "%02x" % want))
    return bad


def check_decode(dump):
    lines = run(dump, "decode")
    assert len(lines) == 512, "fp8_dump decode printed %d lines" % len(lines)
    bad = 0
    for line in lines[:256]:
        c, b4, b5 = (int(t, 16) for t in line.split())
        for fmt, b in (("e4m3", b4), ("e5m2", b5)):
            want, got = decode(c, fmt), f32(b)
            if want == "nan":
                ok = math.isnan(got)
            elif want in ("inf", "-inf"):
                ok = got == float(want)
            else:
                ok = Fraction(got) == want and math.copysign(1.0, got) == (-1.0 if c & 0x80 else 1.0)
            if not ok:
                bad += 1
                print("decode %s %02x: got %r, want %s" % (fmt, c, got, want))
    for line in lines[256:]:
        _, c, b = line.split()
        c, got = int(c, 16), f32(int(b, 16))
        ok = math.isnan(got) if c == 0xFF else Fraction(got) == Fraction(2) ** (c - 127)
        if not ok:
            bad += 1
            print("decode e8m0 %02x: got %r" % (c, got))
    return bad


def mx_scale(amax, fmt):
    """E8M0 code of the smallest 2^x with amax / 2^x <= the largest finite, x in [-127, 127]."""
    if math.isnan(amax):
        return 0xFF
    if amax == 0:
        return 0
    if math.isinf(amax):
        return 254
    top = TABLES[fmt][0][-1]
    x = -127
    while x < 127 and top * Fraction(2) ** x < Fraction(amax):
        x += 1
    return x + 127


def check_mx(dump, rng):
    amaxes = {bits32(2.0 ** e * m) for e in range(-140, 128) for m in (1.0, 1.5, 1.75, 1.99)}
    amaxes |= {bits32(448.0 * 2.0 ** e) for e in range(-130, 100)} | {bits32(57344.0 * 2.0 ** e) for e in range(-130, 100)}
    amaxes |= {rng.getrandbits(31) for _ in range(2000)}
    amaxes |= {0, 0x7F800000, 0x7FC00000}
    amaxes = sorted(b for b in amaxes if b < 0x80000000)
    got = run(dump, "mx", "".join("%08x\n" % b for b in amaxes))
    bad = 0
    for b, line in zip(amaxes, got):
        for fmt, text in zip(FORMATS, line.split()):
            want = mx_scale(f32(b), fmt)
            if int(text, 16) != want:
                bad += 1
                if bad <= 10:
                    print("mx scale %s(amax %r): got %s, want %02x" % (fmt, f32(b), text, want))
    return bad + (len(got) != len(amaxes))


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    dump = sys.argv[1]
    rng = random.Random(62)
    bf16 = {b << 16 for b in range(1 << 16)}
    boundaries = boundary_inputs()
    randoms = {rng.getrandbits(32) for _ in range(50000)}
    # something to compare: the sets are not empty and cover both sides of every boundary
    assert len(bf16) == 65536 and len(boundaries) > 500 and len(randoms) > 40000
    bad = check_decode(dump)
    bad += check_encode(dump, bf16 | boundaries | randoms)
    bad += check_mx(dump, rng)
    print("fp8 formats: %d codes decoded, %d fp32 inputs encoded (every bf16 value, %d boundary values), %s"
          % (2 * 256 + 256, len(bf16 | boundaries | randoms), len(boundaries), "ok" if not bad else "%d mismatches" % bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
