#!/bin/bash
# tests/cli/partitioned.sh SHMAP - generated jax.numpy programs on sharded
# jax.Arrays over Auto and Explicit meshes (element-wise chains with
# broadcasting, reductions, transposes, reshapes, contractions, slices,
# concatenations, cumsums, loops, conds, sharding constraints), each run
# on unsharded arrays, eagerly and under jit on sharded ones, jit on
# unsharded ones, a quarter also differentiated, threaded and under
# `mpirun -np 2` with process-local arrays: the same numbers (eager and
# jit bit for bit where nothing is summed), the same layouts and the
# same exceptions (tests/diff/partitioned.py).
# PART_PROGRAMS sets the count (default 1,000; `make parttest` runs
# 20,000), PART_SEED the generator's seed.  The MPI runs are left out in
# sanitizer builds and builds without MPI.
set -u
shmap=${1:?usage: partitioned.sh SHMAP}
here=$(cd "$(dirname "$0")/../diff" && pwd)
scale=${SHMAP_TEST_SCALE:-1}
command -v python3 >/dev/null || { echo "python3 is not installed: partitioned test skipped"; exit 77; }
mpi=()
if [ "$scale" -ne 1 ] || ! command -v mpirun >/dev/null || ! "$shmap" --version | grep -q '^MPI: Open MPI'; then
  mpi=(--no-mpi)
fi
# sanitizer builds run 1,000 / SHMAP_TEST_SCALE programs: they are 2-4x slower
programs=${PART_PROGRAMS:-$((1000 / scale))}
exec python3 "$here/partitioned.py" "$shmap" --programs "$programs" --seed "${PART_SEED:-20261202}" \
  --timeout $((300 * scale)) "${mpi[@]}"
