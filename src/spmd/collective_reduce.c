/*
 * collective_reduce.c - the reductions: strided views and the reduction
 * arithmetic, the contiguous folds, the shape and vma rule helpers,
 * axis_index, and psum, pmax and pmin with their reduce-scatter across
 * processes (collective_impl.h).
 *
 * The family file of axis_index, psum, pmax, pmin and pvary: each one's
 * complete row of the primitive table (reduce_rows, at the end) with its
 * rules beside it: shape, kernel and vma rules; batching over mesh axes
 * (element-wise across devices) and over a vmap or xmap axis it names
 * (the positional reduction of its row, reduce_sum for psum); JVP (psum
 * and pvary linear, pmax and pmin as the location of the extremum) and
 * transpose (psum's is pvary, pvary's psum, under the replication types
 * of LANGUAGE.md §11); its effect on named shapes.  Semantics: JAX's
 * parallel.py.
 */
#include "spmd/collective_impl.h"

#include "array/prim.h"
#include "array/prim_rules.h"
#include "lang/ops.h"

/* ---- strided views ------------------------------------------------------------ */

void coll_view_of(View *v, const Array *a) {
  v->base = arr_data(a);
  v->esize = dt_size(a->dtype);
  v->ndim = a->ndim;
  memcpy(v->shape, a->shape, sizeof(int64_t) * (size_t)a->ndim);
  memcpy(v->strides, a->strides, sizeof(int64_t) * (size_t)a->ndim);
}

void coll_view_slice(View *v, int d, int64_t start, int64_t len) {
  v->base += start * v->strides[d] * (int64_t)v->esize;
  v->shape[d] = len;
}

void coll_view_drop(View *v, int d) {
  for (int k = d; k + 1 < v->ndim; k++) {
    v->shape[k] = v->shape[k + 1];
    v->strides[k] = v->strides[k + 1];
  }
  v->ndim--;
}

void coll_view_each2(const View *dst, const View *src, InnerFn fn,
                     const void *arg) {
  int nd = dst->ndim;
  int64_t idx[SHM_MAXDIM] = {0};
  for (int k = 0; k < nd; k++)
    if (dst->shape[k] == 0) return;
  int64_t inner = nd ? dst->shape[nd - 1] : 1;
  int64_t ds = nd ? dst->strides[nd - 1] : 1, ss = nd ? src->strides[nd - 1] : 1;
  char *d = dst->base;
  const char *s = src->base;
  for (;;) {
    fn(d, s, inner, ds, ss, arg);
    int k = nd - 2;
    for (; k >= 0; k--) {
      d += dst->strides[k] * (int64_t)dst->esize;
      s += src->strides[k] * (int64_t)src->esize;
      if (++idx[k] < dst->shape[k]) break;
      d -= dst->strides[k] * dst->shape[k] * (int64_t)dst->esize;
      s -= src->strides[k] * src->shape[k] * (int64_t)src->esize;
      idx[k] = 0;
    }
    if (k < 0) return;
  }
}

static void inner_copy(char *dst, const char *src, int64_t n, int64_t ds,
                       int64_t ss, const void *arg) {
  size_t es = *(const size_t *)arg;
  if (ds == 1 && ss == 1) {
    memcpy(dst, src, (size_t)n * es);
    return;
  }
  for (int64_t i = 0; i < n; i++)
    memcpy(dst + i * ds * (int64_t)es, src + i * ss * (int64_t)es, es);
}

void coll_view_copy(const View *dst, const View *src) {
  coll_view_each2(dst, src, inner_copy, &dst->esize);
}

/* ---- reduction arithmetic ------------------------------------------------------ */
/* One scalar rule per dtype, used by the fast and the reference paths
 * alike, so both give the same bits.  Integers wrap; bool sum and max are
 * OR, min is AND; float max/min propagate NaN, as XLA's do; 16-bit floats
 * are combined in f32 and rounded back after every step. */

#define RED_FLOAT(T, a, b, op)                                   \
  ((op) == RED_SUM ? (T)((a) + (b))                              \
   : (a) != (a) ? (a) : (b) != (b) ? (b)                         \
   : (op) == RED_MAX ? ((a) > (b) ? (a) : (b)) : ((a) < (b) ? (a) : (b)))

static void red_f32(float *a, const float *b, int64_t n, int64_t as, int64_t bs,
                    RedOp op) {
  for (int64_t i = 0; i < n; i++) {
    float x = a[i * as], y = b[i * bs];
    a[i * as] = RED_FLOAT(float, x, y, op);
  }
}

static void red_f64(double *a, const double *b, int64_t n, int64_t as,
                    int64_t bs, RedOp op) {
  for (int64_t i = 0; i < n; i++) {
    double x = a[i * as], y = b[i * bs];
    a[i * as] = RED_FLOAT(double, x, y, op);
  }
}

static void red_half(uint16_t *a, const uint16_t *b, int64_t n, int64_t as,
                     int64_t bs, RedOp op, bool bf16) {
  for (int64_t i = 0; i < n; i++) {
    uint16_t ha = a[i * as], hb = b[i * bs];
    float x = bf16 ? dt_bf16_to_f32(ha) : dt_f16_to_f32(ha);
    float y = bf16 ? dt_bf16_to_f32(hb) : dt_f16_to_f32(hb);
    if (op == RED_SUM)
      a[i * as] = bf16 ? dt_f32_to_bf16(x + y) : dt_f32_to_f16(x + y);
    else if (x != x || y != y)
      a[i * as] = x != x ? ha : hb;
    else
      a[i * as] = (op == RED_MAX ? y > x : y < x) ? hb : ha;
  }
}

static int64_t red_int(int64_t x, int64_t y, RedOp op) {
  if (op == RED_SUM) return (int64_t)((uint64_t)x + (uint64_t)y);
  if (op == RED_MAX) return x > y ? x : y;
  return x < y ? x : y;
}

#define RED_INT_LOOP(T)                                                  \
  for (int64_t i = 0; i < n; i++) {                                      \
    T *pa = (T *)a + i * as;                                             \
    *pa = (T)red_int(*pa, ((const T *)b)[i * bs], op);                   \
  }

static void red_ints(DType t, char *a, const char *b, int64_t n, int64_t as,
                     int64_t bs, RedOp op) {
  if (t == DT_I8) { RED_INT_LOOP(int8_t) }
  else if (t == DT_I32) { RED_INT_LOOP(int32_t) }
  else if (t == DT_I64) { RED_INT_LOOP(int64_t) }
  else {
    for (int64_t i = 0; i < n; i++) {
      uint8_t *pa = (uint8_t *)a + i * as, y = ((const uint8_t *)b)[i * bs];
      *pa = op == RED_MIN ? (*pa && y) : (*pa || y);
    }
  }
}

void coll_inner_reduce(char *acc, const char *x, int64_t n, int64_t as,
                       int64_t xs, const void *arg) {
  const RedArg *r = arg;
  switch (r->dtype) {
  case DT_F32: red_f32((float *)acc, (const float *)x, n, as, xs, r->op); break;
  case DT_F64: red_f64((double *)acc, (const double *)x, n, as, xs, r->op); break;
  case DT_F16: case DT_BF16:
    red_half((uint16_t *)acc, (const uint16_t *)x, n, as, xs, r->op,
             r->dtype == DT_BF16);
    break;
  default: red_ints(r->dtype, acc, x, n, as, xs, r->op); break;
  }
}

