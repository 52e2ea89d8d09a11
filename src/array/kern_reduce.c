/*
 * kern_reduce.c - reductions, arg-reductions and cumulative scans
 * (kernels.h).
 *
 * Every reduction is brought to the form (P, R, Q): P outer positions, R
 * reduced, Q inner positions, over contiguous data.  Q == 1 (the reduced
 * axes are last) reduces each run of R elements with several independent
 * accumulators so the loop vectorises; float sums are pairwise trees,
 * so the error grows with log R.  Q > 1 combines whole rows of Q,
 * which vectorises along Q.  Axes that are not one block are first brought
 * to the end by a transposed copy.
 */
#pragma GCC optimize("O3", "no-math-errno", "no-trapping-math")
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/error.h"
#include "array/kernels.h"
#include "base/mem.h"

#define LANES 16

enum { R_SUM, R_PROD, R_MAX, R_MIN, R_AND, R_OR, R_COUNT };
enum { T_B, T_I8, T_I32, T_I64, T_F32, T_F64, T_COUNT };

/* Reduces [n] contiguous elements at [x] into *out. */
typedef void (*InnerFn)(const void *x, int64_t n, void *out);
/* acc[i] = op(acc[i], row[i]) for i < q. */
typedef void (*RowsFn)(void *acc, const void *row, int64_t q);

/* ---- combining expressions -------------------------------------------------- */

#define C_ADDI(U, a, b) ((U)(a) + (U)(b))
#define C_MULI(U, a, b) ((U)(a) * (U)(b))
#define C_ADDF(U, a, b) ((a) + (b))
#define C_MULF(U, a, b) ((a) * (b))
/* NaN in [a] sticks; `|` rather than `||` keeps the loops branch-free so
 * they vectorise */
#define C_MAX(U, a, b) ((((a) != (a)) | ((a) > (b))) ? (a) : (b))
#define C_MIN(U, a, b) ((((a) != (a)) | ((a) < (b))) ? (a) : (b))
#define C_AND(U, a, b) ((a) & (b))
#define C_OR(U, a, b) ((a) | (b))

/* Lane-parallel reduction of a run; the combine order differs from a plain
 * left fold only by reassociation across LANES accumulators. */
#define INNER(NAME, T, U, INIT, COMB)                                        \
  KERN_CLONES static void NAME(const void *px, int64_t n, void *pout) {     \
    const T *x = px;                                                        \
    T acc[LANES];                                                           \
    for (int j = 0; j < LANES; j++)                                         \
      acc[j] = (T)(INIT);                                                   \
    int64_t i = 0;                                                          \
    for (; i + LANES <= n; i += LANES)                                      \
      for (int j = 0; j < LANES; j++)                                       \
        acc[j] = (T)COMB(U, acc[j], x[i + j]);                              \
    for (; i < n; i++)                                                      \
      acc[0] = (T)COMB(U, acc[0], x[i]);                                    \
    T r = acc[0];                                                           \
    for (int j = 1; j < LANES; j++)                                         \
      r = (T)COMB(U, r, acc[j]);                                            \
    *(T *)pout = r;                                                         \
  }

#define ROWS(NAME, T, U, COMB)                                               \
  KERN_CLONES static void NAME(void *pacc, const void *prow, int64_t q) {   \
    T *acc = pacc;                                                          \
    const T *row = prow;                                                    \
    for (int64_t i = 0; i < q; i++)                                         \
      acc[i] = (T)COMB(U, acc[i], row[i]);                                  \
  }

