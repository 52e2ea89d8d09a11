#!/bin/bash
# tests/cli/eager_fusion.sh SHMAP - an element-wise expression over large
# float32 arrays runs eagerly as one fused loop (the timeline shows it),
# and programs print the same with it and without it
# (SHMAP_NO_EAGER_FUSION).  Exit 0 when all hold.
set -u
shmap=${1:?usage: eager_fusion.sh SHMAP}
command -v python3 >/dev/null || { echo "python3 is not installed: test skipped"; exit 77; }
here=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

cat >"$dir/prog.shm" <<'SHM'
x = arange(100000, dtype=float32) / 7.
y = cos(x)
a = x * y + 1.
b = x * y
c = exp(-x) * 2. + sin(y)
print(a[5], b[5], c[5])
SHM

# the timeline: one fused loop for lines 3 and 5, the operator for line 4
for mode in fused plain; do
  if [ $mode = plain ]; then export SHMAP_NO_EAGER_FUSION=1; fi
  "$shmap" --trace "$dir/$mode.json" "$dir/prog.shm" >"$dir/$mode.out" 2>"$dir/err" || {
    echo "shmap failed:"; cat "$dir/err"; exit 1; }
  python3 - "$dir/$mode.json" $mode <<'PY' || exit 1
import json, sys
x = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
def prims(line):
    st = [e for e in x if e["cat"] == "statement" and e["name"].startswith("%d: " % line)][0]
    return [e["name"] for e in x if e["cat"] == "primitive" and e["tid"] == st["tid"]
            and st["ts"] <= e["ts"] <= st["ts"] + st["dur"]]
want = ["fused loop"] if sys.argv[2] == "fused" else ["mul", "add"]
assert prims(3) == want, (sys.argv[2], prims(3))
assert prims(4) == ["mul"], prims(4)
want = ["fused loop"] if sys.argv[2] == "fused" else ["neg", "exp", "mul", "sin", "add"]
assert prims(5) == want, (sys.argv[2], prims(5))
PY
done
unset SHMAP_NO_EAGER_FUSION
cmp -s "$dir/fused.out" "$dir/plain.out" || { echo "outputs differ:"; diff "$dir/fused.out" "$dir/plain.out"; exit 1; }

# a loop of 2^20 elements or more runs on two cores: the same bits as on
# one (SHMAP_SERIAL_KERNELS), and as operator by operator, eager and jit,
# its closing sum included (the length is not a whole number of blocks)
cat >"$dir/long.shm" <<'SHM'
n = 2**21 + 4099
x = (arange(n, dtype=float32) - 1e6) / 3.
y = cos(arange(n, dtype=float32))
a = x * y + sin(x) / 2
t = x * y
u = sin(x)
u = u / 2
t = t + u
print(all(a == t), repr(sum(a)), repr(jit(lambda x, y: sum(x * y + sin(x) / 2))(x, y)))
print(repr(a[0]), repr(a[n // 2]), repr(a[-1]))
SHM
"$shmap" "$dir/long.shm" >"$dir/two" 2>&1
SHMAP_SERIAL_KERNELS=1 "$shmap" "$dir/long.shm" >"$dir/one" 2>&1
SHMAP_NO_EAGER_FUSION=1 "$shmap" "$dir/long.shm" >"$dir/plain" 2>&1
grep -q "^True " "$dir/two" || { echo "a split loop differs from the stepwise result:"; cat "$dir/two"; exit 1; }
cmp -s "$dir/two" "$dir/one" || { echo "two cores and one differ:"; diff "$dir/two" "$dir/one"; exit 1; }
cmp -s "$dir/two" "$dir/plain" || { echo "fused and not differ:"; diff "$dir/two" "$dir/plain"; exit 1; }

# whole programs print the same either way
for f in "$here/tests/lang/eager_fusion.shm" "$here/tests/lang/jit_fusion.shm" "$here/bench/jit_bench.shm"; do
  case $f in *bench*) continue;; esac
  "$shmap" "$f" >"$dir/a" 2>&1
  SHMAP_NO_EAGER_FUSION=1 "$shmap" "$f" >"$dir/b" 2>&1
  cmp -s "$dir/a" "$dir/b" || { echo "$f prints differently without fusion:"; diff "$dir/a" "$dir/b"; exit 1; }
done
exit 0
