/*
 * linalg.h - contractions: the dot_general primitive, computed by BLIS.
 *
 * Semantics: jax.lax.dot_general.  Parameters (prim.h Params):
 *   dimension_numbers      ((lhs_contracting, rhs_contracting),
 *                           (lhs_batch, rhs_batch)), each a tuple of ints
 *   preferred_element_type a dtype value, or None / absent
 * The result's dims are the batch dims (in lhs_batch order), then the lhs
 * free dims, then the rhs free dims, each in their operand's order, as in
 * JAX.  Its dtype is preferred_element_type when given, else the operands'
 * (promoted as jnp would if they differ).
 *
 * Arithmetic.  f32 and f64 go through BLIS's sgemm/dgemm, one call per
 * batch element in one loop of the kernel (shared with the spare core, a
 * whole product on each thread), reading the operands in place when each
 * group of dims (free, contracting) collapses to one positive stride, else
 * after packing them into [batch, rows, cols] buffers.  Products with
 * nothing contracted (outer products, vmap's per-example gradients) are a
 * plain loop, each element 0 + a b as BLIS's would be.  bf16 and f16 are computed in f32
 * and rounded once at the end, as XLA on CPU does.  Integers and bools are
 * computed in int64 by a C loop (so i32 results wrap as XLA's do); a bool
 * result is true when any product is.
 *
 * Vector products (an output of one row or one column) go through BLIS's
 * gemv, one element through its dotv: no panels are packed for them.
 *
 * Threads.  BLIS runs one thread per call (la_init).  A float product of
 * 2^21 multiply-adds or more is cut into up to 8 pieces of C's rows or
 * columns (at least 256 each, cut at multiples of 64; vector products
 * stay whole) that the caller and kern_parallel's helper take in turn,
 * when a core is spare: the process's cores (its affinity mask) are at
 * least twice the shard_map devices running (la_set_busy_devices, at
 * least 1) times this node's processes (la_set_node_processes).  So the
 * host thread and a plain jit use both cores, and a shard_map body with
 * as many devices as cores one each.  A piece is cut only where BLIS
 * stays on its large-matrix path, which sums each element over k in one
 * order wherever C is cut: results are the same bits at any thread
 * count.  BLIS's typed API is thread-safe: device threads call the
 * kernel concurrently.
 */
#ifndef SHMAP_LINALG_H
#define SHMAP_LINALG_H

#include "array/prim.h"

/*
 * Shape rule of dot_general (prim.h ShapeRule): from the two operand avals
 * [in] and the parameters [p], writes the output aval to [out].  Returns 0,
 * or -1 with ERR_VALUE / ERR_TYPE errors worded as JAX's, e.g.
 *   "dot_general requires contracting dimensions to have the same shape,
 *    got (3,) and (4,)"
 * (also: dimension numbers out of range, repeated, overlapping batch and
 * contracting dims, batch counts or shapes that differ, malformed
 * dimension_numbers, preferred_element_type not a dtype).
 */
int la_shape_dot_general(const AVal *in, int nin, const Params *p, AVal *out);

/*
 * Kernel of dot_general (prim.h Kernel): [in] are the two operands (any
 * layout: views with any strides are fine), [out][0] the result, either
 * allocated by the caller (C-contiguous, the shape rule's shape and dtype)
 * or NULL, in which case a new array is stored there.  Returns 0, or -1
 * with the error set (bad parameters, out of memory).
 */
int la_kernel_dot_general(Array **in, int nin, const Params *p, Array **out);

/*
 * Reading an operand through a transpose: for dot_general with parameters
 * [p] whose operand [operand] (0 lhs, 1 rhs) is transpose(a, [perm]) of a
 * rank-[ndim] array a, the parameters of the same product reading a
 * itself: contracting and batch dims mapped through [perm].  Only when
 * the operand's free dims keep their order through [perm], so that the
 * result is the same array; the kernel reads a's strides in place, as it
 * does eagerly, where a transpose is a view.  Returns 1 with [out] filled
 * (owned by the caller, params_clear), 0 when it does not apply (also for
 * malformed parameters, left to the product's own checks), -1 on out of
 * memory.
 */
int la_dot_through_transpose(const Params *p, int operand, int ndim, const int64_t *perm,
                             Params *out);

/*
 * Prepares BLIS; call once from main() before any thread starts and before
 * any other BLIS call.  Sets BLIS to one thread.  When the environment does
 * not set BLIS_ARCH_TYPE, chooses the kernels from the CPU's features and
 * sets BLIS_ARCH_TYPE (BLIS 0.9 reads it once, as a number, at its own
 * initialisation): AVX-512 (F, DQ, CD, BW, VL) -> skx, AMD Zen 1/2/3 ->
 * zen/zen2/zen3, AVX2 with FMA -> haswell, else BLIS's own choice.  BLIS's
 * own detection can pick slower kernels than the CPU runs (on a virtual
 * Xeon it picks haswell at ~115 GFLOP/s for a 2048^3 sgemm where skx does
 * ~195).  Setting BLIS_ARCH_TYPE yourself overrides this choice.
 */
void la_init(void);

/* The number of shard_map devices now running bodies, [n] (0 when the
 * call ended): their contractions share the cores.  Set by the device
 * pool around each call; any thread. */
void la_set_busy_devices(int n);

/* The number of processes on this node sharing its cores, [n] >= 1 (set
 * once under mpirun, before the devices start). */
void la_set_node_processes(int n);

/* The name of the kernels BLIS runs ("skx", "haswell", "generic", ...),
 * for --version and --verbose.  Static string. */
const char *la_blis_arch(void);

#endif