#define BOTH(OP, SUF, T, U, INIT, COMB)                                      \
  INNER(inner_##OP##_##SUF, T, U, INIT, COMB)                                \
  ROWS(rows_##OP##_##SUF, T, U, COMB)

#define INTS(OP, INIT8, INIT32, INIT64, COMB)                                \
  BOTH(OP, i8, int8_t, uint8_t, INIT8, COMB)                                 \
  BOTH(OP, i32, int32_t, uint32_t, INIT32, COMB)                             \
  BOTH(OP, i64, int64_t, uint64_t, INIT64, COMB)

INTS(sum, 0, 0, 0, C_ADDI)
INTS(prod, 1, 1, 1, C_MULI)
INTS(max, INT8_MIN, INT32_MIN, INT64_MIN, C_MAX)
INTS(min, INT8_MAX, INT32_MAX, INT64_MAX, C_MIN)
INTS(and, -1, -1, -1, C_AND)
INTS(or, 0, 0, 0, C_OR)
BOTH(sum, b, uint8_t, uint8_t, 0, C_OR)
BOTH(prod, b, uint8_t, uint8_t, 1, C_AND)
BOTH(max, b, uint8_t, uint8_t, 0, C_OR)
BOTH(min, b, uint8_t, uint8_t, 1, C_AND)
BOTH(and, b, uint8_t, uint8_t, 1, C_AND)
BOTH(or, b, uint8_t, uint8_t, 0, C_OR)
BOTH(prod, f32, float, float, 1, C_MULF)
BOTH(prod, f64, double, double, 1, C_MULF)
ROWS(rows_max_f32, float, float, C_MAX)
ROWS(rows_max_f64, double, double, C_MAX)
ROWS(rows_min_f32, float, float, C_MIN)
ROWS(rows_min_f64, double, double, C_MIN)

/* Float max/min of a run with GCC vector types: without -ffast-math gcc
 * will not vectorise a float max reduction written as a loop (NaN and
 * signed zeros), so the lanes are spelled out; NaN is tracked apart and
 * wins at the end, as jnp.max. */
#define VEXTREME(NAME, T, IT, INIT, CMP)                                      \
  KERN_CLONES static void NAME(const void *px, int64_t n, void *pout) {      \
    typedef T VT __attribute__((vector_size(64)));                           \
    typedef IT VI __attribute__((vector_size(64)));                          \
    enum { N = 64 / sizeof(T) };                                             \
    const T *x = px;                                                         \
    VT acc;                                                                  \
    VI nan = {0};                                                            \
    for (int j = 0; j < N; j++)                                              \
      acc[j] = INIT;                                                         \
    int64_t i = 0;                                                           \
    for (; i + N <= n; i += N) {                                             \
      VT v;                                                                  \
      memcpy(&v, x + i, sizeof v);                                           \
      VI take = v CMP acc;                                                   \
      nan |= v != v;                                                         \
      acc = (VT)((take & (VI)v) | (~take & (VI)acc));                        \
    }                                                                        \
    T r = INIT;                                                              \
    int any = 0;                                                             \
    for (int j = 0; j < N; j++) {                                            \
      r = acc[j] CMP r ? acc[j] : r;                                         \
      any |= nan[j] != 0;                                                    \
    }                                                                        \
    for (; i < n; i++) {                                                     \
      any |= x[i] != x[i];                                                   \
      r = x[i] CMP r ? x[i] : r;                                             \
    }                                                                        \
    *(T *)pout = any ? (T)__builtin_nan("") : r;                             \
  }
VEXTREME(inner_max_f32, float, int32_t, -__builtin_inff(), >)
VEXTREME(inner_max_f64, double, int64_t, -__builtin_inf(), >)
VEXTREME(inner_min_f32, float, int32_t, __builtin_inff(), <)
VEXTREME(inner_min_f64, double, int64_t, __builtin_inf(), <)
ROWS(rows_sum_f32, float, float, C_ADDF)
ROWS(rows_sum_f64, double, double, C_ADDF)

/* Pairwise summation.  A run of up to PW_BLOCK elements is summed as a
 * tree by folding halves (t[i] = x[i] + x[i + h], then t[i] += t[i + h/2],
 * ...), so every level is a vector add and the error grows with log n; a
 * longer run is split in two (at a multiple of LANES) and summed apart.
 * Unlike accumulating each lane sequentially, the fold is exact for equal
 * values at power-of-two counts, as XLA's tree reductions are: the mean of
 * 128 copies of x is x (the seed 001 toy network's loss depends on it). */
#define PW_BLOCK 256
#define PAIRWISE(NAME, T)                                                    \
  static inline __attribute__((always_inline)) T NAME##_fold(const T *x,   \
                                                             int64_t n) {  \
    T t[PW_BLOCK / 2];                                                      \
    if (n < 2)                                                              \
      return n ? x[0] : 0;                                                  \
    int64_t h = n / 2;                                                      \
    for (int64_t i = 0; i < h; i++)                                         \
      t[i] = x[i] + x[i + h];                                               \
    if (n & 1)                                                              \
      t[0] += x[n - 1];                                                     \
    while (h > 1) {                                                         \
      int64_t h2 = h / 2;                                                   \
      for (int64_t i = 0; i < h2; i++)                                      \
        t[i] += t[i + h2];                                                  \
      if (h & 1)                                                            \
        t[0] += t[h - 1];                                                   \
      h = h2;                                                               \
    }                                                                       \
    return t[0];                                                            \
  }                                                                         \
  /* a whole block, the common case, is the same fold (no odd halves)    \
   * with constant sizes, every level unrolled into straight vector adds */ \
  static inline __attribute__((always_inline)) T NAME##_fold_whole(        \
      const T *x) {                                                         \
    T t[PW_BLOCK / 2];                                                      \
    for (int i = 0; i < PW_BLOCK / 2; i++)                                  \
      t[i] = x[i] + x[i + PW_BLOCK / 2];                                    \
    _Pragma("GCC unroll 8")                                                 \
    for (int h = PW_BLOCK / 4; h >= 8; h /= 2)                              \
      for (int i = 0; i < h; i++)                                           \
        t[i] += t[i + h];                                                   \
    /* the last three levels in registers (as loops they went through   \
     * memory, a store and a load per add): the same adds */              \
    T a0 = t[0] + t[4], a1 = t[1] + t[5], a2 = t[2] + t[6], a3 = t[3] + t[7]; \
    a0 += a2;                                                               \
    a1 += a3;                                                               \
    return a0 + a1;                                                         \
  }                                                                         \
  KERN_CLONES static T NAME##_block(const T *x, int64_t n) {                \
    return n == PW_BLOCK ? NAME##_fold_whole(x) : NAME##_fold(x, n);        \
  }                                                                         \
  T NAME(const T *x, int64_t n) {                                           \
    if (n <= PW_BLOCK)                                                      \
      return NAME##_block(x, n);                                            \
    int64_t m = (n / 2) / LANES * LANES;                                    \
    return NAME(x, m) + NAME(x + m, n - m);                                 \
  }
