#!/bin/bash
# tests/cli/evicted_history.sh SHMAP - a device whose only peer over 'i'
# went on to 20 other collectives and returned (tests/cli/progs/
# evicted_history_*.shm, 2x2 and 32x32 blocks) must end in the located
# mismatch error, never a matrix (the 2x2 case printed a wrong one), a
# crash or a hang (the 32x32 case).  Which of two right messages comes
# depends on whether the peer's descriptor was still in its history when
# the device looked: a race, so both are accepted.  Five runs each.
set -u
shmap=${1:?usage: evicted_history.sh SHMAP}
scale=${SHMAP_TEST_SCALE:-1}   # time limits grow in sanitizer builds (run-tests.sh)
here=$(cd "$(dirname "$0")" && pwd)
fail=0
for n in 2 32; do
  prog="$here/progs/evicted_history_$n.shm"
  psum_i=$(grep -n "psum(y, 'i')" "$prog" | cut -d: -f1)
  psum_j=$(grep -n "psum(y, 'j')" "$prog" | cut -d: -f1)
  want="^[^:]+:$psum_i:13: error: on device \(i=0, j=0\): collective mismatch: device \(i=0, j=0\) reached psum over 'i' of f32\[$n,$n\] at line $psum_i, device \(i=1, j=0\) (reached psum over 'j' of f32\[$n,$n\] at line $psum_j|went past its collective number 0 without device \(i=0, j=0\))$"
  for run in 1 2 3 4 5; do
    out=$(timeout $((30 * scale)) "$shmap" "$prog" 2>"$prog.err.$$"); status=$?
    first=$(grep -v '^Traceback (most recent call last):$\|^  ' "$prog.err.$$" | head -n 1)   # the located message, after any traceback
    rm -f "$prog.err.$$"
    if [ $status -ne 1 ] || [ -n "$out" ] || ! [[ $first =~ $want ]]; then
      echo "FAIL ${n}x$n run $run: status $status, stdout '$out', stderr: $first"
      fail=1
    fi
  done
done
exit $fail
