/*
 * prim_index.c - the primitives that read or write an array at computed
 * positions (dynamic_slice, dynamic_update_slice, gather, scatter, sort,
 * argsort): for each, side by side in its row at the end of the file, the
 * shape rule, the kernel (kern_shape.c), the batching rule and the JVP and
 * transpose rules.  Semantics: jax.lax's slicing.py and sort (clamped
 * start indices, scatter's combining modes, a stable sort with NaN last).
 */
#include "array/prim_rules.h"

/* ==== shape rules ========================================================== */


static int shape_dynamic_slice(const AVal *in, int nin, const Params *p, AVal *out) {
  int n;
  int64_t sizes[SHM_MAXDIM];
  char a[128], b[128];
  if (params_ints(p, "slice_sizes", &n, sizes, SHM_MAXDIM) < 0 ||
      prim_check_starts(P_DYNAMIC_SLICE, in, nin, 1, in[0].ndim) < 0)
    return -1;
  bool ok = n == in[0].ndim;
  for (int i = 0; ok && i < n; i++)
    ok = sizes[i] >= 0 && sizes[i] <= in[0].shape[i];
  if (!ok) {
    err_set(ERR_VALUE, "slice_sizes must be less than or equal to operand shape, got "
            "slice_sizes %s for operand shape %s", prim_ints(a, n, sizes), prim_shape(b, &in[0]));
    return -1;
  }
  prim_set(out, in[0].dtype, in[0].weak, n, sizes);
  return 0;
}

static int shape_dynamic_update_slice(const AVal *in, int nin, const Params *p, AVal *out) {
  char a[128], b[128];
  if (nin < 2 || prim_check_starts(P_DYNAMIC_UPDATE_SLICE, in, nin, 2, in[0].ndim) < 0 ||
      prim_same_dtypes(P_DYNAMIC_UPDATE_SLICE, in, 0, 2) < 0)
    return -1;
  bool ok = in[1].ndim == in[0].ndim;
  for (int i = 0; ok && i < in[0].ndim; i++)
    ok = in[1].shape[i] <= in[0].shape[i];
  if (!ok) {
    err_set(ERR_VALUE, "dynamic_update_slice update shape must be smaller than operand shape, "
            "got update shape %s for operand shape %s", prim_shape(a, &in[1]),
            prim_shape(b, &in[0]));
    return -1;
  }
  aval_copy(out, &in[0]);
  return 0;
}

/* operand.shape[:axis] + indices.shape + operand.shape[axis+1:] */
static int prim_take_shape(PrimId id, const AVal *x, const AVal *idx, int axis,
                           int *n, int64_t *shape) {
  if (!dt_is_int(idx->dtype)) {
    err_set(ERR_TYPE, "%s indices must be integers, got %s", prim_table[id].name,
            dt_name(idx->dtype));
    return -1;
  }
  if (x->ndim - 1 + idx->ndim > SHM_MAXDIM) {
    err_set(ERR_VALUE, "%s: result rank exceeds %d", prim_table[id].name, SHM_MAXDIM);
    return -1;
  }
  int k = 0;
  for (int i = 0; i < axis; i++)
    shape[k++] = x->shape[i];
  for (int i = 0; i < idx->ndim; i++)
    shape[k++] = idx->shape[i];
  for (int i = axis + 1; i < x->ndim; i++)
    shape[k++] = x->shape[i];
  *n = k;
  return 0;
}

static int shape_gather(const AVal *in, int nin, const Params *p, AVal *out) {
  int64_t ax, shape[SHM_MAXDIM];
  int axis, n;
  if (params_int(p, "axis", &ax) < 0 || axis_normalize(ax, in[0].ndim, &axis) < 0 ||
      prim_take_shape(P_GATHER, &in[0], &in[1], axis, &n, shape) < 0)
    return -1;
  prim_set(out, in[0].dtype, in[0].weak, n, shape);
  return 0;
}

static int shape_scatter(const AVal *in, int nin, const Params *p, AVal *out) {
  int64_t ax, shape[SHM_MAXDIM];
  int axis, n;
  char a[128], b[128];
  if (params_int(p, "axis", &ax) < 0 || axis_normalize(ax, in[0].ndim, &axis) < 0 ||
      prim_take_shape(P_SCATTER, &in[0], &in[1], axis, &n, shape) < 0)
    return -1;
  Value *mode = params_get(p, "mode");
  if (mode && (mode->type != V_STR || kern_scatter_mode(str_cstr(mode)) < 0)) {
    err_set(ERR_VALUE, "scatter mode must be 'set', 'add', 'multiply', 'min' or 'max'");
    return -1;
  }
  if (in[2].dtype != in[0].dtype) {
    err_set(ERR_TYPE, "scatter requires updates of the operand's dtype %s, got %s",
            dt_name(in[0].dtype), dt_name(in[2].dtype));
    return -1;
  }
  if (in[2].ndim != n || memcmp(in[2].shape, shape, sizeof(int64_t) * n)) {
    err_set(ERR_VALUE, "scatter updates must have shape %s, got %s",
            prim_ints(a, n, shape), prim_shape(b, &in[2]));
    return -1;
  }
  aval_copy(out, &in[0]);
  return 0;
}

