/*
 * prim_reduce.c - the reductions and cumulative primitives (reduce_sum,
 * reduce_max, reduce_min, reduce_prod, reduce_and, reduce_or, argmax,
 * argmin, cumsum, cumprod, cummax): for each, side by side in its row at
 * the end of the file, the shape and dtype rule, the kernel
 * (kern_reduce.c), the batching rule and the JVP and transpose rules.
 * Semantics: jax.lax's reductions and cumulative reductions
 * (jax/_src/lax/lax.py, control_flow/loops.py's cumred rules).
 */
#include "array/prim_rules.h"

/* ==== shape and dtype rules ================================================ */


/* ---- reductions ------------------------------------------------------------------- */

static int shape_reduce(PrimId id, const AVal *in, const Params *p, AVal *out) {
  int n;
  int64_t axes[SHM_MAXDIM], shape[SHM_MAXDIM];
  bool mask[SHM_MAXDIM];
  if (prim_check_dtype(id, in[0].dtype) < 0 ||
      prim_dims(id, p, "axes", in[0].ndim, &n, axes, mask) < 0)
    return -1;
  int k = 0;
  for (int i = 0; i < in[0].ndim; i++)
    if (!mask[i])
      shape[k++] = in[0].shape[i];
  prim_set(out, in[0].dtype, in[0].weak, k, shape);
  return 0;
}

#define REDUCE_RULE(NAME, ID)                                                  \
  static int NAME(const AVal *in, int nin, const Params *p, AVal *out) {     \
    return shape_reduce(ID, in, p, out);                                     \
  }

static int shape_argreduce(PrimId id, const AVal *in, const Params *p, AVal *out) {
  int n;
  int64_t axes[SHM_MAXDIM];
  bool mask[SHM_MAXDIM];
  DType t;
  if (prim_dims(id, p, "axes", in[0].ndim, &n, axes, mask) < 0 ||
      params_dtype(p, "index_dtype", &t) < 0)
    return -1;
  if (n != 1 || !dt_is_int(t)) {
    err_set(ERR_VALUE, "%s requires one axis and an integer index_dtype", prim_table[id].name);
    return -1;
  }
  if (in[0].shape[axes[0]] == 0) {
    err_set(ERR_VALUE, "attempt to get %s of an empty sequence", prim_table[id].name);
    return -1;
  }
  if (shape_reduce(P_REDUCE_MAX, in, p, out) < 0)
    return -1;
  out->dtype = t;
  out->weak = false;
  return 0;
}

static int shape_scan(PrimId id, const AVal *in, const Params *p, AVal *out) {
  int64_t axis;
  int ax;
  bool rev;
  if (prim_check_dtype(id, in[0].dtype) < 0 || params_int(p, "axis", &axis) < 0 ||
      axis_normalize(axis, in[0].ndim, &ax) < 0)
    return -1;
  if (params_get(p, "reverse") && params_bool(p, "reverse", &rev) < 0)
    return -1;
  aval_copy(out, &in[0]);
  return 0;
}

static int shape_argmax(const AVal *in, int nin, const Params *p, AVal *out) {
  return shape_argreduce(P_ARGMAX, in, p, out);
}
static int shape_argmin(const AVal *in, int nin, const Params *p, AVal *out) {
  return shape_argreduce(P_ARGMIN, in, p, out);
}
#define SCAN_RULE(NAME, ID)                                                    \
  static int NAME(const AVal *in, int nin, const Params *p, AVal *out) {     \
    return shape_scan(ID, in, p, out);                                       \
  }

/* ==== JVP rules ============================================================ */

/* The result broadcast back over the reduced [axes] of an operand of
 * aval [a]. */
static Value *unreduce(Scope *s, Value *y, const AVal *a, int n, const int64_t *axes) {
  int64_t kept[SHM_MAXDIM];
  int nk = 0;
  for (int i = 0; i < a->ndim; i++) {
    bool red = false;
    for (int k = 0; k < n; k++) red |= axes[k] == i;
    if (!red) kept[nk++] = i;
  }
  return bcast(s, y, a->ndim, a->shape, nk, kept);
}

