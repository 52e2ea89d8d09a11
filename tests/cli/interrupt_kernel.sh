#!/bin/bash
# tests/cli/interrupt_kernel.sh SHMAP - Ctrl-C during one long kernel (an
# arange of 2**30 elements; an int32 2000-square product, 7 s of work)
# ends the program promptly with "interrupted", exit status 1: the kernel
# looks at the flag between blocks or rows and its result is never used.
# (Both used to run to the end first.)
set -u
shmap=${1:?usage: interrupt_kernel.sh SHMAP}
scale=${SHMAP_TEST_SCALE:-1}   # time limits grow in sanitizer builds (run-tests.sh)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# Runs [program], sends Ctrl-C after 0.5 s, and requires "interrupted",
# exit status 1, no output, and a stop within 3 s (scaled).
interrupted_soon() {
  "$shmap" -c "$1" >"$dir/out" 2>"$dir/err" &
  local pid=$! start status ms
  sleep 0.5
  kill -INT "$pid"
  start=$(date +%s%N)
  wait "$pid"
  status=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  if [ "$status" -ne 1 ] || ! grep -q "error: interrupted" "$dir/err" || [ -s "$dir/out" ]; then
    echo "$1: status $status after ${ms} ms; stdout:"; cat "$dir/out"; echo "stderr:"; cat "$dir/err"
    exit 1
  fi
  # a block (or a row) is far less than a second, even under a sanitizer
  [ "$ms" -lt $((3000 * scale)) ] || { echo "$1: took ${ms} ms to stop after Ctrl-C"; exit 1; }
}
interrupted_soon 'x = arange(2**30)
print("done", x[-1])'
# an integer product has no BLIS: it looks at the flag between rows
interrupted_soon 'x = ones((2000, 2000), dtype=int32)
for k in range(100):
    y = x @ x
print("done")'
# one fused loop (an element-wise expression, eager, seconds long: its
# arguments are past sin's float range, so libm computes every element):
# it looks at the flag every 4 Mi elements; "ready" is printed first, so
# Ctrl-C lands in the loop
e="sin(x)"; for k in 2 3 4 5 6 7 8; do e="$e + sin(x * $k.)"; done
"$shmap" -c "x = arange(2**26, dtype=float32) + 2e5
print('ready', flush=True)
y = $e
print('done')" >"$dir/out" 2>"$dir/err" &
pid=$!
for _ in $(seq 600); do grep -q ready "$dir/out" 2>/dev/null && break; sleep 0.05; done
sleep 0.1
kill -INT "$pid"
start=$(date +%s%N)
wait "$pid"
status=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
if [ "$status" -ne 1 ] || ! grep -q "error: interrupted" "$dir/err" || grep -q done "$dir/out"; then
  echo "fused loop: status $status after ${ms} ms; stdout:"; cat "$dir/out"; echo "stderr:"; cat "$dir/err"
  exit 1
fi
# 4 Mi elements take a tenth of a second; the whole loop three seconds
[ "$ms" -lt $((1000 * scale)) ] || { echo "fused loop: took ${ms} ms to stop after Ctrl-C"; exit 1; }
exit 0
