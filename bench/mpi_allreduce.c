/* MPI_Allreduce of float32 on this machine, for comparison with psum.
 *   mpirun -np N mpi_allreduce ELEMENTS REPS
 * prints: ranks, bytes per rank, seconds per allreduce (slowest rank). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long n = argc > 1 ? atol(argv[1]) : 1;
  int reps = argc > 2 ? atoi(argv[2]) : 10;
  float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
  for (long i = 0; i < n; i++) x[i] = 1.0f;
  for (int w = 0; w < 2; w++) MPI_Allreduce(x, y, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int r = 0; r < reps; r++) MPI_Allreduce(x, y, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  double t = (MPI_Wtime() - t0) / reps, tmax;
  MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) printf("%d %ld %g\n", size, n * 4, tmax);
  free(x);
  free(y);
  MPI_Finalize();
  return 0;
}