/* reduce_max/min: the mean of the tangents at the positions that attain
 * the result (JAX's chooser rule). */
static int jvp_chooser(PrimId id, Value **x, Value **t, const Params *p, Value **yo, Value **to) {
  if (primal(id, x, 1, p, yo) < 0) return -1;
  *to = NULL;
  if (!t[0]) return 0;
  Scope s = {0};
  AVal a;
  int n;
  int64_t axes[SHM_MAXDIM];
  if (prim_value_aval(x[0], &a) < 0 || ints(p, "axes", &n, axes) < 0)
    return jvp_done(&s, NULL, false, yo, to);
  Value *at = convert(&s, bin(&s, P_EQ, x[0], unreduce(&s, *yo, &a, n, axes)), a.dtype, a.weak);
  Value *num = reduce_sum(&s, mul(&s, t[0], at), n, axes);
  return jvp_done(&s, dvd(&s, num, reduce_sum(&s, at, n, axes)), false, yo, to);
}
static int jvp_reduce_max(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  (void)nin;
  return jvp_chooser(P_REDUCE_MAX, x, t, p, yo, to);
}
static int jvp_reduce_min(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  (void)nin;
  return jvp_chooser(P_REDUCE_MIN, x, t, p, yo, to);
}

/* [x] with the reduced [axes] moved last and flattened into one axis of
 * length *r: (kept..., r). */
static Value *rows_of(Scope *s, Value *x, const AVal *a, int n, const int64_t *axes, int64_t *r) {
  int64_t perm[SHM_MAXDIM], shape[SHM_MAXDIM];
  int k = 0;
  *r = 1;
  for (int i = 0; i < a->ndim; i++) {
    bool red = false;
    for (int j = 0; j < n; j++) red |= axes[j] == i;
    if (!red) shape[k] = a->shape[i], perm[k++] = i;
  }
  int nk = k;
  for (int j = 0; j < n; j++) perm[k++] = axes[j], *r *= a->shape[axes[j]];
  shape[nk] = *r;
  Params q;
  params_init(&q);
  params_add(&q, "permutation", val_int_tuple(a->ndim, perm));
  Value *t = ap(s, P_TRANSPOSE, 1, &x, &q);
  return reshape(s, t, nk + 1, shape);
}

/* [x] (..., r) shifted by one along its last axis, a one coming in: an
 * exclusive product's start. */
static Value *shift_in_one(Scope *s, Value *x, bool from_front) {
  AVal a;
  if (!aval_ok(x, &a)) return NULL;
  int nd = a.ndim;
  int64_t lo[SHM_MAXDIM] = {0}, hi[SHM_MAXDIM] = {0}, it[SHM_MAXDIM] = {0};
  int64_t st[SHM_MAXDIM] = {0}, li[SHM_MAXDIM];
  for (int i = 0; i < nd; i++) li[i] = a.shape[i];
  if (from_front) li[nd - 1] -= 1, lo[nd - 1] = 1;
  else st[nd - 1] = 1, hi[nd - 1] = 1;
  Params q;
  params_init(&q);
  params_add(&q, "start_indices", val_int_tuple(nd, st));
  params_add(&q, "limit_indices", val_int_tuple(nd, li));
  params_add(&q, "strides", val_incref(VAL_NONE));
  Value *cut = ap(s, P_SLICE, 1, &x, &q);
  Value *cfg = tuple_new((size_t)nd);
  for (int i = 0; cfg && i < nd; i++)
    tuple_set_steal(cfg, (size_t)i, val_int_tuple(3, (int64_t[]){lo[i], hi[i], it[i]}));
  params_init(&q);
  params_add(&q, "padding_config", cfg);
  AVal z = a;
  z.ndim = 0;
  return ap(s, P_PAD, 2, (Value *[]){cut, full(s, 1.0, &z)}, &q);
}

