#!/bin/bash
# tests/cli/numpy_oracle.sh SHMAP - host NumPy against NumPy itself: each
# progs/numpy_*.py is also a shmap script, and shmap's output must equal
# python3's with NumPy line for line.  numpy_random.py draws data as
# programs do (np.random.seed with rand, randn, randint, normal, uniform,
# permutation, choice, RandomState; default_rng) and prints every number
# with repr, so equal means bit for bit; numpy_inplace.py writes arrays
# as programs build their inputs (a[i] = v with basic, integer-array and
# mask indices, a op= b, writes through views, NumPy's casting, reprs and
# errors).  Skipped when no python3 with NumPy is installed (Debian:
# python3-numpy).
set -u
shmap=${1:?usage: numpy_oracle.sh SHMAP}
here=$(cd "$(dirname "$0")" && pwd)
py=
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import numpy' 2>/dev/null; then py=$p; break; fi
done
[ -n "$py" ] || { echo "skipped: no python3 with NumPy (python3-numpy) is installed"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
version=$("$py" -c 'import numpy; print(numpy.__version__)')
for prog in "$here"/progs/numpy_*.py; do
  name=$(basename "$prog")
  "$py" "$prog" >"$dir/py.out" 2>&1 || { echo "$name: python3 failed:"; tail -5 "$dir/py.out"; exit 1; }
  "$shmap" "$prog" >"$dir/shm.out" 2>&1 || { echo "$name: shmap failed:"; tail -5 "$dir/shm.out"; exit 1; }
  if ! diff "$dir/py.out" "$dir/shm.out" >"$dir/diff"; then
    echo "$name: shmap and NumPy differ (< NumPy, > shmap):"
    head -20 "$dir/diff"
    exit 1
  fi
  echo "$name: $(wc -l <"$dir/py.out") lines agree with NumPy $version"
done
