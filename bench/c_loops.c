/* bench/c_loops.c - the hand-written C anchors for shmap's element-wise
 * and fused figures: the same chains over 10^7 float32, one pass each,
 * compiled -O3 -march=native -ffast-math -fopenmp-simd, so GCC calls
 * glibc's vector sinf (libmvec) and sums with vector partial sums, as
 * shmap's fused loops do.  Built again with -fopenmp (run.sh, with
 * OMP_NUM_THREADS=2) it is the two-thread twin: each loop split over the
 * threads by OpenMP's static schedule, the sum's partials added at the
 * end, as shmap's kernels use both cores from 2^20 elements.
 * Prints "name value unit" lines like bench/elementwise.shm. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define N 10000000

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Defeats dead-code elimination of the measured loops. */
static volatile float sink;

/* The loops' split over threads in the OpenMP twin; nothing in the
 * one-thread build (-fopenmp-simd leaves _OPENMP undefined). */
#ifdef _OPENMP
#define PAR_FOR _Pragma("omp parallel for schedule(static)")
#define PAR_SUM _Pragma("omp parallel for schedule(static) reduction(+ : s)")
#else
#define PAR_FOR
#define PAR_SUM
#endif

static void triad(float *o, const float *x, const float *y, const float *z) {
  PAR_FOR
  for (long i = 0; i < N; i++) o[i] = x[i] * y[i] + z[i];
}

static void sin_chain(float *o, const float *x) {
  PAR_FOR
  for (long i = 0; i < N; i++) o[i] = sinf(x[i]) * 3.f + x[i];
}

static float fused_sum(const float *x, const float *y) {
  float s = 0;
  PAR_SUM
  for (long i = 0; i < N; i++) s += x[i] + sinf(y[i]) * 3.f - x[i] * y[i];
  return s;
}

/* Best time of [reps] runs of [body], in seconds. */
#define BEST(reps, body)                         \
  ({                                             \
    double best_ = 1e30;                         \
    for (int r_ = 0; r_ < (reps); r_++) {        \
      double t0_ = now();                        \
      body;                                      \
      double t_ = now() - t0_;                   \
      if (t_ < best_) best_ = t_;                \
    }                                            \
    best_;                                       \
  })

int main(void) {
  float *x = aligned_alloc(64, N * sizeof(float)), *y = aligned_alloc(64, N * sizeof(float));
  float *z = aligned_alloc(64, N * sizeof(float)), *o = aligned_alloc(64, N * sizeof(float));
  if (!x || !y || !z || !o) return 1;
  for (long i = 0; i < N; i++) {
    x[i] = (float)i / N;
    y[i] = 0.5f;
    z[i] = 0.25f;
  }
  double t = BEST(20, triad(o, x, y, z));
  printf("x*y+z %.3f ns/element\n", t / N * 1e9);
  t = BEST(10, sin_chain(o, x));
  printf("sin(x)*3.+x %.3f ns/element\n", t / N * 1e9);
  sink = o[N / 2];
  t = BEST(10, sink = fused_sum(x, y));
  printf("sum(x+sin(y)*3.-x*y) %.2f ms\n", t * 1e3);
  free(x), free(y), free(z), free(o);
  return 0;
}
