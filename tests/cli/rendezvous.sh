#!/bin/bash
# tests/cli/rendezvous.sh SHMAP - a debugger stop in per-device code is a
# rendezvous (LANGUAGE.md §7): after breakpoint() on 8 devices, `p y @ all`
# shows y on every device, and the same script with the same commands
# gives the same transcript every run (20 runs); a breakpoint in the
# collective matmul's ring step stops once per iteration, 7 times, not
# once per device.
set -u
shmap=${1:?usage: rendezvous.sh SHMAP}
scale=${SHMAP_TEST_SCALE:-1}   # time limits grow in sanitizer builds (run-tests.sh)
here=$(cd "$(dirname "$0")" && pwd)
fail=0
first=""
for run in $(seq 1 20); do
  out=$(printf 'p y @ all\nc\n' | timeout $((30 * scale)) "$shmap" "$here/progs/rendezvous.shm" 2>&1)
  if [ -z "$first" ]; then
    first=$out
    for d in 0 1 2 3 4 5 6 7; do
      if ! grep -q "^(i=$d): Array(\[$((2 * d + 1))\.\], dtype=float32)$" <<<"$out"; then
        echo "FAIL: run 1 does not show y on device $d:"; echo "$out"; fail=1
      fi
    done
  elif [ "$out" != "$first" ]; then
    echo "FAIL: run $run differs from run 1:"; diff <(echo "$first") <(echo "$out"); fail=1
    break
  fi
done
for run in 1 2 3; do
  stops=$(yes c | timeout $((60 * scale)) "$shmap" "$here/progs/rendezvous_matmul.shm" 2>&1 | grep -c '^> ')
  if [ "$stops" != 7 ]; then
    echo "FAIL: the ring step's breakpoint stopped $stops times, not 7 (run $run)"; fail=1
  fi
done
exit $fail