/* reduce_prod: the tangent of each factor times the product of the others
 * (exclusive products from both ends, so zeros are exact), summed. */
static int jvp_reduce_prod(Value **x, Value **t, int nin, const Params *p, Value **yo,
                           Value **to) {
  (void)nin;
  if (primal(P_REDUCE_PROD, x, 1, p, yo) < 0) return -1;
  *to = NULL;
  if (!t[0]) return 0;
  Scope s = {0};
  AVal a, ya;
  int n;
  int64_t axes[SHM_MAXDIM], r;
  if (prim_value_aval(x[0], &a) < 0 || prim_value_aval(*yo, &ya) < 0 || ints(p, "axes", &n, axes) < 0)
    return jvp_done(&s, NULL, false, yo, to);
  if (n == 0) return jvp_done(&s, t[0], false, yo, to);
  Value *xr = rows_of(&s, x[0], &a, n, axes, &r), *tr = rows_of(&s, t[0], &a, n, axes, &r);
  AVal ra;
  if (!aval_ok(xr, &ra)) return jvp_done(&s, NULL, false, yo, to);
  if (r == 0) return jvp_done(&s, zeros_of(&s, &ya), false, yo, to);
  int last = ra.ndim - 1;
  Params q;
  params_init(&q);
  params_add(&q, "axis", val_int(last));
  params_add(&q, "reverse", val_bool(false));
  Value *fwd = ap(&s, P_CUMPROD, 1, &xr, &q);
  params_init(&q);
  params_add(&q, "axis", val_int(last));
  params_add(&q, "reverse", val_bool(true));
  Value *rev = ap(&s, P_CUMPROD, 1, &xr, &q);
  Value *others = mul(&s, shift_in_one(&s, fwd, true), shift_in_one(&s, rev, false));
  Value *sum = reduce_sum(&s, mul(&s, tr, others), 1, (int64_t[]){last});
  return jvp_done(&s, reshape(&s, sum, ya.ndim, ya.shape), false, yo, to);
}

/* [x] shifted [k] places along [axis] (toward its end; toward its start
 * when [reverse]), the 0-d [fill] coming in. */
static Value *shift_by(Scope *s, Value *x, int axis, int64_t k, bool reverse, Value *fill) {
  AVal a;
  if (!aval_ok(x, &a) || !fill) return NULL;
  int nd = a.ndim;
  int64_t st[SHM_MAXDIM] = {0}, li[SHM_MAXDIM];
  Value *cfg = tuple_new((size_t)nd);
  for (int i = 0; i < nd; i++) li[i] = a.shape[i];
  if (reverse) st[axis] = k;
  else li[axis] -= k;
  for (int i = 0; cfg && i < nd; i++) {
    int64_t lo = i == axis && !reverse ? k : 0, hi = i == axis && reverse ? k : 0;
    tuple_set_steal(cfg, (size_t)i, val_int_tuple(3, (int64_t[]){lo, hi, 0}));
  }
  Params q;
  params_init(&q);
  params_add(&q, "start_indices", val_int_tuple(nd, st));
  params_add(&q, "limit_indices", val_int_tuple(nd, li));
  params_add(&q, "strides", val_incref(VAL_NONE));
  Value *cut = ap(s, P_SLICE, 1, &x, &q);
  params_init(&q);
  params_add(&q, "padding_config", cfg);
  return ap(s, P_PAD, 2, (Value *[]){cut, fill}, &q);
}

/* One step of the scan's tangent: from (y, ty), shifted by [k], the next
 * (y, ty) as new references in [y2], [t2]. */
