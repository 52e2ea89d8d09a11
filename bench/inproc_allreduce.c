/* The ceiling for psum on this machine: a plain in-process all-reduce of
 * float32 by N pthreads, with nothing of shmap's (no interpreter, no
 * matching, no checks).  Each thread owns an input of ELEMENTS floats;
 * thread j sums the j-th 1/N of all inputs into one shared output, then
 * all meet at a barrier, so the result is readable by every thread.
 *   inproc_allreduce N ELEMENTS REPS
 * prints: threads, bytes per thread, seconds per all-reduce.
 * Built with -fopenmp (run.sh, OMP_NUM_THREADS=2) it is the two-thread
 * twin: the same N inputs summed into one output by OpenMP's threads
 * (as many as the machine has cores, not one per device), each taking
 * its part of the output; the implicit barrier ends an all-reduce. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define MAXT 64

static int nthreads, reps;
static long elems;
static float *in[MAXT], *out;
#ifndef _OPENMP
static pthread_barrier_t bar;   /* the pthread all-reduce's meeting point */
#endif
static double seconds;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* out[lo, hi) = in[0][lo, hi) + ... + in[n-1][lo, hi), 4 KiB at a time. */
static void reduce_part(long lo, long hi) {
  enum { CHUNK = 1024 };
  for (long c = lo; c < hi; c += CHUNK) {
    long e = c + CHUNK < hi ? c + CHUNK : hi;
    for (long i = c; i < e; i++) out[i] = in[0][i];
    for (int p = 1; p < nthreads; p++)
      for (long i = c; i < e; i++) out[i] += in[p][i];
  }
}

#ifndef _OPENMP
static void *run(void *arg) {
  int j = (int)(long)arg;
  long lo = elems * j / nthreads & ~15L;
  long hi = j == nthreads - 1 ? elems : elems * (j + 1) / nthreads & ~15L;
  double t0 = 0;
  for (int r = -2; r < reps; r++) {  /* two warm-up rounds */
    pthread_barrier_wait(&bar);
    if (r == 0) t0 = now();
    reduce_part(lo, hi);
  }
  pthread_barrier_wait(&bar);
  if (j == 0) seconds = (now() - t0) / reps;
  return NULL;
}
#endif

#ifdef _OPENMP
/* The all-reduce of the N inputs by OpenMP's threads, [reps] times after
 * two warm-up rounds: seconds per all-reduce. */
static double run_omp(void) {
  double t0 = 0;
  for (int r = -2; r < reps; r++) {
    if (r == 0) t0 = now();
#pragma omp parallel
    {
      long nt = omp_get_num_threads(), j = omp_get_thread_num();
      long lo = elems * j / nt & ~15L, hi = j == nt - 1 ? elems : elems * (j + 1) / nt & ~15L;
      reduce_part(lo, hi);
    }
  }
  return (now() - t0) / reps;
}
#endif

int main(int argc, char **argv) {
  nthreads = argc > 1 ? atoi(argv[1]) : 2;
  elems = argc > 2 ? atol(argv[2]) : 1;
  reps = argc > 3 ? atoi(argv[3]) : 10;
  if (nthreads < 1 || nthreads > MAXT || elems < 1 || reps < 1) {
    fprintf(stderr, "usage: inproc_allreduce N ELEMENTS REPS\n");
    return 2;
  }
  size_t bytes = ((size_t)elems * 4 + 63) / 64 * 64;
  out = aligned_alloc(64, bytes);
  for (int t = 0; t < nthreads; t++) {
    in[t] = aligned_alloc(64, bytes);
    if (!in[t] || !out) return 1;
    for (long i = 0; i < elems; i++) in[t][i] = 1.0f;
  }
#ifdef _OPENMP
  seconds = run_omp();
#else
  pthread_barrier_init(&bar, NULL, (unsigned)nthreads);
  pthread_t th[MAXT];
  for (int t = 0; t < nthreads; t++) pthread_create(&th[t], NULL, run, (void *)(long)t);
  for (int t = 0; t < nthreads; t++) pthread_join(th[t], NULL);
#endif
  if (out[elems - 1] != (float)nthreads) return 1;
  printf("%d %ld %g\n", nthreads, elems * 4, seconds);
  for (int t = 0; t < nthreads; t++) free(in[t]);
  free(out);
  return 0;
}
