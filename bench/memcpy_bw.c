/* memcpy bandwidth of this machine, one thread: the ceiling for moving a
 * block between device threads.  Prints GB/s for a 16 MiB copy.  Built
 * with -fopenmp (run.sh, OMP_NUM_THREADS=2) it is the two-thread twin:
 * each thread copies its part of the block. */
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

int main(void) {
  size_t n = 16u << 20;
  char *a = malloc(n), *b = malloc(n);
  if (!a || !b) return 1;
  memset(a, 1, n);
  memset(b, 2, n);
  int reps = 50;
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