static int shape_sort(const AVal *in, int nin, const Params *p, AVal *out) {
  int64_t dim = in[0].ndim - 1;
  int d;
  if (in[0].ndim == 0) {
    err_set(ERR_VALUE, "sort requires an operand of rank >= 1");
    return -1;
  }
  if (params_get(p, "dimension") && params_int(p, "dimension", &dim) < 0)
    return -1;
  if (axis_normalize(dim, in[0].ndim, &d) < 0)
    return -1;
  aval_copy(out, &in[0]);
  return 0;
}

static int shape_argsort(const AVal *in, int nin, const Params *p, AVal *out) {
  if (shape_sort(in, nin, p, out) < 0)
    return -1;
  out->dtype = DT_I32;
  out->weak = false;
  return 0;
}

/* ==== JVP rules ============================================================ */
static int jvp_dynamic_slice(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  return jvp_multilinear(P_DYNAMIC_SLICE, 1, x, t, nin, p, yo, to);
}
static int jvp_dynamic_update_slice(Value **x, Value **t, int nin, const Params *p, Value **yo,
                                    Value **to) {
  return jvp_multilinear(P_DYNAMIC_UPDATE_SLICE, 2, x, t, nin, p, yo, to);
}
static int jvp_gather(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  (void)nin;
  Value *xs[2] = {x[0], x[1]}, *ts[2] = {t[0], NULL};
  return jvp_multilinear(P_GATHER, 1, xs, ts, 2, p, yo, to);
}

/* scatter[axis mode=add](zeros like [like], [idx], [u]): [u]'s rows
 * summed into the positions they name. */
static Value *scatter_add_into(Scope *s, Value *like_v, Value *idx, Value *u, int64_t axis) {
  Params q;
  params_init(&q);
  params_add(&q, "axis", val_int(axis));
  params_add(&q, "mode", str_from("add"));
  return ap(s, P_SCATTER, 3, (Value *[]){like(s, 0.0, like_v), idx, u}, &q);
}

/* scatter min/max: each position of the result is the operand or some
 * updates that equal it; its tangent is the mean of the tangents of all
 * of them that tie, as JAX's scatter extremal JVP.  Linear in the
 * tangents (masks, a scatter-add and a division by the tie count), so it
 * transposes. */
static Value *scatter_extremal_tangent(Scope *s, Value **x, Value **t, Value *y, int64_t axis) {
  AVal a;
  if (!aval_ok(x[0], &a)) return NULL;
  Params g;
  params_init(&g);
  params_add(&g, "axis", val_int(axis));
  Value *yg = ap(s, P_GATHER, 2, (Value *[]){y, x[1]}, &g);
  Value *uhit = convert(s, bin(s, P_EQ, x[2], yg), a.dtype, false);
  Value *ohit = convert(s, bin(s, P_EQ, x[0], y), a.dtype, false);
  Value *count = add(s, ohit, scatter_add_into(s, x[0], x[1], uhit, axis));
  Value *num = add(s, mul(s, tan_or_zero(s, t[0], x[0]), ohit),
                   scatter_add_into(s, x[0], x[1], mul(s, tan_or_zero(s, t[2], x[2]), uhit), axis));
  return dvd(s, num, count);
}

/* scatter: linear in (operand, updates) jointly for set and add; min and
 * max average the tangents of ties; multiply is linear in the operand
 * (JAX differentiates its updates only with unique indices, which the
 * language does not declare: an error, as JAX's). */