/* ---- contiguous folds ---------------------------------------------------------- */
/* The fast path's loops: the scalar rules above on contiguous rows, with
 * restrict pointers and no strides, so gcc vectorises them (the same
 * expressions per element, so the same bits as coll_inner_reduce: no FMA
 * under -ffp-contract=off, and maxps/minps select exactly as `?:` does).
 * red_first is o = a (op) b, red_next is o = o (op) b. */

#pragma GCC push_options
#pragma GCC optimize("O3")

/* NAME_first: o = a (op) b; NAME_next: o = o (op) b, each element by
 * [COMBINE], an expression of x, y and op. */
#define FOLDS(T, NAME, COMBINE)                                               \
  KERN_CLONES static void NAME##_first(T *restrict o, const T *restrict a,    \
                                       const T *restrict b, int64_t n,        \
                                       RedOp op) {                            \
    for (int64_t i = 0; i < n; i++) {                                         \
      T x = a[i], y = b[i];                                                   \
      o[i] = COMBINE;                                                         \
    }                                                                         \
  }                                                                           \
  KERN_CLONES static void NAME##_next(T *restrict o, const T *restrict b,     \
                                      int64_t n, RedOp op) {                  \
    for (int64_t i = 0; i < n; i++) {                                         \
      T x = o[i], y = b[i];                                                   \
      o[i] = COMBINE;                                                         \
    }                                                                         \
  }

/* Integers: sums wrap (computed unsigned, the same bits as red_int). */
#define RED_WRAP(T, U, a, b, op)                                              \
  ((op) == RED_SUM ? (T)((U)(a) + (U)(b))                                     \
   : (op) == RED_MAX ? ((a) > (b) ? (a) : (b)) : ((a) < (b) ? (a) : (b)))

FOLDS(float, fold_f32, RED_FLOAT(float, x, y, op))
FOLDS(double, fold_f64, RED_FLOAT(double, x, y, op))
FOLDS(int8_t, fold_i8, RED_WRAP(int8_t, uint8_t, x, y, op))
FOLDS(int32_t, fold_i32, RED_WRAP(int32_t, uint32_t, x, y, op))
FOLDS(int64_t, fold_i64, RED_WRAP(int64_t, uint64_t, x, y, op))

#pragma GCC pop_options

/* o = a (op) b over [n] contiguous elements; o, a, b do not overlap. */
static void red_first(const RedArg *r, char *o, const char *a, const char *b,
                      int64_t n) {
  switch (r->dtype) {
  case DT_F32: fold_f32_first((float *)o, (const float *)a, (const float *)b, n, r->op); break;
  case DT_F64: fold_f64_first((double *)o, (const double *)a, (const double *)b, n, r->op); break;
  case DT_I8: fold_i8_first((int8_t *)o, (const int8_t *)a, (const int8_t *)b, n, r->op); break;
  case DT_I32: fold_i32_first((int32_t *)o, (const int32_t *)a, (const int32_t *)b, n, r->op); break;
  case DT_I64: fold_i64_first((int64_t *)o, (const int64_t *)a, (const int64_t *)b, n, r->op); break;
  default:  /* bool, f16, bf16: the scalar rules */
    memcpy(o, a, (size_t)n * dt_size(r->dtype));
    coll_inner_reduce(o, b, n, 1, 1, r);
    break;
  }
}

/* o = o (op) b over [n] contiguous elements; o and b do not overlap. */
static void red_next(const RedArg *r, char *o, const char *b, int64_t n) {
  switch (r->dtype) {
  case DT_F32: fold_f32_next((float *)o, (const float *)b, n, r->op); break;
  case DT_F64: fold_f64_next((double *)o, (const double *)b, n, r->op); break;
  case DT_I8: fold_i8_next((int8_t *)o, (const int8_t *)b, n, r->op); break;
  case DT_I32: fold_i32_next((int32_t *)o, (const int32_t *)b, n, r->op); break;
  case DT_I64: fold_i64_next((int64_t *)o, (const int64_t *)b, n, r->op); break;
  default: coll_inner_reduce(o, b, n, 1, 1, r); break;
  }
}

/* ---- the reference path's gathered global array ------------------------------ */

Array *coll_peer_in(const Call *c, int q, int k) {
  if (c->xin) return c->xin[q * c->desc.nin + k];
  return c->g->slots[c->peers[q]].in[k];
}

int coll_global_gather(Global *gl, const Call *c, int k) {
  const Array *mine = c->in[k];
  size_t es = dt_size(mine->dtype);
  gl->block = mine->size;
  gl->nbytes = (size_t)gl->block * es * (size_t)c->n;
  gl->data = shm_buf_alloc(gl->nbytes ? gl->nbytes : 1);
  if (!gl->data) return err_nomem(), -1;
  for (int q = 0; q < c->n; q++) {
    View src, dst;
    coll_view_of(&src, coll_peer_in(c, q, k));
    dst = src;
    dst.base = gl->data + (size_t)q * (size_t)gl->block * es;
    shape_strides(dst.ndim, dst.shape, dst.strides);
    coll_view_copy(&dst, &src);
    if (q == 0) gl->blockview = dst;
  }
  return 0;
}

void coll_global_free(Global *gl) {
  shm_buf_free(gl->data, gl->nbytes ? gl->nbytes : 1);
}

char *coll_global_at(const Global *gl, int q, const int64_t *idx) {
  const View *b = &gl->blockview;
  int64_t off = 0;
  for (int d = 0; d < b->ndim; d++) off = off * b->shape[d] + idx[d];
  return gl->data + ((size_t)q * (size_t)gl->block + (size_t)off) * b->esize;
}

void coll_unravel(int64_t flat, int ndim, const int64_t *shape, int64_t *idx) {
  for (int d = ndim - 1; d >= 0; d--) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
}

void coll_idx_insert(int64_t *idx, int n, int at, int64_t x) {
  for (int d = n; d > at; d--) idx[d] = idx[d - 1];
  idx[at] = x;
}

void coll_idx_delete(int64_t *idx, int n, int at) {
  for (int d = at; d + 1 < n; d++) idx[d] = idx[d + 1];
}

void coll_ref_fill(const Call *c, const Global *gl, Array *out, RefMap map,
                   const void *arg) {
  size_t es = dt_size(out->dtype);
  char *o = arr_data(out);
  for (int64_t f = 0; f < out->size; f++) {
    int64_t idx[SHM_MAXDIM + 1];
    coll_unravel(f, out->ndim, out->shape, idx);
    int q = map(c, arg, idx);
    if (q < 0)
      memset(o + (size_t)f * es, 0, es);
    else
      memcpy(o + (size_t)f * es, coll_global_at(gl, q, idx), es);
  }
}

/* ---- shape-rule helpers ------------------------------------------------------- */

void coll_aval_from(const Array *a, AVal *av) {
  memset(av, 0, sizeof *av);
  av->dtype = a->dtype;
  av->weak = a->weak;
  av->ndim = a->ndim;
  memcpy(av->shape, a->shape, sizeof(int64_t) * (size_t)a->ndim);
  av->vma = a->vma;
}

