#!/usr/bin/env bash
# bench/startup.sh SHMAP - start-up time against source size: a script of
# 1, 4 and 16 MB (one list literal of floats, and as many short
# statements), from process start to its last statement; best of 3.
# Lexing and parsing are linear: the time should grow with the size.
set -euo pipefail
shmap=${1:?usage: startup.sh SHMAP}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for mb in 1 4 16; do
  python3 - "$tmp/list.shm" "$tmp/stmts.shm" "$mb" <<'PY'
import sys
lst, stmts, mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
target = mb << 20
with open(lst, "w") as f:
    f.write("x = [")
    n = 0
    while n < target:
        s = "%d.25, " % (n % 100000)
        f.write(s)
        n += len(s)
    f.write("0.]\nprint(len(x))\n")
with open(stmts, "w") as f:
    n = 0
    while n < target:
        s = "y = %d * 2 + 1\n" % (n % 100000)
        f.write(s)
        n += len(s)
    f.write("print(y)\n")
PY
  for kind in list stmts; do
    best=$(for _ in 1 2 3; do
             s=$(date +%s%N); "$shmap" "$tmp/$kind.shm" >/dev/null; e=$(date +%s%N)
             echo $(( (e - s) / 1000000 ))
           done | sort -n | head -1)
    echo "$mb MB of ${kind/stmts/statements}: $best ms"
  done
done
