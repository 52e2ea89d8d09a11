/*
 * lapack.h - the kernels of the factorisation primitives (lu,
 * triangular_solve, cholesky, eigh, svd, qr), computed by LAPACK's
 * Fortran interface (Debian's liblapack, its BLAS's trsm).  Their rules
 * (shape, batching, JVP, cost) are in prim_linalg.c.
 *
 * Semantics: jax.lax.linalg (jax/_src/lax/linalg.py), whose CPU lowering
 * calls the same LAPACK routines:
 *   lu(a)               getrf: lu (..., m, n), pivots (..., min(m, n))
 *                       int32 (0-based row swaps), permutation (..., m)
 *                       int32, a[..., permutation, :] == L @ U
 *   triangular_solve(a, b)  trsm: params left_side, lower, transpose_a,
 *                       conjugate_a (no effect on real dtypes),
 *                       unit_diagonal; op(a) x = b (left_side) or
 *                       x op(a) = b; a (..., m, m)
 *   cholesky(a)         potrf, lower: L (..., n, n) with zeros above the
 *                       diagonal; a matrix that is not positive definite
 *                       gives NaNs, as JAX's
 *   eigh(a)             syevd: v (..., n, n) (eigenvectors in columns),
 *                       w (..., n) ascending; param lower: the triangle read
 *   svd(a)              gesdd: s (..., k), u (..., m, m | k), vt (..., n |
 *                       k, n) by param full_matrices; k = min(m, n)
 *   qr(a)               geqrf + orgqr: q (..., m, m | k), r (..., m | k, n)
 *                       by param full_matrices
 * Operands are float32 or float64 (the shape rules refuse others), with
 * any number of leading batch dimensions that every operand shares: the
 * kernel loops over them, one LAPACK call per matrix, after copying the
 * matrix into a column-major work buffer (LAPACK's layout) and back.
 * A singular matrix is no error: LAPACK's results are kept (lu's zero
 * pivots, trsm's inf and NaN), as in JAX.  Outputs are allocated by the
 * kernel when out[i] is NULL, else written into (contiguous, fresh).
 * Errors: out of memory; a LAPACK argument error (a bug) as ValueError.
 * Thread-safe: reference LAPACK keeps no state, each call has its own
 * work buffers.
 */
#ifndef SHMAP_LAPACK_H
#define SHMAP_LAPACK_H

#include "array/prim.h"

/* The kernels (prim.h Kernel contract), one per primitive. */
int lapack_kernel_lu(Array **in, int nin, const Params *p, Array **out);
int lapack_kernel_triangular_solve(Array **in, int nin, const Params *p, Array **out);
int lapack_kernel_cholesky(Array **in, int nin, const Params *p, Array **out);
int lapack_kernel_eigh(Array **in, int nin, const Params *p, Array **out);
int lapack_kernel_svd(Array **in, int nin, const Params *p, Array **out);
int lapack_kernel_qr(Array **in, int nin, const Params *p, Array **out);

#endif