static int jvp_scatter(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  Value *mode = params_get(p, "mode");
  const char *m = mode && mode->type == V_STR ? str_cstr(mode) : "set";
  bool extremal = !strcmp(m, "min") || !strcmp(m, "max"), mult = !strcmp(m, "multiply");
  if (mult && t[2]) {
    err_set(ERR_NOT_IMPLEMENTED, "scatter_mul gradients are only implemented if "
                                 "`unique_indices=True`");
    return -1;
  }
  if (extremal || mult) {
    int64_t axis;
    if (params_int(p, "axis", &axis) < 0 || primal(P_SCATTER, x, nin, p, yo) < 0) return -1;
    *to = NULL;
    if (!t[0] && !t[2]) return 0;
    Scope s = {0};
    Value *tan = extremal ? scatter_extremal_tangent(&s, x, t, *yo, axis)
                          : same(&s, P_SCATTER, 3, (Value *[]){t[0], x[1], x[2]}, p);
    return jvp_done(&s, tan, false, yo, to);
  }
  if (strcmp(m, "set") && strcmp(m, "add")) return prim_rule_missing(P_SCATTER, "differentiation");
  Value *ts[3] = {t[0], t[2], NULL};
  Value *xs[3] = {x[0], x[2], x[1]};
  (void)ts;
  /* operands are (operand, indices, updates): tangents of 0 and 2 */
  if (primal(P_SCATTER, x, nin, p, yo) < 0) return -1;
  *to = NULL;
  if (!t[0] && !t[2]) return 0;
  Scope s = {0};
  Value *in[3] = {tan_or_zero(&s, t[0], xs[0]), x[1], tan_or_zero(&s, t[2], xs[1])};
  return jvp_done(&s, same(&s, P_SCATTER, 3, in, p), false, yo, to);
}

/* ==== sort ============================================================== */

/* [x] permuted so axis [d] comes last, and the inverse permutation. */
static Value *axis_last(Scope *s, Value *x, int nd, int d, int64_t *inv) {
  int64_t perm[SHM_MAXDIM];
  for (int i = 0, k = 0; i < nd; i++)
    if (i != d) perm[k++] = i;
  perm[nd - 1] = d;
  for (int i = 0; i < nd; i++) inv[perm[i]] = i;
  Params q;
  params_init(&q);
  params_add(&q, "permutation", val_int_tuple(nd, perm));
  return ap(s, P_TRANSPOSE, 1, &x, &q);
}

/* [x] reshaped to [shape], the reshape's out_sharding [osh] (borrowed;
 * NULL: none) when given. */
static Value *reshape_as(Scope *s, Value *x, int nd, const int64_t *shape, Value *osh) {
  if (!osh) return reshape(s, x, nd, shape);
  if (!x) return NULL;
  Params p;
  params_init(&p);
  params_add(&p, "new_sizes", val_int_tuple(nd, shape));
  params_add(&p, "dimensions", val_incref(VAL_NONE));
  params_add(&p, "out_sharding", val_incref(osh));
  return ap(s, P_RESHAPE, 1, &x, &p);
}

/* take_along_axis(t, idx, d): t's elements at the integer positions
 * [idx] along axis [d] (idx has t's shape, [m] long along d), as one
 * gather of the rows flattened: row r, position i -> r * len + i.  With
 * [osh] (borrowed, NULL: none) the reshapes and the gather carry it as
 * their out_sharding (the caller lays the result out as its type). */
static Value *take_along(Scope *s, Value *t, Value *idx, const AVal *a, int d, int64_t m,
                         Value *osh) {
  int nd = a->ndim;
  int64_t inv[SHM_MAXDIM], tshape[SHM_MAXDIM], len = a->shape[d], rows = 1;
  for (int i = 0, k = 0; i < nd; i++)
    if (i != d) tshape[k++] = a->shape[i], rows *= a->shape[i];
  tshape[nd - 1] = m;
  Value *tl = reshape_as(s, axis_last(s, t, nd, d, inv), 1, (int64_t[]){rows * len}, osh);
  Value *il = convert(s, reshape_as(s, axis_last(s, idx, nd, d, inv), 2, (int64_t[]){rows, m}, osh),
                      DT_I32, false);
  Params q;
  params_init(&q);
  params_add(&q, "dtype", dtype_value(DT_I32));
  params_add(&q, "shape", val_int_tuple(2, (int64_t[]){rows, m}));
  params_add(&q, "dimension", val_int(0));
  Value *row = ap(s, P_IOTA, 0, NULL, &q);
  Value *stride = keep(s, arr_value(arr_scalar_i64(DT_I32, len, false)));
  Value *flat = add(s, mul(s, row, stride), il);
  params_init(&q);
  params_add(&q, "axis", val_int(0));
  if (osh) params_add(&q, "out_sharding", val_incref(osh));
  Value *g = ap(s, P_GATHER, 2, (Value *[]){tl, flat}, &q);
  Value *back = reshape_as(s, g, nd, tshape, osh);
  if (!back) return NULL;
  params_init(&q);
  params_add(&q, "permutation", val_int_tuple(nd, inv));
  return ap(s, P_TRANSPOSE, 1, &back, &q);
}

Value *prim_take_along(Value *x, Value *idx, int axis) { return prim_take_along_sh(x, idx, axis, NULL); }