PAIRWISE(kern_sum_f32, float)
PAIRWISE(kern_sum_f64, double)

static void inner_sum_f32(const void *x, int64_t n, void *out) {
  *(float *)out = kern_sum_f32(x, n);
}
static void inner_sum_f64(const void *x, int64_t n, void *out) {
  *(double *)out = kern_sum_f64(x, n);
}

#define TROW(P, OP) {P##_##OP##_b, P##_##OP##_i8, P##_##OP##_i32, P##_##OP##_i64, \
                     P##_##OP##_f32, P##_##OP##_f64}
#define TROW_INT(P, OP) {P##_##OP##_b, P##_##OP##_i8, P##_##OP##_i32, P##_##OP##_i64, NULL, NULL}
static const InnerFn inner_fns[R_COUNT][T_COUNT] = {
    [R_SUM] = TROW(inner, sum), [R_PROD] = TROW(inner, prod),
    [R_MAX] = TROW(inner, max), [R_MIN] = TROW(inner, min),
    [R_AND] = TROW_INT(inner, and), [R_OR] = TROW_INT(inner, or),
};
static const RowsFn rows_fns[R_COUNT][T_COUNT] = {
    [R_SUM] = TROW(rows, sum), [R_PROD] = TROW(rows, prod),
    [R_MAX] = TROW(rows, max), [R_MIN] = TROW(rows, min),
    [R_AND] = TROW_INT(rows, and), [R_OR] = TROW_INT(rows, or),
};

static int kern_tcode(DType t) {
  switch (t) {
    case DT_BOOL: return T_B;
    case DT_I8: return T_I8;
    case DT_I32: return T_I32;
    case DT_I64: return T_I64;
    case DT_F64: return T_F64;
    default: return T_F32;
  }
}

/* ---- bringing data to (P, R, Q) form ---------------------------------------------- */

