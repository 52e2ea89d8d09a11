#!/bin/bash
# tests/cli/python_numbers.sh SHMAP - Python numbers against Python itself:
# a few hundred random expressions of ints, floats and bools (every
# arithmetic operator, unary minus, comparisons, mixed kinds, division and
# modulo by zero), made with a fixed seed, printed with repr() by shmap and
# by python3; the outputs must be the same line for line, errors included
# (ZeroDivisionError, OverflowError).  Skipped without python3.
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