Value *prim_take_along_sh(Value *x, Value *idx, int axis, Value *osh) {
  AVal a, ia;
  Scope s = {0};
  if (!aval_ok(x, &a) || !aval_ok(idx, &ia)) return NULL;
  if (ia.ndim != a.ndim || axis < 0 || axis >= a.ndim || !dt_is_int(ia.dtype))
    return err_set(ERR_VALUE, "take_along_axis: indices must be integers of the array's rank "
                              "(%d), got rank %d", a.ndim, ia.ndim);
  int64_t shape[SHM_MAXDIM], dims[SHM_MAXDIM];
  for (int i = 0; i < a.ndim; i++) {
    if (i != axis && ia.shape[i] != a.shape[i] && ia.shape[i] != 1)
      return err_set(ERR_VALUE, "take_along_axis: indices of shape dimension %d (%lld) do not "
                                "match the array's (%lld)", i, (long long)ia.shape[i],
                     (long long)a.shape[i]);
    shape[i] = i == axis ? ia.shape[i] : a.shape[i];
    dims[i] = i;
  }
  Value *full_idx = bcast(&s, idx, a.ndim, shape, a.ndim, dims);
  /* negative positions count from the end, as NumPy's */
  Value *zero = keep(&s, arr_value(arr_scalar_i64(ia.dtype, 0, false)));
  Value *len = keep(&s, arr_value(arr_scalar_i64(ia.dtype, a.shape[axis], false)));
  Value *wrapped = select(&s, bin(&s, P_LT, full_idx, zero), add(&s, full_idx, len), full_idx);
  return scope_return(&s, wrapped ? take_along(&s, x, wrapped, &a, axis, ia.shape[axis], osh) : NULL);
}

/* sort: the tangent moves with its element, t[argsort(x)] along the
 * dimension (JAX sorts the tangent as a second operand keyed by x). */
static int jvp_sort(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  (void)nin;
  if (primal(P_SORT, x, 1, p, yo) < 0) return -1;
  *to = NULL;
  if (!t[0]) return 0;
  Scope s = {0};
  AVal a;
  int64_t d = -1;
  if (!aval_ok(x[0], &a) || (params_get(p, "dimension") && params_int(p, "dimension", &d) < 0))
    return jvp_done(&s, NULL, false, yo, to);
  if (d < 0) d += a.ndim;
  Params q;
  params_init(&q);
  params_add(&q, "dimension", val_int(d));
  Value *idx = ap(&s, P_ARGSORT, 1, &x[0], &q);
  return jvp_done(&s, idx ? take_along(&s, t[0], idx, &a, (int)d, a.shape[d], NULL) : NULL, false, yo, to);
}

/* ==== transpose rules ====================================================== */

/* dynamic_slice: the cotangent written into zeros at the same start */
static int tr_dynamic_slice(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                            const Params *p, Value **cts) {
  (void)lin, (void)p;
  Value *ops[SHM_MAXDIM + 2];
  Scope s = {0};
  ops[0] = zeros_of(&s, &av[0]);
  ops[1] = ct[0];
  for (int i = 1; i < nin; i++) ops[i + 1] = in[i];
  return ct_set(&s, cts, 0, ap(&s, P_DYNAMIC_UPDATE_SLICE, nin + 1, ops, NULL));
}

/* dynamic_update_slice: the operand's cotangent with the window zeroed,
 * the update's the window */
static int tr_dynamic_update_slice(Value **ct, Value **in, const AVal *av, const bool *lin,
                                   int nin, const Params *p, Value **cts) {
  (void)p;
  Value *ops[SHM_MAXDIM + 2];
  if (lin[0]) {
    Scope s = {0};
    ops[0] = ct[0];
    ops[1] = zeros_of(&s, &av[1]);
    for (int i = 2; i < nin; i++) ops[i] = in[i];
    if (ct_set(&s, cts, 0, ap(&s, P_DYNAMIC_UPDATE_SLICE, nin, ops, NULL)) < 0) return -1;
  }
  if (lin[1]) {
    Scope s = {0};
    ops[0] = ct[0];
    for (int i = 2; i < nin; i++) ops[i - 1] = in[i];
    Params q;
    params_init(&q);
    params_add(&q, "slice_sizes", val_int_tuple(av[1].ndim, av[1].shape));
    if (ct_set(&s, cts, 1, ap(&s, P_DYNAMIC_SLICE, nin - 1, ops, &q)) < 0) return -1;
  }
  return 0;
}

