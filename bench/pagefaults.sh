#!/usr/bin/env bash
# bench/pagefaults.sh SHMAP - page faults and time of eager `x * y + z`
# (float32) at 10^3 .. 10^8 elements, shmap beside NumPy when installed.
# Each size runs as its own process doing the same number of elements in
# total (10^9 / n calls, at least 20; at 10^8, whose arrays take 400 MB
# each and 2 GB in all, 4 calls, so the row takes seconds); the faults
# are the kernel's minor faults of the whole process (GNU time's %R)
# less those of the same process making one call, divided by the calls:
# what a steady-state call costs in fresh pages.  A result that reuses warm memory costs 0.
set -euo pipefail
shmap=$(realpath "${1:?usage: pagefaults.sh SHMAP}")
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"   # (the heap's layout, hence glibc's trimming, depends on the path)
have_np=0
"$py" -c 'import numpy' 2>/dev/null && have_np=1
[ -x /usr/bin/time ] || { echo "(GNU time not installed: no page-fault figures)"; exit 0; }

# prog N CALLS: the shmap program; nprog N CALLS: NumPy's twin.  Each
# prints the mean ns per element of the timed calls.
prog() {
  cat <<SHM
n = $1
x = arange(n, dtype=float32) / n
y = ones(n) * 0.5
z = ones(n) * 0.25
r = x * y + z
t0 = perf_counter()
for k in range($2):
    r = x * y + z
print((perf_counter() - t0) / $2 / n * 1e9)
SHM
}
nprog() {
  cat <<PY
import time, numpy as np
n = $1
x = np.arange(n, dtype=np.float32) / np.float32(n)
y = np.ones(n, dtype=np.float32) * np.float32(0.5)
z = np.ones(n, dtype=np.float32) * np.float32(0.25)
r = x * y + z
t0 = time.perf_counter()
for k in range($2):
    r = x * y + z
print((time.perf_counter() - t0) / $2 / n * 1e9)
PY
}
# faults CMD...: minor faults of the run, then what it printed
faults() { /usr/bin/time -f '%R' -o "$tmp/t" "$@" > "$tmp/o"; echo "$(cat "$tmp/t") $(cat "$tmp/o")"; }
# per_call KIND N CALLS: "faults/call ns/element"
per_call() {
  local f1 f2 o
  if [ "$1" = shmap ]; then
    prog "$2" 1 > "$tmp/a.shm"; prog "$2" "$3" > "$tmp/b.shm"
    read -r f1 _ < <(faults "$shmap" --devices 1 a.shm)
    read -r f2 o < <(faults "$shmap" --devices 1 b.shm)
  else
    nprog "$2" 1 > "$tmp/a.py"; nprog "$2" "$3" > "$tmp/b.py"
    read -r f1 _ < <(faults "$py" "$tmp/a.py")
    read -r f2 o < <(faults "$py" "$tmp/b.py")
  fi
  awk -v a="$f1" -v b="$f2" -v c="$3" -v t="$o" \
    'BEGIN { printf "%8.2f faults/call %7.3f ns/element", (b - a) / (c - 1), t }'
}
printf '%-10s %-36s %s\n' elements shmap NumPy
for e in 3 4 5 6 7 8; do
  n=$((10 ** e)); calls=$((10 ** 9 / n)); [ $calls -lt 20 ] && calls=20
  [ "$e" -ge 8 ] && calls=4
  line=$(printf '10^%-7s %s' "$e" "$(per_call shmap $n $calls)")
  [ $have_np = 1 ] && line="$line | $(per_call np $n $calls)"
  echo "$line"
done
