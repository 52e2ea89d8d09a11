#!/usr/bin/env bash
# Runs every benchmark and prints shmap's figures beside NumPy's and Open
# MPI's, measured in the same run on this machine.
#   bench/run.sh [BUILDDIR]      (BUILDDIR holds the shmap binary; default .)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-.}" && pwd)
shmap="$build/shmap"
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

model=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')
mhz=$(grep -m1 'cpu MHz' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')
# NumPy's BLAS here may be Debian's BLIS: give it the kernels shmap picks
# (BLIS 0.9's arch_t numbers), so the products compare like for like.
arch=$("$shmap" --version | sed -n 's/^BLIS architecture: //p')
case "$arch" in
  skx) export BLIS_ARCH_TYPE=${BLIS_ARCH_TYPE:-0} ;;
  haswell) export BLIS_ARCH_TYPE=${BLIS_ARCH_TYPE:-3} ;;
  zen3) export BLIS_ARCH_TYPE=${BLIS_ARCH_TYPE:-6} ;;
  zen2) export BLIS_ARCH_TYPE=${BLIS_ARCH_TYPE:-7} ;;
  zen) export BLIS_ARCH_TYPE=${BLIS_ARCH_TYPE:-8} ;;
esac
echo "machine: $(nproc) cores, ${model:-unknown CPU} at ${mhz:-?} MHz, $(date -u +%F), BLIS kernels ${arch:-?}"
echo
echo "== element-wise, tiny ops, matmul: shmap | NumPy"
"$shmap" --devices 1 "$here/elementwise.shm" > "$tmp/shm.txt"
if "$py" -c 'import numpy' 2>/dev/null; then
  "$py" "$here/elementwise.py" > "$tmp/np.txt"
  OPENBLAS_NUM_THREADS=1 "$py" "$here/elementwise.py" | grep matmul | sed 's/^matmul/matmul-1thread/' >> "$tmp/np.txt"
else
  echo "(python3-numpy not installed: NumPy column empty)" > "$tmp/np.txt"
fi
paste -d'|' "$tmp/shm.txt" "$tmp/np.txt" | column -t -s'|'

echo
echo "== jit against eager: shmap eager | shmap jit | NumPy"
"$shmap" "$here/jit_bench.shm"
if "$py" -c 'import numpy' 2>/dev/null; then "$py" "$here/jit_bench.py"; fi

echo
echo "== row-normalisation of 4096x256: shmap eager | shmap jit | NumPy"
"$shmap" --devices 1 "$here/rownorm.shm"
if "$py" -c 'import numpy' 2>/dev/null; then "$py" "$here/rownorm.py"; fi

echo
echo "== page faults of eager x*y+z (float32), steady state: shmap | NumPy"
"$here/pagefaults.sh" "$shmap"

echo
echo "== value_and_grad of a 2-layer MLP (batch 256, width 1024): shmap eager and jit | NumPy by hand"
"$shmap" --devices 1 "$here/grad_mlp.shm"
if "$py" -c 'import numpy' 2>/dev/null; then "$py" "$here/grad_mlp.py"; fi

echo
echo "== contractions: matrix-vector, vmap(grad) of a linear model, an MLP training step: shmap | NumPy 1 thread | NumPy 2 threads"
"$shmap" --devices 1 "$here/dot_bench.shm"
if "$py" -c 'import numpy' 2>/dev/null; then
  for nt in 1 2; do
    echo "-- NumPy, $nt thread(s)"
    BLIS_NUM_THREADS=$nt OPENBLAS_NUM_THREADS=$nt OMP_NUM_THREADS=$nt "$py" "$here/dot_bench.py"
  done
fi
echo
echo "== the MLP training step (512-1024-512, batch 256): one device, and data-parallel over 8 devices | NumPy 1 thread | NumPy 2 threads"
"$shmap" --devices 1 "$here/train_step.shm" 10 | grep -v -e '^data-parallel' -e '^tutorial'
"$shmap" --devices 8 "$here/train_step.shm" 10 | grep -e '^data-parallel' -e '^tutorial'
if "$py" -c 'import numpy' 2>/dev/null; then
  for nt in 1 2; do
    echo "-- NumPy, $nt thread(s)"
    BLIS_NUM_THREADS=$nt OPENBLAS_NUM_THREADS=$nt OMP_NUM_THREADS=$nt "$py" "$here/train_step.py" 10
  done
