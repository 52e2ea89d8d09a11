/*
 * kernels.h - the kernels behind the primitive table (prim.c), and the few
 * loops array.c borrows from them.
 *
 * Every kernel has the Kernel signature of prim.h and is named kern_<the
 * jax.lax name>.  Contract with prim_apply:
 *
 *   - Elementwise (PK_UNARY, PK_BINARY) and reduction (PK_REDUCE) kernels
 *     receive outputs already allocated, C-contiguous, of the shape and
 *     dtype the shape rule gave.  An elementwise output may be the very
 *     array of an operand (in-place reuse), so these loops read element i
 *     of every operand before writing element i of the output and never
 *     look back.
 *   - Layout kernels (PK_SHAPE) may make their result a view of the
 *     operand (broadcast_in_dim, reshape of contiguous data, transpose,
 *     squeeze, expand_dims, rev, slice, dynamic_slice), as NumPy does.  So
 *     prim_apply calls them with out[0] == NULL and they store a new
 *     reference there.  Called with out[0] already allocated (by a plan
 *     executor that preallocates), they write into it instead.
 *
 * Layout.  Loops are specialised per dtype by macros; bf16 and f16 are
 * computed through f32.  gcc vectorises the contiguous loops (hot ones
 * are compiled for x86-64-v4 (AVX-512), v3 (AVX2+FMA) and baseline x86-64
 * and picked at load time).  Elementwise loops of 2^20 elements or more
 * are split between the caller and one helper thread when that helper is
 * free (one caller at a time; concurrent device threads run serially);
 * SHMAP_SERIAL_KERNELS=1 in the environment turns the helper off.
 *
 * Integer division by zero yields 0 and INT_MIN / -1 yields INT_MIN
 * (remainder 0) instead of trapping; XLA leaves both undefined.  Float to
 * integer conversion saturates and sends NaN to 0, as XLA's CPU backend.
 *
 * Errors: kernels trust the shape rule; they only fail on out of memory.
 */
#ifndef SHMAP_KERNELS_H
#define SHMAP_KERNELS_H

#include "array/prim.h"

/* Hot loops are compiled three times (AVX-512, AVX2+FMA, baseline x86-64)
 * and the best for the CPU is chosen when the program loads.  Sanitizer
 * runtimes are not initialised when ifunc resolvers run, so sanitized
 * builds (and other CPUs) use the default code only. */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define KERN_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KERN_CLONES
#endif

/* ---- contractions: provided by linalg.c (linalg.h) ----------------------- */
int la_shape_dot_general(const AVal *in, int nin, const Params *p, AVal *out);
int la_kernel_dot_general(Array **in, int nin, const Params *p, Array **out);

/* ---- loops shared with array.c -------------------------------------------- */

/* Converts [n] contiguous elements of dtype [st] at [src] to dtype [dt] at
 * [dst] (the two must not overlap unless equal in size and address).
 * NumPy's astype semantics, with XLA's saturating float-to-int: NaN gives
 * 0, out-of-range values the nearest representable integer; any nonzero
 * (and NaN) gives True. */
void kern_convert(void *dst, DType dt, const void *src, DType st, int64_t n);

/* Copies [a] (any layout) into the contiguous buffer [dst] of the same
 * dtype, in row-major order of a's logical shape. */
void kern_copy_to_contiguous(void *dst, const Array *a);

/* For kernels: arr_contiguous (a new reference to [a] when contiguous,
 * else a contiguous copy), with the copy stopped at Ctrl-C (looked at
 * every KERN_CHUNK elements): the copy is then partial, and the kernel's
 * primitive fails with "interrupted" (prim_run_kernel).  NULL when out of
 * memory. */
Array *kern_contiguous(Array *a);

/* memmove of [n] bytes; when [dst] and [src] do not overlap, in chunks of
 * KERN_CHUNK bytes with a look at Ctrl-C before each, the rest left
 * undone at Ctrl-C (for kernels, as kern_contiguous). */
void kern_move_polled(void *dst, const void *src, size_t n);

