#!/bin/bash
# bench/sharded_memory.sh BUILDDIR [SIZE] [LAYOUT] - the resident memory
# of a 2 GiB sharded array (SIZE float32 elements, default 2^29) over 8
# devices, split by rows or, LAYOUT "cols", by columns of a matrix,
# through a partitioned element-wise + reduction step
# (bench/sharded_memory.shm): in one process, then under `mpirun -np 2`,
# where each process holds only its devices' blocks (array.h,
# "Process-local shards").  Prints each run's peak resident set per
# process (GNU time's %M) and the target: under 1.5 GiB per process at
# -np 2.
set -u
b=${1:?usage: sharded_memory.sh BUILDDIR [SIZE]}
size=${2:-536870912}
layout=${3:-rows}
here=$(cd "$(dirname "$0")" && pwd)
command -v /usr/bin/time >/dev/null || { echo "GNU time (package time) is not installed"; exit 77; }
command -v mpirun >/dev/null || { echo "mpirun is not installed"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
gib() { awk '{printf "%.2f GiB", $1 / 1048576}'; }
one=$(/usr/bin/time -f '%M' "$b/shmap" --devices 8 "$here/sharded_memory.shm" "$size" "$layout" 2>&1 >/dev/null | tail -1)
echo "one process: peak resident $(gib <<<"$one")"
out=$(mpirun --oversubscribe --bind-to none -np 2 /usr/bin/time -f 'rss %M' "$b/shmap" --devices 8 \
      "$here/sharded_memory.shm" "$size" "$layout" 2>&1)
grep -q ' True' <<<"$out" || { echo "the step's value is wrong: $out"; exit 1; }
for kb in $(sed -n 's/^rss //p' <<<"$out"); do
  echo "mpirun -np 2, a process: peak resident $(gib <<<"$kb") (target: under 1.5 GiB)"
done
