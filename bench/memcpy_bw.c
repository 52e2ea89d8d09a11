/* memcpy bandwidth of this machine, one thread: the ceiling for moving a
 * block between device threads.  Prints GB/s for a copy of MIB mebibytes
 * (argument; default 16).  Built with -fopenmp (run.sh,
 * OMP_NUM_THREADS=2) it is the two-thread twin: each thread copies its
 * part of the block.  A copy that fits in the last-level cache measures
 * the cache, not memory: the all_gather anchor copies the whole output's
 * size for that reason. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  size_t n = (size_t)(argc > 1 ? atoi(argv[1]) : 16) << 20;
  if (n == 0) return 1;
  char *a = malloc(n), *b = malloc(n);
  if (!a || !b) return 1;
  memset(a, 1, n);
  memset(b, 2, n);
  int reps = (int)((800u << 20) / n) + 2;
  double t0 = now();
  for (int i = 0; i < reps; i++) {
#ifdef _OPENMP
#pragma omp parallel
    {
      size_t nt = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
      size_t lo = n / nt * t, hi = t + 1 == nt ? n : n / nt * (t + 1);
      memcpy(b + lo, a + lo, hi - lo);
    }
#else
    memcpy(b, a, n);
#endif
    a[i] = b[n - 1 - i];
  }
  double t = (now() - t0) / reps;
  printf("%.2f\n", n / t / 1e9);
  free(a);
  free(b);
  return 0;
}