/* gather: the cotangent added back at the taken rows */
static int tr_gather(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                     const Params *p, Value **cts) {
  (void)lin, (void)nin;
  int64_t axis;
  if (params_int(p, "axis", &axis) < 0) return -1;
  Params q;
  params_init(&q);
  params_add(&q, "axis", val_int(axis));
  params_add(&q, "mode", str_from("add"));
  Scope s = {0};
  return ct_set(&s, cts, 0, ap(&s, P_SCATTER, 3, (Value *[]){zeros_of(&s, &av[0]), in[1], ct[0]}, &q));
}

/* scatter (set, add): the updates' cotangent is gathered at the rows;
 * under set, the operand's is zero at them; multiply, linear in the
 * operand only, scales its cotangent as it scaled the operand */
static int tr_scatter(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                      const Params *p, Value **cts) {
  (void)nin;
  Value *mode = params_get(p, "mode");
  const char *m = mode && mode->type == V_STR ? str_cstr(mode) : "set";
  bool set = !strcmp(m, "set");
  if (!strcmp(m, "multiply") && lin[0] && !lin[2]) {   /* a scaling of each position */
    Scope s = {0};
    return ct_set(&s, cts, 0, same(&s, P_SCATTER, 3, (Value *[]){ct[0], in[1], in[2]}, p));
  }
  if (!set && strcmp(m, "add")) return prim_rule_missing(P_SCATTER, "transpose");
  if (lin[1]) return prim_rule_missing(P_SCATTER, "transpose (linear indices)");
  int64_t axis;
  if (params_int(p, "axis", &axis) < 0) return -1;
  if (lin[0]) {
    Scope s = {0};
    Value *r = ct[0];
    if (set) r = same(&s, P_SCATTER, 3, (Value *[]){ct[0], in[1], zeros_of(&s, &av[2])}, p);
    if (ct_set(&s, cts, 0, r) < 0) return -1;
  }
  if (lin[2]) {
    Params q;
    params_init(&q);
    params_add(&q, "axis", val_int(axis));
    Scope s = {0};
    if (ct_set(&s, cts, 2, ap(&s, P_GATHER, 2, (Value *[]){ct[0], in[1]}, &q)) < 0) return -1;
  }
  return 0;
}

/* ==== batching rules ======================================================= */

/* dynamic_slice and dynamic_update_slice with the same start for every
 * example: the batch axis first, starting at 0 */
static int batch_dynamic(PrimId id, int nlin, Value **in, const int *dims, int nin,
                         const Params *p, Value **out, int *od) {
  for (int i = nlin; i < nin; i++)
    if (dims[i] >= 0) return BATCH_BY_LOOP;
  if (nin + 1 > SHM_MAXDIM + 3) return BATCH_BY_LOOP;
  int64_t b = prim_batch_size(in, dims, nin);
  Value *ops[SHM_MAXDIM + 3];
  int made = 0;
  for (; made < nlin; made++)
    if (!(ops[made] = front(in, dims, made, b))) break;
  Value *zero = NULL;
  if (made == nlin) {
    AVal ia;
    DType it = DT_I32;
    if (nin > nlin && prim_value_aval(in[nlin], &ia) == 0) it = ia.dtype;
    zero = arr_value(arr_scalar_i64(it, 0, false));
  }
  Params q;
  params_but(&q, p, "slice_sizes", NULL);
  if (id == P_DYNAMIC_SLICE) params_add(&q, "slice_sizes", ints_shifted(p, "slice_sizes", 0, 1, b));
  if (zero) {
    ops[nlin] = zero;
    for (int i = nlin; i < nin; i++) ops[i + 1] = in[i];
    *out = app(id, nin + 1, ops, &q);
    val_decref(zero);
  } else {
    params_clear(&q);
    *out = NULL;
  }
  for (int i = 0; i < made; i++) val_decref(ops[i]);
  *od = 0;
  return *out ? 0 : -1;
}

static int b_dynamic_slice(Value **in, const int *dims, int nin, const Params *p, Value **out,
                           int *od) {
  return batch_dynamic(P_DYNAMIC_SLICE, 1, in, dims, nin, p, out, od);
}

static int b_dynamic_update_slice(Value **in, const int *dims, int nin, const Params *p,
                                  Value **out, int *od) {
  return batch_dynamic(P_DYNAMIC_UPDATE_SLICE, 2, in, dims, nin, p, out, od);
}

/* gather: a batched operand gathers with the axis shifted; batched
 * indices alone give a result whose batch axis is where they land */
