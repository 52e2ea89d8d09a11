#!/bin/bash
# tests/cli/debug_tbreak_ignore.sh SHMAP - a tbreak or an ignored
# breakpoint on a line of a shard_map body whose 8 devices run apart
# (progs/tbreak_body.shm): the devices' k-th crossings of the line are one
# crossing, counted as one hit and decided once, so the session gives the
# same transcript in 20 runs.  The tbreak stops every device at j == 0
# and is gone at the prompt; `ignore 1 1` stops every device at j == 1,
# with the breakpoint hit 2 times (not once per device), then at j == 2.
set -u
shmap=${1:?usage: debug_tbreak_ignore.sh SHMAP}
scale=${SHMAP_TEST_SCALE:-1}   # time limits grow in sanitizer builds (run-tests.sh)
prog="$(cd "$(dirname "$0")" && pwd)/progs/tbreak_body.shm"
fail=0

# Runs session [name] (commands [2]) 20 times; the first run's transcript
# must match each of the extended regular expressions after it, the
# others must equal it.
check() {
  local name=$1 cmds=$2 first="" out run want
  shift 2
  for run in $(seq 1 20); do
    out=$(printf '%s\n' "$cmds" | timeout $((30 * scale)) "$shmap" --debug "$prog" 2>&1)
    if [ -z "$first" ]; then
      first=$out
      for want in "$@"; do
        grep -Eq "$want" <<<"$out" || { echo "FAIL $name: no line '$want' in:"; echo "$out"; fail=1; }
      done
    elif [ "$out" != "$first" ]; then
      echo "FAIL $name: run $run differs from run 1:"; diff <(echo "$first") <(echo "$out"); fail=1
      return
    fi
  done
}

check tbreak $'tbreak 8\nc\np j @ all\nb\nc' \
  '^Deleted breakpoint 1 at .*tbreak_body.shm:8$' \
  '^\(i=0\): 0$' '^\(i=7\): 0$' '^\(shmap-dbg \(i=0\)\) b$' '^\[260\. 268\. .* 316\.\]$'
check ignore $'b 8\nignore 1 1\nc\np j @ all\nb\nc\np j @ all\nc' \
  '^\(i=0\): 1$' '^\(i=7\): 1$' '^	breakpoint already hit 2 times$' '^\(i=7\): 2$' \
  '^\[260\. 268\. .* 316\.\]$'
exit $fail
