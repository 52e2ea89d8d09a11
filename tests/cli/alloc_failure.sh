#!/bin/bash
# tests/cli/alloc_failure.sh SHMAP - out of memory at every allocation, as
# SQLite's malloc tests do it: each program of tests/cli/progs/alloc_*.shm
# runs with SHMAP_FAIL_ALLOC=N (shmap(1), ENVIRONMENT: the Nth allocation
# fails) for N over its allocations, and each run must end either with
# its usual output and status 0 (the failure was recovered from) or with
# the located error "MemoryError: out of memory", status 1 and the output
# so far a prefix of the usual one.  Never a signal, a hang, another
# error, or an error without its place.
#
# N runs over ALLOC_STARTUP (default 6) allocations spread over starting
# the interpreter, then the program's own: all of its first ALLOC_DENSE
# (default 50), and ALLOC_SAMPLES (default 25) more spread evenly over
# the rest; each divided by SHMAP_TEST_SCALE in sanitizer builds.
# ALLOC_ALL=1 walks every N.
set -u
shmap=${1:?usage: alloc_failure.sh SHMAP}
scale=${SHMAP_TEST_SCALE:-1}   # time limits grow in sanitizer builds (run-tests.sh)
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
dense=$(( ${ALLOC_DENSE:-50} / scale ))
samples=$(( ${ALLOC_SAMPLES:-25} / scale ))
startup=$(( ${ALLOC_STARTUP:-6} / scale ))
fails=0

# The Ns to try for a program that makes [count] allocations, [base] of
# them before its first line runs: a few of those (starting the
# interpreter is the same for every program), then the program's own.
ns() {
  local base=$1 count=$2 n step
  if [ -n "${ALLOC_ALL:-}" ]; then
    seq 1 "$count"
    return
  fi
  step=$((base / startup + 1))
  for ((n = 1; n <= base; n += step)); do echo "$n"; done
  if [ $((count - base)) -le $((dense + samples)) ]; then
    seq $((base + 1)) "$count"
    return
  fi
  seq $((base + 1)) $((base + dense))
  step=$(( (count - base - dense) / samples + 1 ))
  for ((n = base + dense + step; n <= count; n += step)); do echo "$n"; done
}

# The count of allocations [shmap] makes running its arguments, from its
# note at exit (shmap(1), SHMAP_FAIL_ALLOC); the output goes to ref.out.
count_of() {
  SHMAP_FAIL_ALLOC=1000000000 "$shmap" "$@" >"$dir/ref.out" 2>"$dir/ref.err"
  sed -n 's/^shmap: SHMAP_FAIL_ALLOC=[0-9]*: no allocation failed (\([0-9]*\) made)$/\1/p' "$dir/ref.err"
}

# Judges the run of [prog] with the Nth allocation failing: its status,
# out and err files against the usual output ref.out; says what is wrong.
judge() {
  local prog=$1 n=$2 status=$3 name
  name=$(basename "$prog")
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo "N=$n: did not end within $((20 * scale)) s"
  elif [ "$status" -gt 128 ]; then
    echo "N=$n: killed by signal $((status - 128))"
  elif [ "$status" -eq 0 ]; then
    cmp -s "$dir/out" "$dir/ref.out" || echo "N=$n: succeeded with other output"
    [ ! -s "$dir/err" ] || echo "N=$n: succeeded with errors"
  elif [ "$status" -ne 1 ]; then
    echo "N=$n: exit status $status"
  elif ! grep -Eq "^$name(:[0-9]+:[0-9]+)?: error: (.*: )?MemoryError: out of memory\$" "$dir/err"; then
    echo "N=$n: failed without a located MemoryError"
  elif [ "$(head -c "$(wc -c <"$dir/out")" "$dir/ref.out")" != "$(cat "$dir/out")" ]; then
    echo "N=$n: printed what the program does not print"
  fi
}

base=$(count_of -c pass)
for prog in "$here"/progs/alloc_*.shm; do
  cd "$(dirname "$prog")" || exit 1
  name=$(basename "$prog")
  count=$(count_of "$name")
  if [ -z "$count" ] || [ -z "$base" ]; then
    echo "FAIL $name: no count of allocations:"
    cat "$dir/ref.err"
    fails=$((fails + 1))
    continue
  fi
  bad=0
  for n in $(ns "$base" "$count"); do
    # what a half-made structure holds when memory ran out may leak: that
    # is not what this walk looks for, so a sanitizer build does not look
    timeout -s KILL $((20 * scale)) env SHMAP_FAIL_ALLOC="$n" \
      ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
      "$shmap" "$name" >"$dir/out" 2>"$dir/err"
    status=$?
    sed -i '/^shmap: SHMAP_FAIL_ALLOC=.*: no allocation failed/d' "$dir/err"
    why=$(judge "$prog" "$n" "$status")
    if [ -n "$why" ]; then
      bad=$((bad + 1))
      if [ "$bad" -le 5 ]; then
        echo "FAIL $name, $why"
        head -n 8 "$dir/err" | sed 's/^/    /'
      fi
    fi
  done
  [ "$bad" -eq 0 ] || fails=$((fails + 1))
  echo "$name: $count allocations, $(ns "$base" "$count" | wc -l) runs, $bad failed"
done
[ "$fails" -eq 0 ]