static int b_gather(Value **in, const int *dims, int nin, const Params *p, Value **out, int *od) {
  (void)nin;
  int64_t ax;
  if (params_int(p, "axis", &ax) < 0) return -1;
  int r = rank_of(in[0]) - (dims[0] >= 0);
  if (ax < 0) ax += r;
  if (dims[0] >= 0 && dims[1] >= 0) return BATCH_BY_LOOP;
  if (dims[1] >= 0) {
    Params q;
    params_but(&q, p, NULL, NULL);
    *out = app(P_GATHER, 2, in, &q);
    *od = (int)ax + dims[1];
    return *out ? 0 : -1;
  }
  Value *x = moveaxis(in[0], dims[0], 0);
  if (!x) return -1;
  Params q;
  params_but(&q, p, "axis", NULL);
  params_add(&q, "axis", val_int(ax + 1));
  *out = app(P_GATHER, 2, (Value *[]){x, in[1]}, &q);
  val_decref(x);
  *od = 0;
  return *out ? 0 : -1;
}

static int b_scatter(Value **in, const int *dims, int nin, const Params *p, Value **out, int *od) {
  (void)nin;
  if (dims[1] >= 0) return BATCH_BY_LOOP;
  int64_t ax, b = prim_batch_size(in, dims, 3);
  if (params_int(p, "axis", &ax) < 0) return -1;
  int r = rank_of(in[0]) - (dims[0] >= 0);
  if (ax < 0) ax += r;
  Value *x = front(in, dims, 0, b), *u = x ? front(in, dims, 2, b) : NULL;
  Params q;
  params_but(&q, p, "axis", NULL);
  params_add(&q, "axis", val_int(ax + 1));
  *out = u ? app(P_SCATTER, 3, (Value *[]){x, in[1], u}, &q) : (params_clear(&q), NULL);
  if (x) val_decref(x);
  if (u) val_decref(u);
  *od = 0;
  return *out ? 0 : -1;
}

/* ==== instances ============================================================ */

ZERO_JVP(argsort, ARGSORT)
AXIS1_RULE(b_sort, SORT, "dimension") AXIS1_RULE(b_argsort, ARGSORT, "dimension")

/* ==== the rows ============================================================= */

/* ==== sharding rules (prim.h, Sharding; shmap(7), THE THREE MODES) ======== */

/* dynamic_slice: a dimension sliced whole (slice size = its size, the
 * start then clamped to 0) keeps its split, the others are unsplit; the
 * start indices replicated. */
static int sh_dynamic_slice(const AVal *in, Sharding *in_sh, int nin, const Params *p,
                            Sharding *out_sh) {
  int n;
  int64_t sizes[SHM_MAXDIM];
  if (params_ints(p, "slice_sizes", &n, sizes, SHM_MAXDIM) < 0) return -1;
  Sharding was = in_sh[0];
  for (int d = 0; d < in[0].ndim && d < n; d++)
    if (sizes[d] != in[0].shape[d]) in_sh[0].nsplit[d] = 0;
  for (int i = 1; i < nin; i++) sh_replicated(&in_sh[i], in[i].ndim, &in_sh[0]);
  *out_sh = in_sh[0];
  out_sh->partial = 0;
  out_sh->partial_coll = NULL;
  return sh_explicit_varying(P_DYNAMIC_SLICE, in, nin, &was, p, "dynamic_slice", out_sh);
}

/* dynamic_update_slice: a dimension the update covers whole keeps its
 * split (operand and update laid out alike there); along one it covers
 * in part the operand keeps its split too and the update is whole, each
 * device writing the part of the box it holds (partition_run.c,
 * run_masked_update); the start indices replicated.  In Explicit mode the result
 * has the operand's type, and an operand and update both split over
 * Explicit axes must be split alike (JAX's rule); one not split at all
 * takes the other's type (JAX types the zeros the transposes of
 * dynamic_slice and dynamic_update_slice make as their primal). */
static int sh_dynamic_update_slice(const AVal *in, Sharding *in_sh, int nin, const Params *p,
                                   Sharding *out_sh) {
  (void)p;
  Sharding type, ut;
  sh_type_of(&in_sh[0], &type);
  sh_type_of(&in_sh[1], &ut);
  bool op_split = sh_used(&type) != 0, up_split = sh_used(&ut) != 0;
  if (!op_split && up_split && in[1].ndim == in[0].ndim) {   /* zeros a transpose made */
    for (int d = 0; d < in[0].ndim; d++)
      if (in[0].shape[d] % sh_dim_blocks(&ut, d) == 0) sh_copy_dim(&type, d, &ut, d);
  } else if (op_split && up_split && !sh_same_type(&in_sh[0], &in_sh[1])) {
    char a[256], b[256];
    sh_type_str(&in[0], &in_sh[0], a, sizeof a);
    sh_type_str(&in[1], &in_sh[1], b, sizeof b);
    return sh_type_error("operand sharding must be equal to update sharding, got operand "
                         "sharding %s and update sharding %s", a, b);
  }
  for (int d = 0; d < in[0].ndim; d++) {
    if (in[1].ndim != in[0].ndim) in_sh[0].nsplit[d] = 0;
    else if (in[1].shape[d] == in[0].shape[d]) sh_copy_dim(&in_sh[1], d, &in_sh[0], d);
    else in_sh[1].nsplit[d] = 0;   /* the whole update, each device writing its part */
  }
  for (int i = 2; i < nin; i++) sh_replicated(&in_sh[i], in[i].ndim, &in_sh[0]);
  *out_sh = in_sh[0];
  out_sh->partial = 0;
  out_sh->partial_coll = NULL;
  return type.explicit_axes ? sh_retype(out_sh, &type) : 0;
}