/* A contiguous array and the split of its elements into P x R x Q. */
typedef struct Prq {
  Array *a;           /* owned */
  int64_t p, r, q;
} Prq;

/* Reads [name] (a tuple of axes) into a mask over [ndim] dims. */
static int kern_axes_mask(const Params *prm, const char *name, int ndim, bool *mask) {
  int64_t axes[SHM_MAXDIM];
  int n;
  if (params_ints(prm, name, &n, axes, SHM_MAXDIM) < 0)
    return -1;
  memset(mask, 0, sizeof(bool) * SHM_MAXDIM);
  for (int i = 0; i < n; i++) {
    int ax;
    if (axis_normalize(axes[i], ndim, &ax) < 0)
      return -1;
    mask[ax] = true;
  }
  return 0;
}

/* True when the reduced dims (ignoring size-1 dims) form one block;
 * sets the P, R, Q sizes. */
static bool kern_one_block(const Array *x, const bool *mask, Prq *s) {
  int state = 0;  /* 0: before the block, 1: in it, 2: after */
  s->p = s->r = s->q = 1;
  for (int i = 0; i < x->ndim; i++) {
    int64_t n = x->shape[i];
    if (n == 1)
      continue;
    if (mask[i] && state == 2)
      return false;
    if (mask[i])
      state = 1;
    else if (state == 1)
      state = 2;
    if (mask[i])
      s->r *= n;
    else if (state == 0)
      s->p *= n;
    else
      s->q *= n;
  }
  return true;
}

/* Puts [x] in (P, R, Q) form for the reduction over [mask]; a transposed
 * copy when the axes are scattered or x is not contiguous. */
static int kern_to_prq(Array *x, const bool *mask, Prq *s) {
  if (x->size == 0) {
    s->p = s->r = s->q = 0;
  }
  if (x->contiguous && kern_one_block(x, mask, s)) {
    s->a = (Array *)val_incref(&x->hdr);
    return 0;
  }
  int64_t shape[SHM_MAXDIM], strides[SHM_MAXDIM];
  int k = 0;
  s->p = s->r = 1;
  s->q = 1;
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < x->ndim; i++) {
      if (mask[i] != (pass == 1))
        continue;
      shape[k] = x->shape[i];
      strides[k++] = x->strides[i];
      if (pass)
        s->r *= x->shape[i];
      else
        s->p *= x->shape[i];
    }
  }
  Array *v = arr_view(x, x->ndim, shape, strides, x->offset);
  s->a = v ? arr_copy(v) : NULL;
  if (v)
    val_decref(&v->hdr);
  return s->a ? 0 : -1;
}

/* Reduces the (P, R, Q) data into [out] (P*Q contiguous elements of the
 * compute type). */
static void kern_reduce_prq(int op, int tc, const Prq *s, char *out) {
  size_t isz = dt_size(s->a->dtype);
  const char *x = arr_data(s->a);
  if (s->r == 0 || s->p * s->q == 0) {
    for (int64_t i = 0; i < s->p * s->q; i++)
      inner_fns[op][tc](x, 0, out + i * (int64_t)isz);  /* the identity */
    return;
  }
  if (s->q == 1) {
    for (int64_t i = 0; i < s->p; i++)
      inner_fns[op][tc](x + i * s->r * (int64_t)isz, s->r, out + i * (int64_t)isz);
    return;
  }
  size_t row = (size_t)s->q * isz;
  for (int64_t i = 0; i < s->p; i++) {
    const char *blk = x + (size_t)i * (size_t)s->r * row;
    char *o = out + (size_t)i * row;
    memcpy(o, blk, row);
    for (int64_t r = 1; r < s->r; r++)
      rows_fns[op][tc](o, blk + (size_t)r * row, s->q);
  }
}

/* Widens bf16/f16 to f32 (a new reference either way). */
static Array *kern_widen_half(Array *x) {
  if (x->dtype == DT_BF16 || x->dtype == DT_F16)
    return arr_astype(x, DT_F32, x->weak);
  return (Array *)val_incref(&x->hdr);
}

/* Brings [x0] to (P, R, Q) form over the axes named by [p]'s `axes`, with
 * 16-bit floats widened to float32 first. */
