#!/bin/bash
# tests/cli/python_numbers.sh SHMAP - Python numbers against Python itself:
# a few hundred random expressions of ints, floats and bools (every
# arithmetic operator, unary minus, comparisons, mixed kinds, division and
# modulo by zero), the methods and attributes of ints and floats
# (bit_length, as_integer_ratio, is_integer, ...) and int(s, base), made
# with a fixed seed, printed with repr() by shmap and by python3; the
# outputs must be the same line for line, errors included
# (ZeroDivisionError, OverflowError, ValueError).  Skipped without python3.
set -u
shmap=${1:?usage: python_numbers.sh SHMAP}
command -v python3 >/dev/null || { echo "skipped: python3 is not installed"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir" <<'PY'
import random, sys
d = sys.argv[1]
rng = random.Random(20261125)
def atom():
    k = rng.random()
    if k < 0.4:
        return str(rng.randint(-50, 50))
    if k < 0.85:
        return repr(rng.choice([0.0, -0.0, 0.1, 0.5, 1.5, 2.0, 3.25, 1e-5, 1e16, 7.0, -2.5]) *
                    rng.choice([1, -1, 3]))
    return rng.choice(["True", "False"])
def expr(depth):
    if depth == 0 or rng.random() < 0.3:
        return atom()
    op = rng.choice(["+", "-", "*", "/", "//", "%", "**", "<", "==", "-u"])
    if op == "-u":
        return "(-" + expr(depth - 1) + ")"
    if op == "**":   # real results only: a base >= 0 or a small int power
        return "(abs(" + expr(depth - 1) + ") ** " + str(rng.randint(0, 4)) + ")"
    return "(" + expr(depth - 1) + " " + op + " " + expr(depth - 1) + ")"
lines = []
for _ in range(400):
    lines.append("try:\n    print(repr(%s))\nexcept ZeroDivisionError:\n    print('ZeroDivisionError')\n"
                 "except OverflowError:\n    print('OverflowError')\n" % expr(3))
def method():
    # the methods and attributes of Python ints and floats, and int(s, base)
    k = rng.random()
    if k < 0.35:
        n = rng.choice([0, 1, -1, 255, -256, 4096, rng.randint(-10 ** 6, 10 ** 6)])
        return "(%d).%s" % (n, rng.choice(["bit_length()", "bit_count()", "as_integer_ratio()",
                                           "real", "imag", "numerator", "denominator",
                                           "conjugate()"]))
    if k < 0.65:
        m = rng.choice(["is_integer()", "as_integer_ratio()", "real", "imag", "conjugate()"])
        # (1e-5's ratio has a denominator of 2**69: past 64-bit ints)
        x = rng.choice([0.0, -0.0, 0.1, 0.5, -2.5, 3.0, 1e15, 123.456, -7.0] +
                       ([] if m == "as_integer_ratio()" else [1e-5])) * rng.choice([1, -1, 3])
        return "(%r).%s" % (x, m)
    n = rng.randint(-10 ** 6, 10 ** 6)
    base = rng.choice([0, 2, 8, 10, 16, 36, 7])
    digits = {2: format(abs(n), 'b'), 8: format(abs(n), 'o'), 16: format(abs(n), rng.choice('xX')),
              10: str(abs(n))}.get(base, str(abs(n)))
    if base == 0:
        pb = rng.choice(['b', 'o', 'x', ''])
        digits = ('0' + pb + format(abs(n), pb)) if pb else str(abs(n))
    elif base in (2, 8, 16) and rng.random() < 0.3:
        digits = '0' + {2: 'b', 8: 'o', 16: 'x'}[base] + digits
    if len(digits) > 3 and rng.random() < 0.3:
        digits = digits[:2] + '_' + digits[2:]
    if rng.random() < 0.1:
        digits = rng.choice(['', '_1', '1__0', '0x', '019', 'g', '010'])
    return "int(%r, %d)" % (('-' if n < 0 else '') + digits + rng.choice(['', ' ']), base)
for _ in range(150):
    lines.append("try:\n    print(repr(%s))\nexcept ValueError as e:\n    print('ValueError', e)\n"
                 % method())
open(d + "/p.py", "w").write("".join(lines))
open(d + "/p.shm", "w").write("".join(lines))
PY
python3 "$dir/p.py" >"$dir/py.out" 2>&1 || { echo "python3 failed:"; cat "$dir/py.out"; exit 1; }
"$shmap" "$dir/p.shm" >"$dir/shm.out" 2>&1 || { echo "shmap failed:"; tail -5 "$dir/shm.out"; exit 1; }
if ! diff "$dir/py.out" "$dir/shm.out" >"$dir/diff"; then
  echo "shmap and python3 differ (< python3, > shmap):"
  head -20 "$dir/diff"
  exit 1
fi
echo "$(wc -l <"$dir/py.out") expressions agree"