int coll_shape_axis_n(const char *prim, const Params *p, int64_t *n) {
  if (params_get(p, "axis_size") && params_get(p, "axis_size") != VAL_NONE)
    return coll_param_int(prim, p, "axis_size", 1, n);
  DevCtx *ctx = dev_ctx();
  if (!ctx || !ctx->mesh)
    return err_set(ERR_VALUE, "%s needs its axis_size parameter outside a "
                   "shard_map body", prim), -1;
  int axes[DEV_MAX_AXES], na, gsize;
  if (coll_ctx_axes(ctx, prim, p, axes, &na) < 0) return -1;
  int size = coll_flat_size(ctx->mesh, axes, na);
  Value *groups = coll_groups_param(p);
  if (groups && coll_check_groups(prim, groups, size, &gsize) < 0) return -1;
  *n = groups ? gsize : size;
  return 0;
}

int coll_check_axis_size(const char *prim, const Params *p, int n) {
  int64_t given;
  if (coll_param_int(prim, p, "axis_size", n, &given) < 0) return -1;
  if (given != n)
    return err_set(ERR_VALUE, "%s: axis_size=%lld, but the axis has %d "
                   "participants", prim, (long long)given, n), -1;
  return 0;
}

int coll_param_dim(const char *prim, const Params *p, const char *name,
                   int ndim, int *out) {
  int64_t d;
  if (coll_param_int(prim, p, name, 0, &d) < 0) return -1;
  if (d < 0) d += ndim;
  if (d < 0 || d >= ndim)
    return err_set(ERR_VALUE, "%s: %s %lld is out of bounds for an operand of "
                   "rank %d", prim, name, (long long)d, ndim), -1;
  *out = (int)d;
  return 0;
}

void coll_shape_insert(AVal *a, int at, int64_t x) {
  for (int d = a->ndim; d > at; d--) a->shape[d] = a->shape[d - 1];
  a->shape[at] = x;
  a->ndim++;
}

void coll_shape_delete(AVal *a, int at) {
  for (int d = at; d + 1 < a->ndim; d++) a->shape[d] = a->shape[d + 1];
  a->ndim--;
}

/* ---- vma-rule helpers --------------------------------------------------------- */

/* The mesh-axis bits named by [p]; false when no mesh is current. */
bool coll_axes_mask(const Params *p, uint32_t *mask) {
  DevCtx *ctx = dev_ctx();
  int axes[DEV_MAX_AXES], na;
  if (!ctx || !ctx->mesh) return false;
  /* the vma rule runs before every collective's kernel, and a loop
   * repeating one passes the names the device's memo resolved last */
  if (ctx->group && ctx->mesh == &ctx->group->mesh) {
    AxesMemo *am = &ctx->group->slots[ctx->rank].axes_memo;
    if (coll_axes_memo_hit(am, coll_axis_param(p))) {
      *mask = am->mask;
      return true;
    }
  }
  if (coll_ctx_axes(ctx, "collective", p, axes, &na) < 0) {
    err_clear();
    return false;
  }
  *mask = 0;
  for (int k = 0; k < na; k++) *mask |= 1u << axes[k];
  return true;
}

static uint32_t vma_union(const uint32_t *in, int nin) {
  uint32_t u = 0;
  for (int i = 0; i < nin; i++) u |= in[i];
  return u;
}

uint32_t coll_vma_remove(const uint32_t *in, int nin, const Params *p) {
  uint32_t m, u = vma_union(in, nin);
  if (!u || coll_groups_param(p) || !coll_axes_mask(p, &m)) return u;
  return u & ~m;
}

uint32_t coll_vma_add(const uint32_t *in, int nin, const Params *p) {
  uint32_t m = 0;
  coll_axes_mask(p, &m);
  return vma_union(in, nin) | m;
}

/* ---- axis_index -------------------------------------------------------------- */

int coll_shape_axis_index(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)in, (void)nin, (void)p;
  memset(out, 0, sizeof *out);
  out->dtype = DT_I32;
  return 0;
}

/* Semantics: jax.lax.axis_index; a tuple of names is one flattened axis. */
int coll_kernel_axis_index(Array **in, int nin, const Params *p, Array **out) {
  (void)in, (void)nin;
  DevCtx *ctx = dev_ctx();
  int axes[DEV_MAX_AXES], na;
  if (!ctx || !ctx->mesh)
    return err_set(ERR_VALUE, "axis_index can only be used inside a shard_map "
                   "body"), -1;
  if (coll_ctx_axes(ctx, "axis_index", p, axes, &na) < 0) return -1;
  *(int32_t *)arr_data(out[0]) = coll_flat_index(ctx->mesh, axes, na, ctx->coords);
  return 0;
}

uint32_t coll_vma_axis_index(const uint32_t *in, int nin, const Params *p) {
  uint32_t m = 0;
  (void)in, (void)nin;
  coll_axes_mask(p, &m);
  return m;
}

/* ---- psum, pmax, pmin ------------------------------------------------------------ */

int coll_shape_same(const AVal *in, int nin, AVal *out) {
  if (nin != 1) return err_set(ERR_TYPE, "expected one operand"), -1;
  aval_copy(out, &in[0]);
  return 0;
}

int coll_shape_psum(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)p;
  return coll_shape_same(in, nin, out);
}
int coll_shape_pmax(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)p;
  return coll_shape_same(in, nin, out);
}
int coll_shape_pmin(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)p;
  return coll_shape_same(in, nin, out);
}

/* The part [q] of [n] of array [a]: a flat range when [flat] (the arrays
 * are contiguous), else a range of rows along dimension 0. */
static void part_view(View *v, const Array *a, bool flat, int q, int n) {
  if (flat) {
    int64_t lo = a->size * q / n, hi = a->size * (q + 1) / n;
    v->base = (char *)arr_data(a) + lo * (int64_t)dt_size(a->dtype);
    v->esize = dt_size(a->dtype);
    v->ndim = 1;
    v->shape[0] = hi - lo;
    v->strides[0] = 1;
    return;
  }
  int64_t lo = a->shape[0] * q / n, hi = a->shape[0] * (q + 1) / n;
  coll_view_of(v, a);
  coll_view_slice(v, 0, lo, hi - lo);
}

Array *coll_peer_out(const Call *c, int q) {
  return c->g->slots[c->peers[q]].out[0];
}

/* Small reductions: every participant folds all operands itself, in
 * participant order (the same bits everywhere), saving the barrier that
 * splitting the work needs; a barrier costs more than the arithmetic.
 * Strided fallback for outputs that are not contiguous. */
static bool fold_flat(const Call *c, const RedArg *r, Array *out);

static void fold_into(const Call *c, const RedArg *r, Array *out) {
  if (fold_flat(c, r, out)) return;
  View dst, src;
  coll_view_of(&dst, out);
  for (int q = 0; q < c->n; q++) {
    coll_view_of(&src, coll_peer_in(c, q, 0));
    if (q == 0)
      coll_view_copy(&dst, &src);
    else
      coll_view_each2(&dst, &src, coll_inner_reduce, r);
  }
}

static void fold_all(const Call *c, const RedArg *r) { fold_into(c, r, c->out[0]); }

/* Whether [a] is a run of memory apart from the [bytes] at [o]. */
static bool flat_apart(const Array *a, const char *o, size_t bytes) {
  const char *p = arr_data(a);
  return (a->contiguous || a->ndim == 0) &&
         (p + (size_t)a->size * dt_size(a->dtype) <= o || o + bytes <= p);
}