fi
echo
echo "== seed 001's network, positional and named (xmap) under each axis_resources, eager and jit"
"$shmap" "$here/xmap_network.shm"

echo
echo "== the same chains in hand-written C (one pass; -O3 -march=native, glibc's vector sinf): one thread | two threads (OpenMP)"
cc -O3 -march=native -ffast-math -fopenmp-simd -o "$tmp/c_loops" "$here/c_loops.c" -lmvec -lm
cc -O3 -march=native -ffast-math -fopenmp -o "$tmp/c_loops_omp" "$here/c_loops.c" -lmvec -lm
"$tmp/c_loops" > "$tmp/c1.txt"
OMP_NUM_THREADS=2 "$tmp/c_loops_omp" | sed 's/^/| 2 threads: /' > "$tmp/c2.txt"
paste -d' ' "$tmp/c1.txt" "$tmp/c2.txt"

echo
echo "== peak memory (maximum resident set): shmap | NumPy, the same scripts"
if [ -x /usr/bin/time ]; then
  peak() { /usr/bin/time -f %M "$@" 2>&1 >/dev/null | tail -1; }
  for b in elementwise jit_bench grad_mlp; do
    dev=(--devices 1); [ $b = jit_bench ] && dev=()
    line="$b: shmap $(peak "$shmap" "${dev[@]}" "$here/$b.shm") KB"
    if "$py" -c 'import numpy' 2>/dev/null; then line="$line | NumPy $(peak "$py" "$here/$b.py") KB"; fi
    echo "$line"
  done
else
  echo "(GNU time not installed: no peak memory figures)"
fi

echo
echo "== start-up against source size (best of 3)"
"$here/startup.sh" "$shmap"

echo
echo "== memcpy bandwidth: one thread | two threads (OpenMP)"
cc -O2 -o "$tmp/memcpy_bw" "$here/memcpy_bw.c"
cc -O2 -fopenmp -o "$tmp/memcpy_bw_omp" "$here/memcpy_bw.c"
echo "memcpy 16 MiB: $("$tmp/memcpy_bw") GB/s | 2 threads $(OMP_NUM_THREADS=2 "$tmp/memcpy_bw_omp") GB/s"

echo
echo "== psum of 16 MiB float32 per device: shmap | in-process pthread all-reduce (a thread per device) | the same by two OpenMP threads | MPI_Allreduce (Open MPI)"
echo "   (GB/s = bytes per device / time; each figure the best of 3 runs)"
cc -O3 -march=native -pthread -o "$tmp/inproc" "$here/inproc_allreduce.c"
cc -O3 -march=native -pthread -fopenmp -o "$tmp/inproc_omp" "$here/inproc_allreduce.c"
inproc_omp() { OMP_NUM_THREADS=2 "$tmp/inproc_omp" "$@"; }
have_mpi=0
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
  mpicc -O2 -o "$tmp/mpi_allreduce" "$here/mpi_allreduce.c" && have_mpi=1
fi
mpi() {
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun --oversubscribe --bind-to none -np "$1" "$tmp/mpi_allreduce" "$2" "$3" 2>/dev/null
}
# best CMD...: runs a command printing "N BYTES SECONDS" 3 times, keeps the fastest
best() {
  for _ in 1 2 3; do "$@"; done | sort -g -k3 | head -1
}
gbs() { awk -v b="$1" -v t="$2" 'BEGIN{printf "%.2f GB/s (%.2f ms)", b/t/1e9, t*1e3}'; }
for n in 2 4 8; do
  read -r _ bytes t < <(best "$shmap" --devices "$n" "$here/psum.shm" "$n" 4194304 10)
  read -r _ ib it < <(best "$tmp/inproc" "$n" 4194304 10)
  read -r _ ob ot < <(best inproc_omp "$n" 4194304 10)
  line="$n devices: shmap psum $(gbs "$bytes" "$t") | in-process $(gbs "$ib" "$it") | 2 OpenMP threads $(gbs "$ob" "$ot")"
  if [ $have_mpi = 1 ]; then
    read -r _ mb mt < <(best mpi "$n" 4194304 10)
    line="$line | MPI_Allreduce $(gbs "$mb" "$mt")"
  fi
  echo "$line"