static int cumscan_step(PrimId id, Value *y, Value *ty, int axis, int64_t k, bool reverse,
                        Value **y2, Value **t2) {
  Scope s = {0};
  AVal a, z;
  if (!aval_ok(y, &a)) return -1;
  z = a;
  z.ndim = 0;
  Value *ident = id == P_CUMPROD ? full(&s, 1.0, &z)
                                 : keep(&s, arr_value(arr_scalar_f64(a.dtype, -INFINITY, false)));
  Value *ys = shift_by(&s, y, axis, k, reverse, ident);
  Value *ts = shift_by(&s, ty, axis, k, reverse, full(&s, 0.0, &z));
  Value *ny, *nt;
  if (id == P_CUMPROD) {   /* (y ys)' = ty ys + y ts */
    ny = mul(&s, y, ys);
    nt = add(&s, mul(&s, ty, ys), mul(&s, y, ts));
  } else {                 /* the tangent of the larger, the later one on ties */
    Value *keep_y = bin(&s, P_GE, y, ys);
    ny = select(&s, keep_y, y, ys);
    nt = select(&s, keep_y, ty, ts);
  }
  *y2 = ny ? val_incref(ny) : NULL;
  *t2 = nt ? val_incref(nt) : NULL;
  scope_end(&s);
  if (*y2 && *t2) return 0;
  if (*y2) val_decref(*y2);
  if (*t2) val_decref(*t2);
  return -1;
}

/* cumprod, cummax: the tangent of the inclusive scan computed as the
 * scan's log2(n) doubling steps (Hillis and Steele), each differentiated
 * exactly, so zeros in a product need no division (JAX differentiates its
 * associative_scan the same way). */
static int jvp_cumscan(PrimId id, Value **x, Value **t, const Params *p, Value **yo,
                       Value **to) {
  if (primal(id, x, 1, p, yo) < 0) return -1;
  *to = NULL;
  if (!t[0]) return 0;
  AVal a;
  int64_t axis;
  bool reverse = false;
  if (!aval_ok(x[0], &a) || params_int(p, "axis", &axis) < 0 ||
      (params_get(p, "reverse") && params_bool(p, "reverse", &reverse) < 0)) {
    val_decref(*yo);
    *yo = NULL;
    return -1;
  }
  if (axis < 0) axis += a.ndim;
  Value *y = val_incref(x[0]), *ty = val_incref(t[0]);
  for (int64_t k = 1; y && k < (a.ndim ? a.shape[axis] : 1); k *= 2) {
    Value *y2, *t2;
    int rc = cumscan_step(id, y, ty, (int)axis, k, reverse, &y2, &t2);
    val_decref(y);
    val_decref(ty);
    y = rc == 0 ? y2 : NULL;
    ty = rc == 0 ? t2 : NULL;
  }
  if (y) val_decref(y);
  *to = ty;
  if (ty) return 0;
  val_decref(*yo);
  *yo = NULL;
  return -1;
}
static int jvp_cumprod(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  (void)nin;
  return jvp_cumscan(P_CUMPROD, x, t, p, yo, to);
}
static int jvp_cummax(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  (void)nin;
  return jvp_cumscan(P_CUMMAX, x, t, p, yo, to);
}

/* ==== transpose rules ====================================================== */

static int tr_reduce_sum(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                         const Params *p, Value **cts) {
  (void)in, (void)lin, (void)nin;
  int n;
  int64_t axes[SHM_MAXDIM];
  if (ints(p, "axes", &n, axes) < 0) return -1;
  Scope s = {0};
  return ct_set(&s, cts, 0, unreduce(&s, ct[0], &av[0], n, axes));
}

static int tr_cumsum(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                     const Params *p, Value **cts) {
  (void)in, (void)av, (void)lin, (void)nin;
  bool rev = false;
  int64_t axis;
  Value *r = params_get(p, "reverse");
  if (r && params_bool(p, "reverse", &rev) < 0) return -1;
  if (params_int(p, "axis", &axis) < 0) return -1;
  Params q;
  params_init(&q);
  params_add(&q, "axis", val_int(axis));
  params_add(&q, "reverse", val_bool(!rev));
  Scope s = {0};
  return ct_set(&s, cts, 0, ap(&s, P_CUMSUM, 1, ct, &q));
}

