#!/bin/bash
# tests/cli/interrupt_kernel.sh SHMAP - Ctrl-C during one long kernel (an
# arange of 2**30 elements, seconds of work) ends the program promptly with
# "interrupted", exit status 1: the kernel looks at the flag between
# blocks and its result is never used.  (It used to run to the end first.)
set -u
shmap=${1:?usage: interrupt_kernel.sh SHMAP}
scale=${SHMAP_TEST_SCALE:-1}   # time limits grow in sanitizer builds (run-tests.sh)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$shmap" -c 'x = arange(2**30)
print("done", x[-1])' >"$dir/out" 2>"$dir/err" &
pid=$!
sleep 0.5
kill -INT "$pid"
start=$(date +%s%N)
wait "$pid"
status=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
if [ "$status" -ne 1 ] || ! grep -q "error: interrupted" "$dir/err" || [ -s "$dir/out" ]; then
  echo "status $status after ${ms} ms; stdout:"; cat "$dir/out"; echo "stderr:"; cat "$dir/err"
  exit 1
fi
# a block is 4 Mi elements: far less than a second, even under a sanitizer
[ "$ms" -lt $((3000 * scale)) ] || { echo "took ${ms} ms to stop after Ctrl-C"; exit 1; }
exit 0