static int kern_prepare(Array *x0, const Params *p, Prq *s) {
  bool mask[SHM_MAXDIM];
  if (kern_axes_mask(p, "axes", x0->ndim, mask) < 0)
    return -1;
  Array *x = kern_widen_half(x0);
  if (!x)
    return -1;
  int rc = kern_to_prq(x, mask, s);
  val_decref(&x->hdr);
  return rc;
}

static int kern_reduce(int op, Array *x0, const Params *p, Array *o) {
  Prq s;
  if (kern_prepare(x0, p, &s) < 0)
    return -1;
  int tc = kern_tcode(s.a->dtype);
  if (!inner_fns[op][tc]) {
    val_decref(&s.a->hdr);
    err_set(ERR_TYPE, "reduction does not accept dtype %s", dt_name(x0->dtype));
    return -1;
  }
  if (s.a->dtype == o->dtype) {
    kern_reduce_prq(op, tc, &s, arr_data(o));
  } else {
    Array *t = arr_new(s.a->dtype, o->ndim, o->shape);
    if (!t) {
      val_decref(&s.a->hdr);
      return -1;
    }
    kern_reduce_prq(op, tc, &s, arr_data(t));
    kern_convert(arr_data(o), o->dtype, arr_data(t), t->dtype, o->size);
    val_decref(&t->hdr);
  }
  val_decref(&s.a->hdr);
  return 0;
}

int kern_reduce_sum(Array **in, int nin, const Params *p, Array **out) {
  return kern_reduce(R_SUM, in[0], p, out[0]);
}
int kern_reduce_prod(Array **in, int nin, const Params *p, Array **out) {
  return kern_reduce(R_PROD, in[0], p, out[0]);
}
int kern_reduce_max(Array **in, int nin, const Params *p, Array **out) {
  return kern_reduce(R_MAX, in[0], p, out[0]);
}
int kern_reduce_min(Array **in, int nin, const Params *p, Array **out) {
  return kern_reduce(R_MIN, in[0], p, out[0]);
}
int kern_reduce_and(Array **in, int nin, const Params *p, Array **out) {
  return kern_reduce(R_AND, in[0], p, out[0]);
}
int kern_reduce_or(Array **in, int nin, const Params *p, Array **out) {
  return kern_reduce(R_OR, in[0], p, out[0]);
}

/* ---- argmax / argmin ------------------------------------------------------------ */

/* Index of the first extreme of a strided run of [r]; NaN wins (the first
 * NaN), as jnp.argmax.  [sign] is 1 for max, -1 for min. */
#define ARGBEST(NAME, T, ISNAN)                                              \
  static int64_t NAME(const T *x, int64_t st, int64_t r, int sign) {        \
    int64_t best = 0;                                                       \
    T bv = x[0];                                                            \
    if (ISNAN(bv))                                                          \
      return 0;                                                             \
    for (int64_t i = 1; i < r; i++) {                                       \
      T v = x[i * st];                                                      \
      if (ISNAN(v))                                                         \
        return i;                                                           \
      if (sign > 0 ? v > bv : v < bv) {                                     \
        bv = v;                                                             \
        best = i;                                                           \
      }                                                                     \
    }                                                                       \
    return best;                                                            \
  }
#define NO_NAN(v) 0
#define IS_NAN(v) ((v) != (v))
ARGBEST(argbest_b, uint8_t, NO_NAN)
ARGBEST(argbest_i8, int8_t, NO_NAN)
ARGBEST(argbest_i32, int32_t, NO_NAN)
ARGBEST(argbest_i64, int64_t, NO_NAN)
ARGBEST(argbest_f32, float, IS_NAN)
ARGBEST(argbest_f64, double, IS_NAN)

/* Index of the first element of contiguous [x] equal to [m] (or the first
 * NaN when m is NaN): blocks are tested with a vectorised or-reduction,
 * and only the block holding the match is scanned. */
