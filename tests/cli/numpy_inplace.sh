#!/bin/bash
# tests/cli/numpy_inplace.sh SHMAP - host NumPy's in-place writes against
# NumPy itself: progs/numpy_inplace.py, which is also a shmap script,
# writes arrays as programs build their inputs (a[i] = v with basic,
# integer-array and mask indices, a op= b, writes through views, NumPy's
# casting and errors) and prints the arrays with their dtypes; shmap's
# output must equal python3's with NumPy line for line.  Skipped when no
# python3 with NumPy is installed (Debian: python3-numpy).
set -u
shmap=${1:?usage: numpy_inplace.sh SHMAP}
here=$(cd "$(dirname "$0")" && pwd)
py=
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import numpy' 2>/dev/null; then py=$p; break; fi
done
[ -n "$py" ] || { echo "skipped: no python3 with NumPy (python3-numpy) is installed"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
prog=$here/progs/numpy_inplace.py
"$py" "$prog" >"$dir/py.out" 2>&1 || { echo "python3 failed:"; tail -5 "$dir/py.out"; exit 1; }
"$shmap" "$prog" >"$dir/shm.out" 2>&1 || { echo "shmap failed:"; tail -5 "$dir/shm.out"; exit 1; }
if ! diff "$dir/py.out" "$dir/shm.out" >"$dir/diff"; then
  echo "shmap and NumPy differ (< NumPy, > shmap):"
  head -20 "$dir/diff"
  exit 1
fi
echo "$(wc -l <"$dir/py.out") lines of in-place writes agree with NumPy $("$py" -c 'import numpy; print(numpy.__version__)')"