done

echo
echo "== psum latency of one float32: shmap | in-process pthread all-reduce | the same by two OpenMP threads | MPI_Allreduce (best of 3 runs)"
for n in 2 8; do
  read -r _ _ t < <(best "$shmap" --devices "$n" "$here/psum.shm" "$n" 1 20000)
  read -r _ _ it < <(best "$tmp/inproc" "$n" 1 20000)
  read -r _ _ ot < <(best inproc_omp "$n" 1 20000)
  line=$(awk -v t="$t" -v n="$n" -v i="$it" -v o="$ot" \
    'BEGIN{printf "%d devices: shmap psum %.2f us | in-process %.2f us | 2 OpenMP threads %.2f us", n, t*1e6, i*1e6, o*1e6}')
  if [ $have_mpi = 1 ]; then
    read -r _ _ mt < <(best mpi "$n" 1 20000)
    line="$line | MPI_Allreduce $(awk -v t="$mt" 'BEGIN{printf "%.2f us", t*1e6}')"
  fi
  echo "$line"
done

echo
echo "== all_gather (tiled) of 16 MiB float32 per device: shmap | the whole output written once by memcpy, one thread | two threads"
echo "   (each device receives n blocks; the anchor is one memcpy of n x 16 MiB, the output's size)"
for n in 2 4 8; do
  read -r _ bytes t < <(best "$shmap" --devices "$n" "$here/all_gather.shm" "$n" 4194304 5)
  mib=$((n * bytes >> 20))
  g=$("$tmp/memcpy_bw" "$mib"); g2=$(OMP_NUM_THREADS=2 "$tmp/memcpy_bw_omp" "$mib")
  awk -v n="$n" -v b="$bytes" -v t="$t" -v g="$g" -v g2="$g2" 'BEGIN{
    w = n * b / (g * 1e9); w2 = n * b / (g2 * 1e9);
    printf "%d devices: shmap all_gather %.2f ms | output written once %.2f ms (ratio %.2f) | by 2 threads %.2f ms (ratio %.2f)\n",
           n, t * 1e3, w * 1e3, t / w, w2 * 1e3, t / w2}'
done

echo
echo "== matmul_basic 2048x2048 float32: 2-device mesh | one device (best of 3 runs each)"
for _ in 1 2 3; do "$shmap" --devices 2 "$here/matmul_basic.shm" 2 3; done > "$tmp/mm.txt"
awk 'NR == 1 || $2 < a { a = $2 } NR == 1 || $3 < b { b = $3 } $4 != "True" { ok = "False" }
     END { if (ok == "") ok = "True";
           printf "2 devices %.1f ms | 1 device %.1f ms | speed-up %.2fx (results agree: %s)\n", a*1e3, b*1e3, b/a, ok }' "$tmp/mm.txt"

echo
echo "== seed 000's collective matmul (ring of ppermutes, dynamic_update_slice), 1024^3 float32, 8 devices:"
echo "   ring jit | ring eager | all_gather + matmul jit | one-device matmul (best of 5 calls)"
"$shmap" --devices 8 "$here/collective_matmul.shm" 8 1024 5 > "$tmp/cm.txt"
awk '{ v[$1] = $2; a[$1] = $0 } END {
  printf "ring jit %.1f ms | ring eager %.1f ms | all_gather+matmul %.1f ms | one device %.1f ms\n",
         v["ring_jit"] * 1e3, v["ring_eager"] * 1e3, v["allgather_matmul_jit"] * 1e3, v["one_device_matmul"] * 1e3
  printf "ratio ring jit / one device %.2f, / all_gather+matmul %.2f (%s)\n",
         v["ring_jit"] / v["one_device_matmul"], v["ring_jit"] / v["allgather_matmul_jit"], a["agree"] }' "$tmp/cm.txt"