/* fold_into when the output and every operand are runs of memory apart
 * from each other: the contiguous folds (red_first, red_next: the same
 * bits as the views' coll_inner_reduce) without setting up views, which is
 * most of a small collective's fold.  False when it does nothing. */
static bool fold_flat(const Call *c, const RedArg *r, Array *out) {
  char *o = arr_data(out);
  int64_t n = out->size;
  size_t bytes = (size_t)n * dt_size(out->dtype);
  if (c->n < 2 || !(out->contiguous || out->ndim == 0)) return false;
  for (int q = 0; q < c->n; q++)
    if (!flat_apart(coll_peer_in(c, q, 0), o, bytes) || coll_peer_in(c, q, 0)->size != n) return false;
  red_first(r, o, arr_data(coll_peer_in(c, 0, 0)), arr_data(coll_peer_in(c, 1, 0)), n);
  for (int q = 2; q < c->n; q++) red_next(r, o, arr_data(coll_peer_in(c, q, 0)), n);
  return true;
}

/* Strided fallback of fast_reduce: reduce-scatter into the own output,
 * a barrier, then an all-gather copy from the peers' outputs. */
static void reduce_strided(const Call *c, const RedArg *r) {
  bool flat = true;
  for (int q = 0; q < c->n; q++) flat = flat && coll_peer_in(c, q, 0)->contiguous;
  flat = flat || c->out[0]->ndim == 0;
  View dst, src;
  part_view(&dst, c->out[0], flat, c->pos, c->n);
  for (int q = 0; q < c->n; q++) {
    part_view(&src, coll_peer_in(c, q, 0), flat, c->pos, c->n);
    if (q == 0)
      coll_view_copy(&dst, &src);
    else
      coll_view_each2(&dst, &src, coll_inner_reduce, r);
  }
  coll_barrier((Call *)c);
  for (int q = 0; q < c->n; q++) {
    if (q == c->pos) continue;
    part_view(&dst, c->out[0], flat, q, c->n);
    part_view(&src, coll_peer_out(c, q), flat, q, c->n);
    coll_view_copy(&dst, &src);
  }
}

/* [n] elements of size [es] at element stride [st] from [src] into [dst]. */
static void read_run(char *dst, const char *src, int64_t n, int64_t st,
                     size_t es) {
  if (st == 1) {
    memcpy(dst, src, (size_t)n * es);
  } else if (st == 0 && n > 0) {
    /* a broadcast (ones(), full()): fill by doubling copies */
    size_t have = es, want = (size_t)n * es;
    memcpy(dst, src, es);
    for (; have < want; have *= 2)
      memcpy(dst + have, dst, have < want - have ? have : want - have);
  } else if (es == 4) {
    for (int64_t i = 0; i < n; i++)
      memcpy(dst + i * 4, src + i * st * 4, 4);
  } else if (es == 8) {
    for (int64_t i = 0; i < n; i++)
      memcpy(dst + i * 8, src + i * st * 8, 8);
  } else {
    for (int64_t i = 0; i < n; i++)
      memcpy(dst + i * (int64_t)es, src + i * st * (int64_t)es, es);
  }
}

void coll_read_flat(char *dst, const Array *a, int64_t lo, int64_t len) {
  size_t es = dt_size(a->dtype);
  int nd = a->ndim;
  int64_t idx[SHM_MAXDIM];
  coll_unravel(lo, nd, a->shape, idx);
  const char *base = arr_data(a);
  int64_t inner = a->shape[nd - 1], st = a->strides[nd - 1];
  while (len > 0) {
    int64_t off = 0;
    for (int d = 0; d < nd; d++) off += idx[d] * a->strides[d];
    int64_t run = inner - idx[nd - 1];
    if (run > len) run = len;
    read_run(dst, base + off * (int64_t)es, run, st, es);
    dst += run * (int64_t)es;
    len -= run;
    idx[nd - 1] += run;
    for (int d = nd - 1; d > 0 && idx[d] == a->shape[d]; d--) {
      idx[d] = 0;
      idx[d - 1]++;
    }
  }
}

/* Contiguous operand of chunk [lo, lo + len) of [a]: a pointer into a
 * contiguous array, else the chunk read into [scratch]. */
static const char *chunk_of(const Array *a, int64_t lo, int64_t len,
                            char *scratch) {
  if (a->contiguous || a->ndim == 0)
    return (const char *)arr_data(a) + lo * (int64_t)dt_size(a->dtype);
  coll_read_flat(scratch, a, lo, len);
  return scratch;
}

/* Fold of chunk [lo, lo + len) of every participant's operand, in
 * participant order, into [acc] (len elements). */
static void fold_chunk(const Call *c, const RedArg *r, char *acc, int64_t lo,
                       int64_t len, char *scratch) {
  size_t es = dt_size(r->dtype);
  const char *a = chunk_of(coll_peer_in(c, 0, 0), lo, len, scratch);
  int q = 1;
  if (c->n == 1 || a == scratch) {
    memcpy(acc, a, (size_t)len * es);  /* the scratch is needed again */
  } else {
    red_first(r, acc, a, chunk_of(coll_peer_in(c, 1, 0), lo, len, scratch), len);
    q = 2;
  }
  for (; q < c->n; q++)
    red_next(r, acc, chunk_of(coll_peer_in(c, q, 0), lo, len, scratch), len);
}

/* Elements [lo, hi), a chunk at a time, folded into a buffer that stays
 * in L1 and copied from there into [dst]: the own output for a small
 * reduction that each participant folds whole, the first participant's
 * output (which every participant then shares, coll_share_output) for a split
 * one, or with [dst] NULL every participant's output.  The all-gather is
 * thus one write per output and needs no barrier of its own (the final
 * barrier publishes the writes).  Copying out of a hot buffer, rather
 * than folding into the output, lets memcpy's string stores skip reading
 * the output lines. */
static void fold_range(const Call *c, const RedArg *r, int64_t lo, int64_t hi,
                       Array *dst) {
  _Alignas(64) char scratch[COLL_CHUNK_BYTES], acc[COLL_CHUNK_BYTES];
  size_t es = dt_size(r->dtype);
  int64_t chunk = COLL_CHUNK_BYTES / (int64_t)es;
  for (int64_t i = lo; i < hi; i += chunk) {
    int64_t len = hi - i < chunk ? hi - i : chunk;
    fold_chunk(c, r, acc, i, len, scratch);
    for (int q = 0; q < (dst ? 1 : c->n); q++)
      memcpy((char *)arr_data(dst ? dst : coll_peer_out(c, q)) + i * (int64_t)es, acc,
             (size_t)len * es);
  }
}

bool coll_can_share(const Call *c) {
  if (c->xin) return false;
  for (int q = 0; q < c->n; q++)
    if (!c->g->slots[c->peers[q]].shareable) return false;
  return true;
}

void coll_share_output(const Call *c) {
  if (c->pos != 0) arr_share_buffer(c->out[0], coll_peer_out(c, 0));
}

/* Start of participant q's part of [size] elements: cache-line aligned,
 * so no two participants write one line of an output. */
static int64_t part_start(int64_t size, size_t es, int q, int n) {
  if (q == n) return size;
  int64_t line = 64 / (int64_t)es;
  int64_t lo = size * q / n;
  return lo - lo % line;
}

/* Participant pos folds its part of every operand, in participant order,
 * and writes it into every participant's output (reduce-scatter and
 * all-gather in one pass); small reductions are folded whole by each. */
