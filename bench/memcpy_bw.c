/* memcpy bandwidth of this machine, one thread: the ceiling for moving a
 * block between device threads.  Prints GB/s for a 16 MiB copy. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    memcpy(b, a, n);
    a[i] = b[n - 1 - i];
  }
  double t = (now() - t0) / reps;
  printf("%.2f\n", n / t / 1e9);
  free(a);
  free(b);
  return 0;
}
