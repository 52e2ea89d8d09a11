#!/usr/bin/env bash
# shmap's collectives across MPI processes (LANGUAGE.md section 12) beside
# Open MPI's own in a C program, run the same way (mpirun, the same ranks).
#   bench/mpi.sh [BUILDDIR]
# For 2 and 4 processes with 1 and 2 devices each: psum of 16 MiB and of
# one float32, all_gather and all_to_all of 16 MiB per device, against
# MPI_Allreduce / MPI_Allgather / MPI_Alltoall over as many ranks as shmap
# has devices.  Each figure is the best of 5 runs, shmap's and Open MPI's
# taken in turn (a drift of the machine's load then touches both).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-.}" && pwd)
shmap="$build/shmap"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
command -v mpicc >/dev/null && command -v mpirun >/dev/null ||
  { echo "(openmpi-bin and libopenmpi-dev not installed: no MPI figures)"; exit 0; }
"$shmap" --version | grep -q '^MPI: Open MPI' || { echo "(shmap built without MPI)"; exit 0; }
mpicc -O2 -o "$tmp/mpi_collectives" "$here/mpi_collectives.c"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() { local np=$1; shift; mpirun --oversubscribe --bind-to none -np "$np" "$@" 2>/dev/null; }
# pair NP N SCRIPT ELEMENTS REPS OP: shmap's and Open MPI's best seconds
pair() {
  local np=$1 n=$2 script=$3 elems=$4 reps=$5 op=$6 a b best_a= best_b=
  for _ in 1 2 3 4 5; do
    read -r _ _ a < <(run "$np" "$shmap" --devices "$n" "$here/$script" "$n" "$elems" "$reps")
    read -r _ _ _ b < <(run "$n" "$tmp/mpi_collectives" "$op" "$elems" "$reps")
    best_a=$(awk -v x="$a" -v y="${best_a:-$a}" 'BEGIN{print (x < y ? x : y)}')
    best_b=$(awk -v x="$b" -v y="${best_b:-$b}" 'BEGIN{print (x < y ? x : y)}')
  done
  echo "$best_a $best_b"
}
us() { awk -v t="$1" 'BEGIN{printf "%.1f us", t*1e6}'; }
ms() { awk -v t="$1" 'BEGIN{printf "%.2f ms", t*1e3}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2fx", a/b}'; }
big=4194304   # 16 MiB of float32
echo "processes x devices: shmap | Open MPI over as many ranks (ratio)"
for np in 2 4; do
  for d in 1 2; do
    n=$((np * d))
    read -r t1 r1 < <(pair "$np" "$n" psum.shm "$big" 10 allreduce)
    read -r t2 r2 < <(pair "$np" "$n" psum.shm 1 4000 allreduce)
    read -r t3 r3 < <(pair "$np" "$n" all_gather.shm "$big" 10 allgather)
    read -r t4 r4 < <(pair "$np" "$n" all_to_all.shm "$big" 10 alltoall)
    echo "$np x $d: psum 16 MiB $(ms "$t1") | $(ms "$r1") ($(ratio "$t1" "$r1"));" \
         "psum 1 float $(us "$t2") | $(us "$r2");" \
         "all_gather 16 MiB $(ms "$t3") | $(ms "$r3") ($(ratio "$t3" "$r3"));" \
         "all_to_all 16 MiB $(ms "$t4") | $(ms "$r4") ($(ratio "$t4" "$r4"))"
  done
done
