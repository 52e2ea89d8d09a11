/* Open MPI's own collectives on this machine, the anchor for shmap's
 * collectives across processes (LANGUAGE.md section 12).
 *   mpirun -np P mpi_collectives OP ELEMENTS REPS
 * OP: allreduce | allgather | alltoall.  ELEMENTS float32 per rank (for
 * allgather each rank's block; for alltoall each rank's whole send buffer).
 * prints: OP, ranks, bytes per rank, seconds per call (slowest rank). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void run(const char *op, float *x, float *y, long n, int size) {
  if (!strcmp(op, "allreduce"))
    MPI_Allreduce(x, y, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  else if (!strcmp(op, "allgather"))
    MPI_Allgather(x, (int)n, MPI_FLOAT, y, (int)n, MPI_FLOAT, MPI_COMM_WORLD);
  else
    MPI_Alltoall(x, (int)(n / size), MPI_FLOAT, y, (int)(n / size), MPI_FLOAT, MPI_COMM_WORLD);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const char *op = argc > 1 ? argv[1] : "allreduce";
  long n = argc > 2 ? atol(argv[2]) : 1;
  int reps = argc > 3 ? atoi(argv[3]) : 10;
  long out = !strcmp(op, "allgather") ? n * size : n;
  float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)out);
  for (long i = 0; i < n; i++) x[i] = 1.0f;
  for (int w = 0; w < 2; w++) run(op, x, y, n, size);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int r = 0; r < reps; r++) run(op, x, y, n, size);
  double t = (MPI_Wtime() - t0) / reps, tmax;
  MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) printf("%s %d %ld %g\n", op, size, n * 4, tmax);
  free(x);
  free(y);
  MPI_Finalize();
  return 0;
}