static int fast_reduce(const Call *c, const RedArg *r) {
  bool contiguous = true;
  for (int q = 0; q < c->n; q++)
    contiguous = contiguous && (coll_peer_out(c, q)->contiguous ||
                                coll_peer_out(c, q)->ndim == 0);
  int64_t size = c->out[0]->size;
  bool small = size * c->n <= COLL_SMALL_REDUCE;
  if (!contiguous && small)
    fold_all(c, r);
  else if (!contiguous)
    reduce_strided(c, r);
  else if (small)
    fold_range(c, r, 0, size, c->out[0]);
  else {
    bool share = coll_can_share(c);
    fold_range(c, r, part_start(size, dt_size(r->dtype), c->pos, c->n),
               part_start(size, dt_size(r->dtype), c->pos + 1, c->n),
               share ? coll_peer_out(c, 0) : NULL);
    if (share) coll_share_output(c);
  }
  return 0;
}

/* Reference: every operand gathered, then one fold in participant order. */
static int ref_reduce(const Call *c, const RedArg *r) {
  Global gl;
  if (coll_global_gather(&gl, c, 0) < 0) return -1;
  View dst, src = gl.blockview;
  coll_view_of(&dst, c->out[0]);
  for (int q = 0; q < c->n; q++) {
    src.base = gl.data + (size_t)q * (size_t)gl.block * src.esize;
    if (q == 0)
      coll_view_copy(&dst, &src);
    else
      coll_view_each2(&dst, &src, coll_inner_reduce, r);
  }
  coll_global_free(&gl);
  return 0;
}

/* Participant q's operand in a lane reduction: the caller's own from its
 * operand when contiguous (the same bytes as its lane, which may live on
 * the line peers poll: reading it could wait for that line to come back),
 * else the lane. */
static const char *lane_src(const Call *c, int q, size_t bytes) {
  const Array *x = c->in[0];
  if (q == c->pos && (x->contiguous || x->ndim == 0)) return arr_data(x);
  return coll_lane_data(&c->g->slots[c->peers[q]], (int)(c->seq % 2), bytes);
}

/* A lane reduction: every participant folds the operands copied into the
 * participants' lanes, in participant order, into its own output. */
static void lane_reduce(const Call *c, const RedArg *r) {
  _Alignas(64) char acc[COLL_LANE_BYTES];
  Array *o = c->out[0];
  int64_t n = o->size;
  size_t bytes = (size_t)n * dt_size(o->dtype);
  red_first(r, acc, lane_src(c, 0, bytes), lane_src(c, 1, bytes), n);
  for (int q = 2; q < c->n; q++) red_next(r, acc, lane_src(c, q, bytes), n);
  if (o->contiguous || o->ndim == 0) {
    memcpy(arr_data(o), acc, (size_t)n * dt_size(o->dtype));
    return;
  }
  View dst, from;
  coll_view_of(&dst, o);
  from = dst;
  from.base = acc;
  for (int d = dst.ndim - 1, st = 1; d >= 0; st *= (int)dst.shape[d], d--)
    from.strides[d] = st;
  coll_view_copy(&dst, &from);
}

/* The leader's step of a small reduction across processes (an
 * XExchange, after coll_x_exchange; arg: the RedArg): every operand folded
 * in participant order, the fold each participant would compute, into the
 * leader slot's xres: its own output when it is the process's only
 * participant (nobody else reads it), else an array of its own kept from
 * call to call. */
static int x_fold_lead(const Call *c, const XLocal *lc, const void *r) {
  Slot *me = &c->g->slots[c->rank];
  Array *o = c->out[0], *res = me->xsmall;
  if (lc->n == 1) {
    fold_all(c, r);
    me->xres = o;
    return 0;
  }
  if (!res || res->dtype != o->dtype || res->ndim != o->ndim ||
      memcmp(res->shape, o->shape, sizeof(int64_t) * (size_t)o->ndim) != 0 ||
      !arr_sole_holder(res)) {
    val_decref(res ? &res->hdr : NULL);
    if (!(res = me->xsmall = arr_new(o->dtype, o->ndim, o->shape))) return -1;
  }
  fold_into(c, r, res);
  me->xres = res;
  return 0;
}

/* Every local participant's output after x_fold_lead: a copy of the
 * leader's result. */
static int x_take_copy(const Call *c, const void *arg) {
  (void)arg;
  int lead = 0;
  while (!coll_x_local(c->g, c->peers[lead])) lead++;
  const Array *res = c->g->slots[c->peers[lead]].xres;
  Array *o = c->out[0];
  if (o == res) return 0;
  if (o->contiguous || o->ndim == 0) {
    memcpy(arr_data(o), arr_data(res), (size_t)o->size * dt_size(o->dtype));
    return 0;
  }
  View dst, src;
  coll_view_of(&dst, o);
  coll_view_of(&src, res);
  coll_view_copy(&dst, &src);
  return 0;
}

/* ---- reductions across processes: reduce-scatter, then all-gather ------------ */

/* Reductions across processes of at least this many bytes go by
 * reduce-scatter and all-gather between the processes (x_reduce): each
 * process receives a 1/P chunk of the operands and sends a 1/P chunk of
 * the result, as MPI_Allreduce's ring does.  Smaller ones send every
 * operand to every process (coll_x_exchange): one round of messages. */
#define COLL_XRS_BYTES 32768

/* Which reduction takes the reduce-scatter path: the same answer on
 * every process, as it depends on the descriptor (dtype, shape) alone. */
static bool x_reduce_split(const Call *c) {
  return (size_t)c->in[0]->size * dt_size(c->in[0]->dtype) >= COLL_XRS_BYTES;
}

/* The reduce-scatter plan of collective [c], the same on every process.
 * Process procs[k] owns elements [lo[k], lo[k + 1]) of the result.  The
 * first plen participants live on one process (the first participant's),
 * which folds them before sending: the fold stays in participant order,
 * ((d0 + d1) + d2) + d3, so the bits are a one-process run's. */
typedef struct XPlan {
  int np, me;                     /* processes holding participants; this one's index */
  int *procs;                     /* [np] increasing */
  int64_t *lo;                    /* [np + 1] element bounds, cut at cache lines */
  int plen;                       /* participants folded before sending */
  size_t es;                      /* element size */
} XPlan;

/* Fills [x] (its arrays from [procs] [n + 1] and [lo] [n + 2]). */
static void x_plan(const Call *c, XPlan *x, int *procs, int64_t *lo) {
  CollGroup *g = c->g;
  int me = transport_rank();
  x->procs = procs;
  x->np = coll_x_procs(c, procs + 1) + 1;
  procs[0] = me;
  for (int j = 1; j < x->np && procs[j - 1] > procs[j]; j++) {   /* me into order */
    int t = procs[j]; procs[j] = procs[j - 1]; procs[j - 1] = t;
  }
  for (x->me = 0; procs[x->me] != me; x->me++) {}
  x->es = dt_size(c->in[0]->dtype);
  x->lo = lo;
  for (int k = 0; k <= x->np; k++) lo[k] = part_start(c->in[0]->size, x->es, k, x->np);
  int p0 = coll_x_proc(g, c->peers[0]);
  for (x->plen = 1; x->plen < c->n && coll_x_proc(g, c->peers[x->plen]) == p0; x->plen++) {}
}