/* Walks the rows of an N-d iteration space for up to KERN_ITER_MAXOPS
 * operands with their own strides and offsets (in elements).  Size-1
 * dimensions are dropped and dimensions every operand walks contiguously
 * are merged, so a row ([inner] elements, operand k stepping by
 * inner_stride[k]) is as long as possible.  Use:
 *     kern_iter_init(&it, ndim, shape, nops, strides, offsets);
 *     for (bool more = !it.done; more; more = kern_iter_next(&it))
 *       row(it.off[k], it.inner_stride[k], it.inner);
 */
#define KERN_ITER_MAXOPS 4
typedef struct KernIter {
  int ndim, nops;                   /* dims after merging (>= 1), operands */
  bool done;                        /* nothing (left) to visit */
  int64_t inner;                    /* row length */
  int64_t inner_stride[KERN_ITER_MAXOPS];
  int64_t off[KERN_ITER_MAXOPS];    /* current row start per operand */
  int64_t shape[SHM_MAXDIM], idx[SHM_MAXDIM];
  int64_t strides[KERN_ITER_MAXOPS][SHM_MAXDIM];
} KernIter;
void kern_iter_init(KernIter *it, int ndim, const int64_t *shape, int nops,
                    const int64_t *const *strides, const int64_t *offsets);
/* Advances to the next row; false (and done set) after the last. */
bool kern_iter_next(KernIter *it);

/* ---- elementwise (kern_elementwise.c) --------------------------------------- */
/* The kernels of prim.def's rows whose kernel column is ROW1, ROW2 or
 * OWN: kern_<name>, the Kernel contract of prim.h. */
#define KERN_DECL(name) int kern_##name(Array **in, int nin, const Params *p, Array **out);
#define KERN_DECL_ROW1 KERN_DECL
#define KERN_DECL_ROW2 KERN_DECL
#define KERN_DECL_OWN KERN_DECL
#define KERN_DECL_NONE(name)
#define PRIM(id, nm, ni, no, k, kn) KERN_DECL_##kn(nm)
#include "array/prim.def"
#undef PRIM

/* X(name) for each row whose kernel is made from unary (ROW1) or binary
 * (ROW2) row loops, in prim.def's order. */
#define KERN_PICK_ROW1_ROW1(X, nm) X(nm)
#define KERN_PICK_ROW1_ROW2(X, nm)
#define KERN_PICK_ROW1_OWN(X, nm)
#define KERN_PICK_ROW1_NONE(X, nm)
#define KERN_PICK_ROW2_ROW1(X, nm)
#define KERN_PICK_ROW2_ROW2(X, nm) X(nm)
#define KERN_PICK_ROW2_OWN(X, nm)
#define KERN_PICK_ROW2_NONE(X, nm)

/* The row loop (prim.h) behind binary elementwise kernel [k] (kern_add,
 * kern_lt, ...) for operands of dtype [t], its output of the kernel's
 * output dtype.  NULL when [k] is not a ROW2 kernel, when [t]
 * is refused, or for bf16/f16 (computed through f32 by the kernel). */
KernRow2 kern_binary_row(Kernel k, DType t);
/* The same for a unary elementwise kernel without parameters (kern_neg,
 * kern_sin, ...) or kern_convert_element_type, from dtype [t] to [to].
 * NULL for any other kernel, a refused dtype, bf16/f16. */
KernRow1 kern_unary_row(Kernel k, DType t, DType to);

/* Outer products of a column and contiguous rows: c[i n + j] = 0 +
 * a[i as] b[i bs + j] for i < m, j < n, c row-major and not overlapping a
 * or b.  With bs = 0 it is one outer product (row i of C is a[i as] times
 * b); with bs the stride between rows of b, a batch of k = 1 products of
 * a single row each (batch element i's row of C is a[i as] times its own
 * row of b).  Each element is the one product BLAS's k = 1 sum gives (a
 * product of -0 comes out +0), vectorised along the row. */
void kern_outer_f32(const float *a, int64_t as, const float *b, int64_t bs, float *c, int64_t m,
                    int64_t n);
void kern_outer_f64(const double *a, int64_t as, const double *b, int64_t bs, double *c,
                    int64_t m, int64_t n);