#define ARGFIND(NAME, T)                                                      \
  static int64_t NAME(const T *x, int64_t n, T m) {                          \
    int nan = m != m;                                                        \
    for (int64_t i = 0; i < n; i += 256) {                                   \
      int64_t e = n - i < 256 ? n : i + 256;                                 \
      int hit = 0;                                                           \
      for (int64_t k = i; k < e; k++)                                        \
        hit |= (x[k] == m) | (nan & (x[k] != x[k]));                         \
      for (int64_t k = i; hit && k < e; k++)                                 \
        if ((x[k] == m) | (nan & (x[k] != x[k])))                            \
          return k;                                                          \
    }                                                                        \
    return 0;                                                                \
  }
ARGFIND(argfind_b, uint8_t)
ARGFIND(argfind_i8, int8_t)
ARGFIND(argfind_i32, int32_t)
ARGFIND(argfind_i64, int64_t)
ARGFIND(argfind_f32, float)
ARGFIND(argfind_f64, double)

/* argmax/argmin of a contiguous run: the extreme by the vectorised
 * reduction, then its first position. */
static int64_t kern_argbest_run(int tc, const char *x, int64_t r, int sign) {
  union { uint8_t b; int8_t i8; int32_t i32; int64_t i64; float f32; double f64; } m;
  inner_fns[sign > 0 ? R_MAX : R_MIN][tc](x, r, &m);
  switch (tc) {
    case T_B: return argfind_b((const uint8_t *)x, r, m.b);
    case T_I8: return argfind_i8((const int8_t *)x, r, m.i8);
    case T_I32: return argfind_i32((const int32_t *)x, r, m.i32);
    case T_I64: return argfind_i64((const int64_t *)x, r, m.i64);
    case T_F32: return argfind_f32((const float *)x, r, m.f32);
    default: return argfind_f64((const double *)x, r, m.f64);
  }
}

static int64_t kern_argbest(int tc, const char *x, int64_t st, int64_t r, int sign) {
  if (st == 1)
    return kern_argbest_run(tc, x, r, sign);
  switch (tc) {
    case T_B: return argbest_b((const uint8_t *)x, st, r, sign);
    case T_I8: return argbest_i8((const int8_t *)x, st, r, sign);
    case T_I32: return argbest_i32((const int32_t *)x, st, r, sign);
    case T_I64: return argbest_i64((const int64_t *)x, st, r, sign);
    case T_F32: return argbest_f32((const float *)x, st, r, sign);
    default: return argbest_f64((const double *)x, st, r, sign);
  }
}

static int kern_arg(int sign, Array *x0, const Params *p, Array *o) {
  Prq s;
  if (kern_prepare(x0, p, &s) < 0)
    return -1;
  int64_t n = s.p * s.q;
  int64_t *idx = shm_malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
  if (!idx) {
    val_decref(&s.a->hdr);
    err_nomem();
    return -1;
  }
  size_t isz = dt_size(s.a->dtype);
  const char *d = arr_data(s.a);
  int tc = kern_tcode(s.a->dtype);
  for (int64_t i = 0; i < s.p; i++)
    for (int64_t j = 0; j < s.q; j++)
      idx[i * s.q + j] = s.r ? kern_argbest(tc, d + ((i * s.r) * s.q + j) * (int64_t)isz,
                                           s.q, s.r, sign) : 0;
  kern_convert(arr_data(o), o->dtype, idx, DT_I64, o->size);
  shm_free(idx);
  val_decref(&s.a->hdr);
  return 0;
}

int kern_argmax(Array **in, int nin, const Params *p, Array **out) {
  return kern_arg(1, in[0], p, out[0]);
}
int kern_argmin(Array **in, int nin, const Params *p, Array **out) {
  return kern_arg(-1, in[0], p, out[0]);
}

/* ---- cumulative scans ----------------------------------------------------------- */

/* Steps [k0, k1) of a scan of [r] rows of [q] elements at [x] into [y]
 * (same layout): row k of y is op(row k-1 of y, row k of x), walking
 * backwards when [rev]; step 0 copies the first row, a later step reads
 * the row the step before wrote. */