/* The participants whose pieces process [proc] sends to each owner, in
 * participant order, into [qs]; their number.  Position 0 stands for the
 * folded prefix (participants 0 .. plen - 1). */
static int x_pieces(const Call *c, const XPlan *x, int proc, int *qs) {
  int m = 0;
  for (int q = 0; q < c->n; q++)
    if ((q == 0 || q >= x->plen) && coll_x_proc(c->g, c->peers[q]) == proc) qs[m++] = q;
  return m;
}

/* dst[0 .. len) = src[0] (op) src[1] (op) ... src[m - 1], left to right,
 * a cache-sized chunk at a time (dst stays in L1 across the operands).
 * src[0] may be dst itself; no other source overlaps dst. */
static void x_fold_pieces(const RedArg *r, char *dst, const char *const *src, int m,
                          int64_t len) {
  size_t es = dt_size(r->dtype);
  int64_t step = COLL_CHUNK_BYTES / (int64_t)es;
  for (int64_t i = 0; i < len; i += step) {
    int64_t k = len - i < step ? len - i : step;
    size_t off = (size_t)i * es;
    int q = 1;
    if (src[0] != dst && m == 1)
      memcpy(dst + off, src[0] + off, (size_t)k * es);
    else if (src[0] != dst) {
      red_first(r, dst + off, src[0] + off, src[1] + off, k);
      q = 2;
    }
    for (; q < m; q++) red_next(r, dst + off, src[q] + off, k);
  }
}

/* State of one leader's x_reduce. */
typedef struct XReduce {
  const Call *c;
  const RedArg *r;
  XPlan x;
  char *res;                      /* the result, contiguous (the leader slot's xres) */
  const char **op;                /* [n]: local participants' contiguous data */
  Array **copies;                 /* [n]: contiguous copies made for op */
  const char **from;              /* [n]: piece of each participant for this
                                     process's chunk */
  char *scratch;                  /* received pieces */
  size_t scratch_bytes;
  char *h;                        /* the header sent (coll_x_wire_cap) */
  void **reqs;                    /* [2 * np]: pieces sent, then the chunk sent */
  int nreqs;
} XReduce;

/* This process's piece of participant [q] (0: the prefix) at element [lo]. */
static const char *x_own_piece(const XReduce *s, int q, int64_t lo) {
  const char *base = q == 0 && s->x.plen > 1 ? s->res : s->op[q];
  return base + (size_t)lo * s->x.es;
}

/* Sends the header, then to every other process its chunk of this
 * process's pieces. */
static void x_reduce_send(XReduce *s, const XLocal *lc) {
  const Call *c = s->c;
  int qs[c->n], m = x_pieces(c, &s->x, transport_rank(), qs);
  int key = coll_x_key(c->g, c->seq, c->peers[0]);
  TransportIov hv = {s->h, coll_x_header_pack(s->h, c, lc, 0)}, iov[c->n];
  for (int k = 0; k < s->x.np; k++) {
    if (k == s->x.me) continue;
    int64_t lo = s->x.lo[k], len = s->x.lo[k + 1] - lo;
    for (int i = 0; i < m; i++)
      iov[i] = (TransportIov){(void *)x_own_piece(s, qs[i], lo), (size_t)len * s->x.es};
    int p = s->x.procs[k];
    s->reqs[s->nreqs++] = transport_isend(p, transport_tag(TRANSPORT_HEADER, key), &hv, 1);
    s->reqs[s->nreqs++] = transport_isend(p, transport_tag(TRANSPORT_DATA, key), iov, m);
  }
}

/* Receives every other process's header and its pieces of this process's
 * chunk (the prefix straight into the result), filling s->from. */
static int x_reduce_gather(XReduce *s) {
  const Call *c = s->c;
  int key = coll_x_key(c->g, c->seq, c->peers[0]), qs[c->n];
  int64_t lo = s->x.lo[s->x.me];
  size_t bytes = (size_t)(s->x.lo[s->x.me + 1] - lo) * s->x.es;
  char *next = s->scratch;
  for (int k = 0; k < s->x.np; k++) {
    int p = s->x.procs[k], m = x_pieces(c, &s->x, p, qs);
    if (k == s->x.me) {
      for (int i = 0; i < m; i++) s->from[qs[i]] = x_own_piece(s, qs[i], lo);
      continue;
    }
    TransportMsg *hm = coll_x_wait_header(c, p, transport_tag(TRANSPORT_HEADER, key));
    if (!hm) return -1;
    XHeader h;
    int rc = coll_x_header_read(hm, &h) < 0 ? -1
             : coll_desc_equal(&h.desc, &c->desc)
                 ? 0 : coll_mismatch_error(c->g, c->rank, &c->desc, h.ranks[0], &h.desc);
    transport_msg_free(hm);
    if (rc < 0) return -1;
    TransportIov iov[c->n];
    for (int i = 0; i < m; i++) {
      char *at = qs[i] == 0 ? s->res + (size_t)lo * s->x.es : (next += bytes) - bytes;
      s->from[qs[i]] = at;
      iov[i] = (TransportIov){at, bytes};
    }
    if (transport_recv_data(p, transport_tag(TRANSPORT_DATA, key), iov, m) < 0) return -1;
  }
  return 0;
}

/* Folds this process's chunk from every piece, in participant order,
 * sends it to every other process and receives theirs into the result. */
static int x_reduce_fold(XReduce *s) {
  const Call *c = s->c;
  const XPlan *x = &s->x;
  int m = 0, key = coll_x_key(c->g, c->seq, c->peers[0]), tag = transport_tag(TRANSPORT_DATA, key);
  const char *src[c->n];
  for (int q = 0; q < c->n; q++)
    if (q == 0 || q >= x->plen) src[m++] = s->from[q];
  int64_t lo = x->lo[x->me], len = x->lo[x->me + 1] - lo;
  char *mine = s->res + (size_t)lo * x->es;
  x_fold_pieces(s->r, mine, src, m, len);
  TransportIov v = {mine, (size_t)len * x->es};
  int sent = s->nreqs;
  for (int k = 0; k < x->np; k++)
    if (k != x->me) s->reqs[s->nreqs++] = transport_isend(x->procs[k], tag, &v, 1);
  /* the pieces sent came from the result's other chunks: done before
   * those are overwritten */
  transport_wait_sends(s->reqs, sent);
  for (int k = 0; k < x->np; k++) {
    if (k == x->me) continue;
    TransportIov in = {s->res + (size_t)x->lo[k] * x->es,
                       (size_t)(x->lo[k + 1] - x->lo[k]) * x->es};
    if (coll_x_wait_data(c, x->procs[k], tag, &in, 1) < 0) return -1;
  }
  return 0;
}

/* The result's buffer: the leader's output when contiguous, else an
 * array of its own; NULL when out of memory. */
static Array *x_result(const Call *c) {
  Array *o = c->out[0];
  if (o->contiguous || o->ndim == 0) return o;
  return arr_new(o->dtype, o->ndim, o->shape);
}

/* The leader's exchange of a large reduction (an XExchange; arg: the
 * RedArg): the operands' chunks to their owners, the owners' folded
 * chunks back, into the leader slot's xres. */
