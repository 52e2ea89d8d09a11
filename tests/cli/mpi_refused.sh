#!/bin/bash
# tests/cli/mpi_refused.sh SHMAP - started as one of several MPI processes
# (mpirun sets OMPI_COMM_WORLD_SIZE; other launchers PMI_SIZE), shmap
# refuses to run, exit status 2, saying so once per process: devices across
# processes are not built yet, and each copy would otherwise run the whole
# program alone and print it again.  One process is an ordinary run.
set -u
shmap=${1:?usage: mpi_refused.sh SHMAP}
for var in OMPI_COMM_WORLD_SIZE PMI_SIZE; do
  out=$(env "$var=2" "$shmap" -c 'print("ran")' 2>&1); status=$?
  [ "$status" -eq 2 ] || { echo "$var=2: exit status $status, output: $out"; exit 1; }
  grep -q "one of 2 MPI processes" <<<"$out" || { echo "$var=2: no message: $out"; exit 1; }
  ! grep -q "^ran$" <<<"$out" || { echo "$var=2: the program ran"; exit 1; }
done
out=$(OMPI_COMM_WORLD_SIZE=1 "$shmap" -c 'print("ran")' 2>&1)
[ "$out" = "ran" ] || { echo "one process: unexpected output: $out"; exit 1; }