/* sort and argsort: the sorted dimension unsplit, the others kept (each
 * device sorts its rows whole).  In Explicit mode (JAX's
 * _sort_abstract_eval) the sorted dimension must not be split over an
 * Explicit axis: ShardingTypeError, reshard the operand first. */
static int sh_sort(const AVal *in, Sharding *in_sh, int nin, const Params *p, Sharding *out_sh) {
  int64_t dim;
  if (params_int(p, "dimension", &dim) < 0) return -1;
  int d = dim < 0 ? (int)dim + in[0].ndim : (int)dim;
  if (d >= 0 && d < in[0].ndim && sh_typed(&in_sh[0], sh_dim_axes(&in_sh[0], d))) {
    char sh[512];
    sh_named_str(&in_sh[0], sh, sizeof sh);
    return sh_type_error_text("Arguments to sort must be unsharded over the sorting dimension. "
                              "Got arg sharding=%s and sorting dimension=%d", sh, d);
  }
  return sh_keep_but_param(in, in_sh, nin, p, "dimension", out_sh);
}

/* The mesh axes (bits) splitting dimension [axis] of an operand laid out
 * as [op] that a gather or scatter along it with indices laid out as [ix]
 * keeps split (0: gathered whole first): over Auto axes the indices do
 * not use.  Each device then takes, or updates, only the rows it holds:
 * partition_run.c offsets the indices by its block's start and masks the
 * others (GSPMD's partitioning of a gather along a split operand
 * dimension, the vocabulary-parallel embedding), so the operand is never
 * gathered; a gather's result is a partial sum over those axes (the
 * other devices' rows are -0.0, which adds to any value exactly). */
static uint32_t taken_split(const Sharding *op, int axis, const Sharding *ix) {
  uint32_t a = sh_dim_axes(op, axis);
  return a & (sh_used(ix) | op->explicit_axes) ? 0 : a;
}

/* gather (take along [axis]): the operand whole along its axis (or kept
 * split there: taken_split), the indices' dimensions keeping their
 * splits (a batch of ids), then the
 * operand's other dimensions where their mesh axes are still free; the
 * result is operand[:axis] + indices + operand[axis+1:].  In Explicit
 * mode (JAX's rule) the axis taken along and the indices must not be
 * split over Explicit axes, unless an out_sharding= says the result's
 * layout (x.at[i].get(out_sharding=)). */
static int sh_gather(const AVal *in, Sharding *in_sh, int nin, const Params *p, Sharding *out_sh) {
  (void)nin;
  int64_t ax;
  int axis;
  if (params_int(p, "axis", &ax) < 0 || axis_normalize(ax, in[0].ndim, &axis) < 0) return -1;
  if (in_sh[0].explicit_axes && !params_get(p, "out_sharding") &&
      ((in[0].shape[axis] != 1 && sh_typed(&in_sh[0], sh_dim_axes(&in_sh[0], axis))) ||
       sh_typed(&in_sh[1], sh_used(&in_sh[1])))) {
    char a[256], b[256];
    /* JAX's gather indices end in their index vector dimension */
    AVal iv = in[1];
    Sharding is = in_sh[1];
    if (iv.ndim < SHM_MAXDIM) {
      iv.shape[iv.ndim++] = 1;
      is.nsplit[is.ndim++] = 0;
    }
    sh_aval_repr(&in[0], &in_sh[0], a, sizeof a);
    sh_aval_repr(&iv, &is, b, sizeof b);
    return sh_type_error_text("Use `.at[...].get(out_sharding=)` to provide output PartitionSpec "
                              "for the gather indexing as out sharding could not be resolved "
                              "unambiguously (or would require collectives on inputs). Got "
                              "operand=%s, indices=%s", a, b);
  }
  uint32_t taken = taken_split(&in_sh[0], axis, &in_sh[1]);
  if (!taken) in_sh[0].nsplit[axis] = 0;
  uint32_t used = sh_used(&in_sh[1]);
  for (int d = 0; d < in[0].ndim; d++) {
    if (sh_dim_axes(&in_sh[0], d) & used) in_sh[0].nsplit[d] = 0;
    used |= sh_dim_axes(&in_sh[0], d);
  }
  sh_replicated(out_sh, 0, &in_sh[0]);
  int o = 0;
  for (int d = 0; d < axis; d++) sh_copy_dim(out_sh, o++, &in_sh[0], d);
  for (int d = 0; d < in[1].ndim; d++) sh_copy_dim(out_sh, o++, &in_sh[1], d);
  for (int d = axis + 1; d < in[0].ndim; d++) sh_copy_dim(out_sh, o++, &in_sh[0], d);
  out_sh->ndim = o;
  out_sh->partial = taken;
  out_sh->partial_coll = taken ? "psum" : NULL;
  return 0;
}