static int x_reduce(const Call *c, const XLocal *lc, const void *arg) {
  Slot *me = &c->g->slots[c->rank];
  int n = c->n, procs[n + 1];
  int64_t lo[n + 2];
  XReduce s = {.c = c, .r = arg};
  x_plan(c, &s.x, procs, lo);
  size_t chunk = (size_t)(lo[s.x.me + 1] - lo[s.x.me]) * s.x.es;
  me->xres = x_result(c);
  s.op = shm_calloc((size_t)n, sizeof(char *));
  s.copies = shm_calloc((size_t)n, sizeof(Array *));
  s.from = shm_calloc((size_t)n, sizeof(char *));
  s.reqs = shm_calloc((size_t)(3 * s.x.np), sizeof(void *));
  s.scratch_bytes = chunk * (size_t)n + 1;
  s.scratch = shm_buf_alloc(s.scratch_bytes);
  s.h = shm_malloc(coll_x_wire_cap(lc->n));
  int rc = me->xres && s.op && s.copies && s.from && s.reqs && s.scratch && s.h
               ? 0 : (err_nomem(), -1);
  for (int q = 0; rc == 0 && q < n; q++) {
    if (!coll_x_local(c->g, c->peers[q])) continue;
    Array *a = c->g->slots[c->peers[q]].in[0];
    if (!a->contiguous && a->ndim > 0 && !(a = s.copies[q] = arr_contiguous(a))) rc = -1;
    else s.op[q] = arr_data(a);
  }
  if (rc == 0) {
    s.res = arr_data(me->xres);
    if (coll_x_proc(c->g, c->peers[0]) == transport_rank() && s.x.plen > 1)
      x_fold_pieces(s.r, s.res, s.op, s.x.plen, c->in[0]->size);   /* the prefix */
    x_reduce_send(&s, lc);
    rc = x_reduce_gather(&s);
    if (rc == 0) rc = x_reduce_fold(&s);
  }
  coll_x_wait_sends(c, s.reqs, s.nreqs, rc);
  for (int q = 0; s.copies && q < n; q++) val_decref(s.copies[q] ? &s.copies[q]->hdr : NULL);
  shm_free(s.op), shm_free(s.copies), shm_free(s.from), shm_free(s.reqs), shm_free(s.h);
  if (s.scratch) shm_buf_free(s.scratch, s.scratch_bytes);
  return rc;
}

/* Every local participant's output from the leader's result: shared, or
 * copied when either payload is inline or the output is not contiguous. */
static int x_take_result(const Call *c, const void *arg) {
  (void)arg;
  int lead = 0;
  while (!coll_x_local(c->g, c->peers[lead])) lead++;
  Array *res = c->g->slots[c->peers[lead]].xres, *o = c->out[0];
  if (o == res || ((o->contiguous || o->ndim == 0) && arr_share_buffer(o, res))) return 0;
  View dst, src;
  coll_view_of(&dst, o);
  coll_view_of(&src, res);
  coll_view_copy(&dst, &src);
  return 0;
}

/* Semantics: jax.lax.psum / pmax / pmin with axis_index_groups. */
static int reduce_kernel(PrimId kind, RedOp op, Array **in, const Params *p,
                         Array **out) {
  Call c;
  if (coll_call_init(&c, kind, p, in, 1, out) < 0) return -1;
  if (c.cross) {
    RedArg r = {in[0]->dtype, op};
    if (x_reduce_split(&c)) return coll_x_run(&c, x_reduce, x_take_result, &r, NULL);
    return coll_x_run(&c, coll_x_exchange, x_take_copy, &r, x_fold_lead);
  }
  bool lane = coll_uses_lane(&c, in[0]);
  if (lane) coll_lane_write(&c, in[0]);
  if (coll_rendezvous(&c) < 0) return -1;
  RedArg r = {in[0]->dtype, op};
  if (lane) {
    lane_reduce(&c, &r);
    coll_finish(&c);
    return 0;
  }
  int rc = c.g->reference ? ref_reduce(&c, &r) : fast_reduce(&c, &r);
  coll_leave(&c);
  return rc;
}

int coll_kernel_psum(Array **in, int nin, const Params *p, Array **out) {
  (void)nin;
  return reduce_kernel(P_PSUM, RED_SUM, in, p, out);
}
int coll_kernel_pmax(Array **in, int nin, const Params *p, Array **out) {
  (void)nin;
  return reduce_kernel(P_PMAX, RED_MAX, in, p, out);
}
int coll_kernel_pmin(Array **in, int nin, const Params *p, Array **out) {
  (void)nin;
  return reduce_kernel(P_PMIN, RED_MIN, in, p, out);
}

uint32_t coll_vma_psum(const uint32_t *in, int nin, const Params *p) {
  return coll_vma_remove(in, nin, p);
}
uint32_t coll_vma_pmax(const uint32_t *in, int nin, const Params *p) {
  return coll_vma_remove(in, nin, p);
}
uint32_t coll_vma_pmin(const uint32_t *in, int nin, const Params *p) {
  return coll_vma_remove(in, nin, p);
}

/* ==== psum, pmax, pmin, pvary: differentiation and batching ================= */

/* ---- JVP ------------------------------------------------------------------ */

COLL_JVP_LINEAR(psum, PSUM)
COLL_JVP_LINEAR(pvary, PVARY)

/* pmax/pmin: the mean of the tangents of the devices holding the
 * extremum, as reduce_max's rule over the devices. */
static int jvp_chooser(PrimId id, Value **x, Value **t, const Params *p, Value **yo, Value **to) {
  *to = NULL;
  if (!(*yo = coll_rule_apply(id, 1, x, (Params *)p, false))) return -1;
  if (!t[0]) return 0;
  AVal a;
  Params q;
  Value *eq = NULL, *at = NULL, *num = NULL, *den = NULL, *prod = NULL;
  if (prim_value_aval(x[0], &a) == 0 && (eq = coll_rule_apply(P_EQ, 2, (Value *[]){x[0], *yo}, NULL, false))) {
    params_init(&q);
    params_add(&q, "new_dtype", dtype_value(a.dtype));
    params_add(&q, "weak_type", val_bool(a.weak));
    at = coll_rule_apply(P_CONVERT_ELEMENT_TYPE, 1, &eq, &q, true);
  }
  Params none;
  params_init(&none);
  if (at) prod = coll_rule_apply(P_MUL, 2, (Value *[]){t[0], at}, &none, false);
  Params s;
  if (prod) {
    coll_params_except(&s, p, NULL);
    num = coll_rule_apply(P_PSUM, 1, &prod, &s, true);
    coll_params_except(&s, p, NULL);
    den = coll_rule_apply(P_PSUM, 1, &at, &s, true);
  }
  if (num && den) *to = coll_rule_apply(P_DIV, 2, (Value *[]){num, den}, &none, false);
  Value *tmp[] = {eq, at, num, den, prod};
  for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
    if (tmp[i]) val_decref(tmp[i]);
  if (*to) return 0;
  val_decref(*yo);
  *yo = NULL;
  return -1;
}
static int jvp_pmax(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  (void)nin;
  return jvp_chooser(P_PMAX, x, t, p, yo, to);
}
static int jvp_pmin(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  (void)nin;
  return jvp_chooser(P_PMIN, x, t, p, yo, to);
}

/* ---- transpose --------------------------------------------------------------- */

/* psum: pvary (the cotangent back unchanged), summed over the axes its
 * operand was invariant over. */
