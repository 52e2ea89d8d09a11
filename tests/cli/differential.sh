#!/bin/bash
# tests/cli/differential.sh SHMAP - generated shard_map programs (bodies
# mixing collectives, element-wise chains, fori_loops and vmap) run
# eagerly, under jit, batched by vmap eagerly and under jit, each threaded,
# in reference mode (SHMAP_REFERENCE=1) and under `mpirun -np 2`: all must
# give the same numbers or the same exception (tests/diff/differential.py).
# DIFF_PROGRAMS sets the count (default 200; `make difftest` runs 3,000),
# DIFF_SEED the generator's seed.  The MPI runs are left out in sanitizer
# builds and builds without MPI.
set -u
shmap=${1:?usage: differential.sh SHMAP}
here=$(cd "$(dirname "$0")/../diff" && pwd)
scale=${SHMAP_TEST_SCALE:-1}
command -v python3 >/dev/null || { echo "python3 is not installed: differential test skipped"; exit 77; }
mpi=()
if [ "$scale" -ne 1 ] || ! command -v mpirun >/dev/null || ! "$shmap" --version | grep -q '^MPI: Open MPI'; then
  mpi=(--no-mpi)
fi
# sanitizer builds run 200 / SHMAP_TEST_SCALE programs: they are 2-4x slower
programs=${DIFF_PROGRAMS:-$((200 / scale))}
exec python3 "$here/differential.py" "$shmap" --programs "$programs" --seed "${DIFF_SEED:-20261201}" \
  --timeout $((300 * scale)) "${mpi[@]}"