/* ==== instances ============================================================ */

REDUCE_RULE(shape_reduce_sum, P_REDUCE_SUM) REDUCE_RULE(shape_reduce_max, P_REDUCE_MAX)
REDUCE_RULE(shape_reduce_min, P_REDUCE_MIN) REDUCE_RULE(shape_reduce_prod, P_REDUCE_PROD)
REDUCE_RULE(shape_reduce_and, P_REDUCE_AND) REDUCE_RULE(shape_reduce_or, P_REDUCE_OR)
SCAN_RULE(shape_cumsum, P_CUMSUM) SCAN_RULE(shape_cumprod, P_CUMPROD)
SCAN_RULE(shape_cummax, P_CUMMAX)
ZERO_JVP(argmax, ARGMAX) ZERO_JVP(argmin, ARGMIN) ZERO_JVP(reduce_and, REDUCE_AND)
ZERO_JVP(reduce_or, REDUCE_OR)
LINEAR1_JVP(reduce_sum, REDUCE_SUM) LINEAR1_JVP(cumsum, CUMSUM)
AXES_RULE(b_reduce_sum, REDUCE_SUM, "axes") AXES_RULE(b_reduce_max, REDUCE_MAX, "axes")
AXES_RULE(b_reduce_min, REDUCE_MIN, "axes") AXES_RULE(b_reduce_prod, REDUCE_PROD, "axes")
AXES_RULE(b_reduce_and, REDUCE_AND, "axes") AXES_RULE(b_reduce_or, REDUCE_OR, "axes")
AXES_RULE(b_argmax, ARGMAX, "axes") AXES_RULE(b_argmin, ARGMIN, "axes")
AXIS1_RULE(b_cumsum, CUMSUM, "axis") AXIS1_RULE(b_cumprod, CUMPROD, "axis")
AXIS1_RULE(b_cummax, CUMMAX, "axis")

/* A fused run may close with a whole-array float32 sum (fused_loop.c). */
static const FuseRule fuse_reduce_sum = {.sum = true};

/* ==== sharding rules (prim.h; GSPMD's, shmap(7)) ============================= */

/* The reduced dimensions of a reduction's "axes", as bits. */
static uint64_t reduced(PrimId id, const AVal *in, const Params *p) {
  int n;
  int64_t dims[SHM_MAXDIM];
  bool mask[SHM_MAXDIM];
  uint64_t m = 0;
  if (prim_dims(id, p, "axes", in[0].ndim, &n, dims, mask) < 0) return 0;
  for (int d = 0; d < in[0].ndim; d++) m |= (uint64_t)mask[d] << d;
  return m;
}

/* A sum, max or min over a split dimension: each device reduces its
 * block and the collective of the same reduction completes it. */