static int tr_psum(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                   const Params *p, Value **cts) {
  (void)in, (void)lin, (void)nin;
  uint32_t extra;
  /* grouped, the result varies: each device's sum of its group's
   * cotangents; under check_vma=False psum transposes to psum (JAX's, as
   * pmap's: LANGUAGE.md §11) */
  if (coll_grouped(p) || (dev_ctx() && dev_ctx()->mesh && !dev_checks_vma()))
    return (cts[0] = coll_rule_apply(P_PSUM, 1, ct, (Params *)p, false)) ? 0 : -1;
  if (coll_invariant_axes(p, &av[0], &extra) < 0) return -1;
  return (cts[0] = coll_psum_over(ct[0], extra)) ? 0 : -1;
}

/* ---- batching over mesh axes (a vmap inside or around a body) -------------- */

COLL_BATCH_SAME(psum, PSUM)
COLL_BATCH_SAME(pmax, PMAX)
COLL_BATCH_SAME(pmin, PMIN)
COLL_BATCH_SAME(pvary, PVARY)

/* ---- batching over a vmap or xmap axis the reduction names ---------------- */

/* [r] reduced across the mesh axes of [ax]'s resources too (consumed). */
static Value *across_resources(PrimId id, const CollNamedAxis *ax, Value *r) {
  if (!r || !ax->resources) return r;
  Params q;
  params_init(&q);
  params_add(&q, "axes", val_incref(ax->resources));
  params_add(&q, "axis_index_groups", val_incref(VAL_NONE));
  Value *s = prim_bind(id, 1, &r, &q);
  params_clear(&q);
  val_decref(r);
  return s;
}

static Value *named_reduce(PrimId id, Value *x, int d, const CollNamedAxis *ax, Value *rest,
                           const Params *p) {
  int64_t size = ax->size;
  PrimId red = prim_table[id].rules.coll->reduce;
  Value *r;
  if (d < 0) {   /* the same on every example: psum multiplies */
    Array *n = id == P_PSUM ? arr_scalar_i64(DT_I32, size, true) : NULL;
    r = n ? ops_binary(OP_MUL, &n->hdr, x) : val_incref(x);
    if (n) val_decref(&n->hdr);
  } else {
    Params q;
    params_init(&q);
    params_add(&q, "axes", val_int_tuple(1, (int64_t[]){d}));
    r = prim_apply(red, 1, &x, &q);
    params_clear(&q);
  }
  r = across_resources(id, ax, r);   /* then across the devices of the axis */
  if (!r || !rest) return r;
  Params q;   /* the mesh axes named beside it */
  params_init(&q);
  params_add(&q, "axes", val_incref(rest));
  Value *g = params_get(p, "axis_index_groups");
  params_add(&q, "axis_index_groups", val_incref(g ? g : VAL_NONE));
  Value *s = prim_bind(id, 1, &r, &q);
  params_clear(&q);
  val_decref(r);
  return s;
}

/* psum, pmax, pmin over the vmap axis itself: the positional reduction
 * of their row over the batch axis (a psum of a value the same for every
 * example multiplies it by the axis size), then across the mesh axes the
 * axis is split over and the mesh axes named beside it. */
static int batch_named_reduce(PrimId id, Value *x, int d, const CollNamedAxis *ax, Value *rest,
                              const Params *p, Value **out, int *od) {
  *od = -1;
  return (*out = named_reduce(id, x, d, ax, rest, p)) ? 0 : -1;
}

/* ---- pvary: the invariant-to-varying cast --------------------------------- */

static int shape_pvary(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)nin, (void)p;
  aval_copy(out, &in[0]);
  return 0;
}

/* A copy: the value is the same on every device, only its type changes. */
static int kernel_pvary(Array **in, int nin, const Params *p, Array **out) {
  return prim_table[P_COPY].rules.kernel(in, nin, p, out);
}

static uint32_t vma_pvary(const uint32_t *in, int nin, const Params *p) {
  uint32_t m = 0;
  (void)nin;
  if (!coll_axes_mask(p, &m)) m = 0;
  return in[0] | m;
}

/* pvary's transpose is psum over the axes it added: each device's
 * cotangent is a part of the invariant value's. */
static int tr_pvary(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                    const Params *p, Value **cts) {
  (void)in, (void)lin, (void)nin;
  uint32_t m = 0;
  if (!coll_axes_mask(p, &m)) m = 0;
  return (cts[0] = coll_psum_over(ct[0], m & ~av[0].vma)) ? 0 : -1;
}

/* A ring all-reduce: a reduce-scatter then an all-gather of the 1/n
 * pieces, each n - 1 rounds (psum, pmax, pmin alike). */
static void traffic_all_reduce(double b, int n, CollTraffic *t) {
  *t = (CollTraffic){"ring all-reduce", 2 * b * (n - 1) / n, 2 * b * (n - 1) / n, 2 * (n - 1)};
}

/* ==== the rows ================================================================ */

/* psum, pmax, pmin and pvary have the element-wise sharding rule: in a
 * partial-manual shard_map's body, partitioned along its automatic axes
 * (transform/partition.c), they name only manual axes, so each block
 * along the automatic ones reduces with its peers of the other manual
 * groups, laid out as it came. */

static const CollRow reduce_rows[] = {
    {P_AXIS_INDEX, {.shape = coll_shape_axis_index, .kernel = coll_kernel_axis_index,
                    .vma = coll_vma_axis_index,
                    .coll = &(const CollRules){.named = COLL_NAMED_ADDS}}},
    {P_PSUM, {.shape = coll_shape_psum, .kernel = coll_kernel_psum, .vma = coll_vma_psum,
              .sharding = prim_sharding_elementwise,
              .batch = batch_psum, .jvp = jvp_psum, .transpose = tr_psum,
              .coll = &(const CollRules){.api_name = "psum", .named = COLL_NAMED_REMOVES,
                                         .reduces = true, .reduce = P_REDUCE_SUM,
                                         .named_batch = batch_named_reduce,
                                         .traffic = traffic_all_reduce}}},
    {P_PMAX, {.shape = coll_shape_pmax, .kernel = coll_kernel_pmax, .vma = coll_vma_pmax,
              .sharding = prim_sharding_elementwise,
              .batch = batch_pmax, .jvp = jvp_pmax,
              .coll = &(const CollRules){.api_name = "pmax", .named = COLL_NAMED_REMOVES,
                                         .reduces = true, .reduce = P_REDUCE_MAX,
                                         .named_batch = batch_named_reduce,
                                         .traffic = traffic_all_reduce}}},
    {P_PMIN, {.shape = coll_shape_pmin, .kernel = coll_kernel_pmin, .vma = coll_vma_pmin,
              .sharding = prim_sharding_elementwise,
              .batch = batch_pmin, .jvp = jvp_pmin,
              .coll = &(const CollRules){.api_name = "pmin", .named = COLL_NAMED_REMOVES,
                                         .reduces = true, .reduce = P_REDUCE_MIN,
                                         .named_batch = batch_named_reduce,
                                         .traffic = traffic_all_reduce}}},
    {P_PVARY, {.shape = shape_pvary, .kernel = kernel_pvary, .vma = vma_pvary,
               .sharding = prim_sharding_elementwise,
               .batch = batch_pvary, .jvp = jvp_pvary, .transpose = tr_pvary,
               .coll = &(const CollRules){.named = COLL_NAMED_KEEPS}}},
};

void coll_reduce_register(void) {
  coll_register_rows(reduce_rows, sizeof reduce_rows / sizeof *reduce_rows);
}
