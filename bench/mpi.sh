#!/usr/bin/env bash
# shmap's collectives across MPI processes (LANGUAGE.md section 12) beside
# Open MPI's own in a C program, run the same way (mpirun, the same ranks).
#   bench/mpi.sh [BUILDDIR]
# For 2 and 4 processes with 1 and 2 devices each: psum of 16 MiB and of
# one float32 (the latter twice: a loop of psum statements, psum.shm, and
# a jit'ed loop, psum_jit.shm, whose steps are the compiled plan's psum
# with no statement of the interpreter, as the C program's loop has none),
# all_gather and all_to_all of 16 MiB per device, against
# MPI_Allreduce / MPI_Allgather / MPI_Alltoall over as many ranks as shmap
# has devices.  Both run with each process bound to a core (mpirun
# --bind-to core:overload-allowed: several processes share a core when
# there are more than cores), so the scheduler does not move their
# threads between runs.  shmap's and Open MPI's runs are taken in turn, 7 pairs, so
# a drift of the machine's load touches both; each figure is the median of
# its 7 runs, and the comparison the median over the pairs of the ratio
# (16 MiB) or of the difference (one float).  On a machine with fewer
# cores than processes x devices the figures are mostly turns of the
# scheduler: the medians are what to quote, the spread says how noisy.
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
run() { local np=$1; shift; mpirun --oversubscribe --bind-to core:overload-allowed -np "$np" "$@" 2>/dev/null; }
# median of the numbers on standard input
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
# pair NP N SCRIPT ELEMENTS REPS OP: shmap's and Open MPI's median seconds,
# the median pair ratio and the median pair difference
pair() {
  local np=$1 n=$2 script=$3 elems=$4 reps=$5 op=$6 a b
  : > "$tmp/pairs"
  for _ in 1 2 3 4 5 6 7; do
    read -r _ _ a < <(run "$np" "$shmap" --devices "$n" "$here/$script" "$n" "$elems" "$reps")
    read -r _ _ _ b < <(run "$n" "$tmp/mpi_collectives" "$op" "$elems" "$reps")
    echo "$a $b" >> "$tmp/pairs"
  done
  echo "$(cut -d' ' -f1 "$tmp/pairs" | median) $(cut -d' ' -f2 "$tmp/pairs" | median)" \
       "$(awk '{print $1 / $2}' "$tmp/pairs" | median)" \
       "$(awk '{print $1 - $2}' "$tmp/pairs" | median)"
}
us() { awk -v t="$1" 'BEGIN{printf "%.1f us", t*1e6}'; }
ms() { awk -v t="$1" 'BEGIN{printf "%.2f ms", t*1e3}'; }
gap() { awk -v t="$1" 'BEGIN{printf "%+.1f us", t*1e6}'; }
ratio() { awk -v r="$1" 'BEGIN{printf "%.2fx", r}'; }
big=4194304   # 16 MiB of float32
echo "processes x devices: shmap | Open MPI over as many ranks, medians (median pair ratio or difference)"
for np in 2 4; do
  for d in 1 2; do
    n=$((np * d))
    read -r t1 r1 q1 _ < <(pair "$np" "$n" psum.shm "$big" 10 allreduce)
    read -r t2 r2 _ g2 < <(pair "$np" "$n" psum.shm 1 4000 allreduce)
    read -r t5 r5 _ g5 < <(pair "$np" "$n" psum_jit.shm 1 4000 allreduce)
    read -r t3 r3 q3 _ < <(pair "$np" "$n" all_gather.shm "$big" 10 allgather)
    read -r t4 r4 q4 _ < <(pair "$np" "$n" all_to_all.shm "$big" 10 alltoall)
    echo "$np x $d: psum 16 MiB $(ms "$t1") | $(ms "$r1") ($(ratio "$q1"));" \
         "psum 1 float $(us "$t2") | $(us "$r2") ($(gap "$g2"));" \
         "jit'ed $(us "$t5") | $(us "$r5") ($(gap "$g5"));" \
         "all_gather 16 MiB $(ms "$t3") | $(ms "$r3") ($(ratio "$q3"));" \
         "all_to_all 16 MiB $(ms "$t4") | $(ms "$r4") ($(ratio "$q4"))"
  done
done