#define REDUCE_SHARDING(fn, ID, coll)                                                        \
  static int fn(const AVal *in, Sharding *in_sh, int nin, const Params *p, Sharding *out) { \
    (void)nin;                                                                              \
    return sh_reduce(in, in_sh, reduced(P_##ID, in, p), coll, out);                         \
  }
REDUCE_SHARDING(sh_reduce_sum, REDUCE_SUM, "psum")
REDUCE_SHARDING(sh_reduce_max, REDUCE_MAX, "pmax")
REDUCE_SHARDING(sh_reduce_min, REDUCE_MIN, "pmin")
/* product, and, or, argmax, argmin: the reduced dimensions gathered first */
REDUCE_SHARDING(sh_reduce_prod, REDUCE_PROD, NULL)
REDUCE_SHARDING(sh_reduce_and, REDUCE_AND, NULL)
REDUCE_SHARDING(sh_reduce_or, REDUCE_OR, NULL)
REDUCE_SHARDING(sh_argmax, ARGMAX, NULL)
REDUCE_SHARDING(sh_argmin, ARGMIN, NULL)

/* A cumulative reduction runs along its axis: that axis unsplit. */
static int sh_cumulative(const AVal *in, Sharding *in_sh, int nin, const Params *p, Sharding *out_sh) {
  int64_t axis;
  if (params_int(p, "axis", &axis) < 0) return -1;
  int d = axis < 0 ? (int)axis + in[0].ndim : (int)axis;
  if (d >= 0 && d < in[0].ndim && sh_typed(&in_sh[0], sh_dim_axes(&in_sh[0], d))) {
    char ty[256];
    sh_aval_str(&in[0], &in_sh[0], ty, sizeof ty);
    return sh_type_error("input should be unsharded over the axis being reduced. Got input "
                         "type=%s and axis=%d; reshard it first (jax.sharding.reshard)", ty, d);
  }
  return sh_keep_but_param(in, in_sh, nin, p, "axis", out_sh);
}

/* ==== the rows ============================================================= */

/* Each primitive's rules, side by side (prim.h, PrimRules). */
static const PrimRow rows[] = {
    {P_REDUCE_SUM, {.shape = shape_reduce_sum, .kernel = kern_reduce_sum, .batch = b_reduce_sum, .jvp = jvp_reduce_sum, .transpose = tr_reduce_sum, .fuse = &fuse_reduce_sum, .sharding = sh_reduce_sum, .cost = prim_cost_reduction}},
    {P_REDUCE_MAX, {.shape = shape_reduce_max, .kernel = kern_reduce_max, .batch = b_reduce_max, .jvp = jvp_reduce_max, .sharding = sh_reduce_max, .cost = prim_cost_reduction}},
    {P_REDUCE_MIN, {.shape = shape_reduce_min, .kernel = kern_reduce_min, .batch = b_reduce_min, .jvp = jvp_reduce_min, .sharding = sh_reduce_min, .cost = prim_cost_reduction}},
    {P_REDUCE_PROD, {.shape = shape_reduce_prod, .kernel = kern_reduce_prod, .batch = b_reduce_prod, .jvp = jvp_reduce_prod, .sharding = sh_reduce_prod, .cost = prim_cost_reduction}},
    {P_REDUCE_AND, {.shape = shape_reduce_and, .kernel = kern_reduce_and, .dtypes = DC_BOOL | DC_INT, .batch = b_reduce_and, .jvp = jvp_reduce_and, .sharding = sh_reduce_and, .cost = prim_cost_reduction}},
    {P_REDUCE_OR, {.shape = shape_reduce_or, .kernel = kern_reduce_or, .dtypes = DC_BOOL | DC_INT, .batch = b_reduce_or, .jvp = jvp_reduce_or, .sharding = sh_reduce_or, .cost = prim_cost_reduction}},
    {P_ARGMAX, {.shape = shape_argmax, .kernel = kern_argmax, .batch = b_argmax, .jvp = jvp_argmax, .sharding = sh_argmax, .cost = prim_cost_reduction}},
    {P_ARGMIN, {.shape = shape_argmin, .kernel = kern_argmin, .batch = b_argmin, .jvp = jvp_argmin, .sharding = sh_argmin, .cost = prim_cost_reduction}},
    {P_CUMSUM, {.shape = shape_cumsum, .kernel = kern_cumsum, .batch = b_cumsum, .jvp = jvp_cumsum, .transpose = tr_cumsum, .sharding = sh_cumulative, .cost = prim_cost_reduction}},
    {P_CUMPROD, {.shape = shape_cumprod, .kernel = kern_cumprod, .batch = b_cumprod, .jvp = jvp_cumprod, .sharding = sh_cumulative, .cost = prim_cost_reduction}},
    {P_CUMMAX, {.shape = shape_cummax, .kernel = kern_cummax, .batch = b_cummax, .jvp = jvp_cummax, .sharding = sh_cumulative, .cost = prim_cost_reduction}},
};

void prim_reduce_register(void) { prim_register_rows(rows, sizeof rows / sizeof rows[0]); }