#define SCAN(NAME, T, U, COMB)                                               \
  static void NAME(const void *px, void *py, int64_t r, int64_t q, bool rev, \
                   int64_t k0, int64_t k1) {                                \
    const T *x = px;                                                        \
    T *y = py;                                                              \
    int64_t first = rev ? r - 1 : 0, step = rev ? -1 : 1;                   \
    if (k0 == 0)                                                            \
      memcpy(y + first * q, x + first * q, sizeof(T) * (size_t)q);          \
    for (int64_t k = k0 ? k0 : 1; k < k1; k++) {                            \
      int64_t cur = first + k * step, prev = cur - step;                    \
      for (int64_t i = 0; i < q; i++)                                       \
        y[cur * q + i] = (T)COMB(U, y[prev * q + i], x[cur * q + i]);       \
    }                                                                       \
  }
typedef void (*ScanFn)(const void *x, void *y, int64_t r, int64_t q, bool rev,
                       int64_t k0, int64_t k1);
#define SCANS(OP, CI, CF)                                                    \
  SCAN(scan_##OP##_b, uint8_t, uint8_t, C_OR)                                \
  SCAN(scan_##OP##_i8, int8_t, uint8_t, CI)                                  \
  SCAN(scan_##OP##_i32, int32_t, uint32_t, CI)                               \
  SCAN(scan_##OP##_i64, int64_t, uint64_t, CI)                               \
  SCAN(scan_##OP##_f32, float, float, CF)                                    \
  SCAN(scan_##OP##_f64, double, double, CF)
SCANS(sum, C_ADDI, C_ADDF)
SCANS(prod, C_MULI, C_MULF)
SCANS(max, C_MAX, C_MAX)

enum { S_SUM, S_PROD, S_MAX, S_COUNT };
static const ScanFn scan_fns[S_COUNT][T_COUNT] = {
    [S_SUM] = TROW(scan, sum), [S_PROD] = TROW(scan, prod), [S_MAX] = TROW(scan, max),
};

static int kern_scan(int op, Array *x0, const Params *p, Array *o) {
  int64_t axis64;
  bool rev = false;
  int axis;
  if (params_int(p, "axis", &axis64) < 0 || axis_normalize(axis64, x0->ndim, &axis) < 0)
    return -1;
  if (params_get(p, "reverse") && params_bool(p, "reverse", &rev) < 0)
    return -1;
  Array *w = kern_widen_half(x0), *x = w ? kern_contiguous(w) : NULL;
  if (w)
    val_decref(&w->hdr);
  if (!x)
    return -1;
  int64_t pp = 1, r = x->shape[axis], q = 1;
  for (int i = 0; i < axis; i++)
    pp *= x->shape[i];
  for (int i = axis + 1; i < x->ndim; i++)
    q *= x->shape[i];
  Array *t = x->dtype == o->dtype ? (Array *)val_incref(&o->hdr)
                                  : arr_new(x->dtype, o->ndim, o->shape);
  if (t) {
    size_t blk = (size_t)(r * q) * dt_size(x->dtype);
    /* steps of about KERN_CHUNK elements, with a look at Ctrl-C before
     * each (a cumsum of 5*10^8 is tens of seconds of work) */
    int64_t rows = q < KERN_CHUNK ? KERN_CHUNK / q : 1;
    for (int64_t i = 0; r > 0 && i < pp; i++)
      KERN_FOR_POLLED(k, 0, (r + rows - 1) / rows, 1)
        scan_fns[op][kern_tcode(x->dtype)]((char *)arr_data(x) + i * blk,
                                           (char *)arr_data(t) + i * blk, r, q, rev,
                                           k * rows, r - k * rows < rows ? r : (k + 1) * rows);
    if (t != o)
      kern_convert(arr_data(o), o->dtype, arr_data(t), t->dtype, o->size);
    val_decref(&t->hdr);
  }
  val_decref(&x->hdr);
  return t ? 0 : -1;
}

int kern_cumsum(Array **in, int nin, const Params *p, Array **out) {
  return kern_scan(S_SUM, in[0], p, out[0]);
}
int kern_cumprod(Array **in, int nin, const Params *p, Array **out) {
  return kern_scan(S_PROD, in[0], p, out[0]);
}
int kern_cummax(Array **in, int nin, const Params *p, Array **out) {
  return kern_scan(S_MAX, in[0], p, out[0]);
}