/* scatter along [axis] (updates shaped operand[:axis] + indices +
 * operand[axis+1:]): each device scatters into its block of the
 * operand's other dimensions, the operand whole along its axis (or kept
 * split there, each device updating its own rows: taken_split), the
 * indices replicated, the updates laid out as the operand where they
 * meet it.  In Explicit mode an operand dimension split over no axis
 * takes the updates' split over Explicit ones (JAX types the zeros a
 * gather's transpose scatters into as its primal); the result has the
 * operand's layout. */
static int sh_scatter(const AVal *in, Sharding *in_sh, int nin, const Params *p, Sharding *out_sh) {
  int64_t ax;
  int axis;
  if (nin != 3 || params_int(p, "axis", &ax) < 0 || axis_normalize(ax, in[0].ndim, &axis) < 0)
    return -1;
  int ni = in[1].ndim;
  Sharding ut;
  sh_type_of(&in_sh[2], &ut);
  Sharding ix = in_sh[1];
  sh_replicated(&ix, ni, &in_sh[0]);   /* the indices are replicated below */
  if (!taken_split(&in_sh[0], axis, &ix)) in_sh[0].nsplit[axis] = 0;
  uint32_t used = sh_used(&in_sh[0]);
  for (int d = 0; d < in[0].ndim; d++) {
    int u = d < axis ? d : d - 1 + ni;
    if (d == axis || in_sh[0].nsplit[d] || !ut.nsplit[u] || (sh_dim_axes(&ut, u) & used) ||
        in[0].shape[d] % sh_dim_blocks(&ut, u))
      continue;
    sh_copy_dim(&in_sh[0], d, &ut, u);
    used |= sh_dim_axes(&ut, u);
  }
  sh_replicated(&in_sh[1], ni, &in_sh[0]);
  sh_replicated(&in_sh[2], in[2].ndim, &in_sh[0]);
  for (int d = 0; d < in[0].ndim; d++)
    if (d != axis) sh_copy_dim(&in_sh[2], d < axis ? d : d - 1 + ni, &in_sh[0], d);
  *out_sh = in_sh[0];
  out_sh->partial = 0;
  out_sh->partial_coll = NULL;
  return 0;
}

/* Each primitive's rules, side by side (prim.h, PrimRules). */
static const PrimRow rows[] = {
    {P_DYNAMIC_SLICE, {.shape = shape_dynamic_slice, .kernel = kern_dynamic_slice, .batch = b_dynamic_slice, .jvp = jvp_dynamic_slice, .transpose = tr_dynamic_slice, .sharding = sh_dynamic_slice}},
    {P_DYNAMIC_UPDATE_SLICE, {.shape = shape_dynamic_update_slice, .kernel = kern_dynamic_update_slice, .batch = b_dynamic_update_slice, .jvp = jvp_dynamic_update_slice, .transpose = tr_dynamic_update_slice, .sharding = sh_dynamic_update_slice, .updates_operand = true}},
    {P_GATHER, {.shape = shape_gather, .kernel = kern_gather, .batch = b_gather, .jvp = jvp_gather, .transpose = tr_gather, .sharding = sh_gather}},
    {P_SCATTER, {.shape = shape_scatter, .kernel = kern_scatter, .batch = b_scatter, .jvp = jvp_scatter, .transpose = tr_scatter, .sharding = sh_scatter, .updates_operand = true}},
    {P_SORT, {.shape = shape_sort, .kernel = kern_sort, .batch = b_sort, .jvp = jvp_sort, .sharding = sh_sort}},
    {P_ARGSORT, {.shape = shape_argsort, .kernel = kern_argsort, .batch = b_argsort, .jvp = jvp_argsort, .sharding = sh_sort}},
};

void prim_index_register(void) { prim_register_rows(rows, sizeof rows / sizeof rows[0]); }
