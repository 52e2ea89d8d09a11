#!/bin/bash
# tests/cli/interrupt_kernel.sh SHMAP - Ctrl-C during one long kernel (an
# arange of 2**30 elements; an int32 2000-square product, 7 s of work; a
# fused element-wise loop of seconds; a compiled loop that never ends;
# astype, concatenate, cumsum, a 6000-square float product, random.normal
# and str.replace of 200 MB; loops over itertools' endless iterators)
# ends the program promptly with
# "interrupted", exit status 1: the kernel looks at the flag between
# blocks or rows and its result is never used.  (All used to run to the
# end first.)
set -u
shmap=${1:?usage: interrupt_kernel.sh SHMAP}
scale=${SHMAP_TEST_SCALE:-1}   # time limits grow in sanitizer builds (run-tests.sh)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# Runs [program] and sends Ctrl-C 0.5 s later, or, when it prints "ready"
# first, 0.1 s after that; requires "interrupted", exit status 1, no
# "done" printed, and a stop within [bound] ms (default 3000; scaled).
interrupted_soon() {
  local bound=${2:-3000}
  "$shmap" -c "$1" >"$dir/out" 2>"$dir/err" &
  local pid=$! start status ms
  if grep -q "print('ready'" <<<"$1"; then
    for _ in $(seq 600); do grep -q ready "$dir/out" 2>/dev/null && break; sleep 0.05; done
    sleep 0.1
  else
    sleep 0.5
  fi
  kill -INT "$pid"
  start=$(date +%s%N)
  wait "$pid"
  status=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  if [ "$status" -ne 1 ] || ! grep -q "error: KeyboardInterrupt: interrupted" "$dir/err" || grep -q done "$dir/out"; then
    echo "$1: status $status after ${ms} ms; stdout:"; cat "$dir/out"; echo "stderr:"; cat "$dir/err"
    exit 1
  fi
  # a block (or a row) is far less than a second, even under a sanitizer
  [ "$ms" -lt $((bound * scale)) ] || { echo "$1: took ${ms} ms to stop after Ctrl-C"; exit 1; }
}
# A sanitizer's free of a buffer takes time in proportion to its size
# (TSan clears its metadata for all 4 GiB: 10 s), so the arange shrinks
# as the bound grows; it still runs for many seconds under each.
interrupted_soon "x = arange($((2**30 / scale)))
print('done', x[-1])"
# an integer product has no BLIS: it looks at the flag between rows
interrupted_soon 'x = ones((2000, 2000), dtype=int32)
for k in range(100):
    y = x @ x
print("done")'
# one fused loop (an element-wise expression, eager, seconds long: its
# arguments are past sin's float range, so libm computes every element)
# looks at the flag every 512 Ki elements, a hundredth of a second
e="sin(x)"; for k in 2 3 4 5 6 7 8; do e="$e + sin(x * $k.)"; done
interrupted_soon "x = arange(2**26, dtype=float32) + 2e5
print('ready', flush=True)
y = $e
print('done')" 1000
# a compiled loop of a tiny body that never ends runs from tapes (no
# kernel call to look at the flag): it looks once an iteration
interrupted_soon "f = jit(lambda v: while_loop(lambda s: s[0] > -1., lambda s: (s[0] * 0.5, s[1] + 1.), (1., v)))
print('ready', flush=True)
f(ones(8))
print('done')" 1000
# kernels of seconds that looked at the flag only at their end: each now
# stops within a chunk (astype, concatenate's copies, cumsum's scan, the
# random bits and erf_inv behind normal, str.replace's search) or within a
# panel of rows (a float product through BLIS).  Their arrays are
# gigabytes, which the exit frees (and a sanitizer build's leak check
# scans, seconds of it on a busy machine): a bound of 4 s, where the old
# kernels ran on for 12 to 280 s
for body in 'y = x.astype(int32)' 'y = concatenate([x, x])' 'y = cumsum(x)'; do
  interrupted_soon "x = ones(4 * 10**8, dtype=float32)
print('ready', flush=True)
$body
print('done')" 4000
done
interrupted_soon "x = ones((6000, 6000), dtype=float32) * 1.
print('ready', flush=True)
y = x @ x
print('done')"
interrupted_soon "import jax
k = jax.random.key(0)
print('ready', flush=True)
y = jax.random.normal(k, (4 * 10**8,))
print('done')"
interrupted_soon "s = 'ab' * 10**8
print('ready', flush=True)
t = s.replace('b', 'cd')
print('done')"
# itertools' endless iterators: a loop with an empty body, and each place
# that pulls items until one decides (in, any, takewhile, a generator
# expression's next, islice's skip) looks at the flag between items
for body in 'for i in count(): pass' 'b = -1 in cycle([1, 2])' 'b = any(x < 0 for x in count())' \
            'b = list(takewhile(lambda x: x >= 0, count()))' 'b = next(x for x in count() if x < 0)' \
            'b = next(islice(count(), 10**17, None))'; do
  interrupted_soon "from itertools import count, cycle, islice, takewhile
print('ready', flush=True)
$body
print('done')" 1000
done
exit 0