/* ---- reductions and scans (kern_reduce.c) ----------------------------------- */

/* ---- layout, creation and indexing (kern_shape.c) --------------------------- */

/* Reads pad's padding_config [cfg] (a tuple of (lo, hi, interior) int
 * triples, one per dimension of a rank-[ndim] operand).  -1 with an
 * ERR_VALUE error when malformed. */
int kern_padding_config(Value *cfg, int ndim, int64_t *lo, int64_t *hi, int64_t *it);

/* Sum of [n] contiguous float32s by NumPy-style pairwise blocking (error
 * grows like log n, not n).  Exposed for tests and for mean-like callers. */
float kern_sum_f32(const float *x, int64_t n);
double kern_sum_f64(const double *x, int64_t n);

/* Splitting a large loop over two cores (kern_elementwise.c): a helper
 * thread and the caller take ranges of it in turn, since element-wise
 * work over 10^7 elements is bound by one core's memory bandwidth; when
 * the other core is busy the caller takes more ranges and does not wait
 * for a helper that has not started.  Only one caller uses the helper at
 * a time; the others (such as concurrent device threads) run serially,
 * so the machine is never oversubscribed.  fn(ctx, lo, hi) covers [0, n)
 * once, in ranges starting at multiples of [align] (about 64 of them)
 * when n >= [min] and the helper is free, else in one pass with Ctrl-C
 * looked at between chunks of 4 Mi; a split loop looks at Ctrl-C between
 * ranges.  [fn] runs on two threads at once, on any number of ranges
 * each: what it writes must be disjoint per range and must not depend on
 * which thread ran a range, and it cannot report errors (the helper's
 * error state is its own). */
typedef void (*RangeFn)(const void *ctx, int64_t lo, int64_t hi);
/* Elements between two looks at Ctrl-C in a long serial loop: 4 Mi (tens
 * of milliseconds at most). */
#define KERN_CHUNK ((int64_t)1 << 22)
/* Elements between two looks at Ctrl-C in a serial loop whose element
 * costs a hash or a polynomial (random bits, erf_inv): 1 Mi. */
#define KERN_CHUNK_SLOW ((int64_t)1 << 20)
/* for (i = lo; i < hi; i++) in chunks of [chunk], looking at Ctrl-C
 * before each and leaving the loop when it came: the kernel's primitive
 * then fails with "interrupted" (prim_run_kernel), so the elements left
 * unwritten are never seen.  The inner loop keeps a plain bound, so it
 * vectorises as the unchunked one did. */
#define KERN_FOR_POLLED(i, lo, hi, chunk)                                          \
  for (int64_t i##_lo = (lo), i##_hi = (hi); i##_lo < i##_hi && !shm_interrupt_pending(); \
       i##_lo += (chunk))                                                           \
    for (int64_t i = i##_lo, i##_end = i##_hi - i##_lo < (chunk) ? i##_hi : i##_lo + (chunk); \
         i < i##_end; i++)
void kern_parallel(RangeFn fn, const void *ctx, int64_t n, int64_t min, int64_t align);
/* Elements below which a second core costs more than it brings. */
#define KERN_PAR_MIN ((int64_t)1 << 20)

/* Float32 sin, cos, exp and log over [n] contiguous elements, vectorised
 * (range reduction and minimax polynomials, within 2 ulp over the whole
 * range; large sin/cos arguments fall back to libm).  [y] may equal [x].
 * Each element's result depends on its argument alone, never on its
 * neighbours or on how a caller cuts the array into blocks. */
void kern_sin_f32(const float *x, float *y, int64_t n);
void kern_cos_f32(const float *x, float *y, int64_t n);
void kern_exp_f32(const float *x, float *y, int64_t n);
void kern_log_f32(const float *x, float *y, int64_t n);

/* Scatter's combining modes (the mode parameter's names, in order:
 * "set", "add", "multiply", "min", "max"); kern_scatter_mode maps a name
 * to its mode, -1 for an unknown one. */
enum { SCATTER_SET, SCATTER_ADD, SCATTER_MUL, SCATTER_MIN, SCATTER_MAX };
int kern_scatter_mode(const char *mode);

#endif
