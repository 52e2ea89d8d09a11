/*
 * prim_layout.c - the primitives that make or rearrange an array without
 * looking at its values (iota, broadcast_in_dim, reshape, transpose,
 * squeeze, expand_dims, rev, slice, concatenate, pad): for each, side by
 * side in its row at the end of the file, the shape rule, the kernel
 * (kern_shape.c), the batching rule and the JVP and transpose rules.
 * Semantics: jax.lax's shape operations (jax/_src/lax/lax.py, slicing.py).
 */
#include "array/prim_rules.h"

/* ==== shape rules ========================================================== */


static int shape_iota(const AVal *in, int nin, const Params *p, AVal *out) {
  DType t;
  int n;
  int64_t shape[SHM_MAXDIM], dim = 0;
  if (params_dtype(p, "dtype", &t) < 0 || params_ints(p, "shape", &n, shape, SHM_MAXDIM) < 0 ||
      prim_check_shape(P_IOTA, n, shape) < 0)
    return -1;
  if (params_get(p, "dimension") && params_int(p, "dimension", &dim) < 0)
    return -1;
  if (n > 0 && (dim < 0 || dim >= n)) {
    err_set(ERR_VALUE, "iota dimension must be between 0 and %d, got %" PRId64, n - 1, dim);
    return -1;
  }
  prim_set(out, t, false, n, shape);
  return 0;
}

static int shape_broadcast_in_dim(const AVal *in, int nin, const Params *p, AVal *out) {
  int n, nb;
  int64_t shape[SHM_MAXDIM], bd[SHM_MAXDIM];
  char a[128], b[128], c[128];
  if (params_ints(p, "shape", &n, shape, SHM_MAXDIM) < 0 ||
      params_ints(p, "broadcast_dimensions", &nb, bd, SHM_MAXDIM) < 0 ||
      prim_check_shape(P_BROADCAST_IN_DIM, n, shape) < 0)
    return -1;
  if (nb != in[0].ndim) {
    err_set(ERR_VALUE, "broadcast_in_dim broadcast_dimensions must have length equal to "
            "operand ndim; got broadcast_dimensions %s for operand ndim %d.",
            prim_ints(a, nb, bd), in[0].ndim);
    return -1;
  }
  for (int i = 0; i < nb; i++) {
    if (bd[i] < 0 || bd[i] >= n || (i > 0 && bd[i] <= bd[i - 1])) {
      err_set(ERR_VALUE, "broadcast_in_dim broadcast_dimensions must be strictly increasing "
              "and within the target rank %d; got broadcast_dimensions %s", n,
              prim_ints(a, nb, bd));
      return -1;
    }
    if (in[0].shape[i] != 1 && in[0].shape[i] != shape[bd[i]]) {
      err_set(ERR_VALUE, "broadcast_in_dim operand dimension sizes must either be 1, or be "
              "equal to their corresponding dimensions in the target broadcast shape; got "
              "operand of shape %s, target broadcast shape %s, broadcast_dimensions %s",
              prim_shape(a, &in[0]), prim_ints(b, n, shape), prim_ints(c, nb, bd));
      return -1;
    }
  }
  prim_set(out, in[0].dtype, in[0].weak, n, shape);
  return 0;
}

static int shape_reshape(const AVal *in, int nin, const Params *p, AVal *out) {
  int n, nd;
  int64_t shape[SHM_MAXDIM], dims[SHM_MAXDIM];
  char a[128], b[128];
  if (params_ints(p, "new_sizes", &n, shape, SHM_MAXDIM) < 0 ||
      prim_check_shape(P_RESHAPE, n, shape) < 0)
    return -1;
  Value *dv = params_get(p, "dimensions");
  if (dv && dv != VAL_NONE &&
      (params_ints(p, "dimensions", &nd, dims, SHM_MAXDIM) < 0 ||
       prim_check_perm(P_RESHAPE, "dimensions", nd, dims, in[0].ndim) < 0))
    return -1;
  int64_t have = shape_size(in[0].ndim, in[0].shape), want = shape_size(n, shape);
  if (have != want) {
    err_set(ERR_VALUE, "reshape total size must be unchanged, got new_sizes %s (of total size "
            "%" PRId64 ") for shape %s (of total size %" PRId64 ").",
            prim_ints(a, n, shape), want, prim_shape(b, &in[0]), have);
    return -1;
  }
  prim_set(out, in[0].dtype, in[0].weak, n, shape);
  return 0;
}

static int shape_transpose(const AVal *in, int nin, const Params *p, AVal *out) {
  int n;
  int64_t perm[SHM_MAXDIM];
  if (params_ints(p, "permutation", &n, perm, SHM_MAXDIM) < 0 ||
      prim_check_perm(P_TRANSPOSE, "permutation", n, perm, in[0].ndim) < 0)
    return -1;
  aval_copy(out, &in[0]);
  for (int i = 0; i < n; i++)
    out->shape[i] = in[0].shape[perm[i]];
  return 0;
}

static int shape_squeeze(const AVal *in, int nin, const Params *p, AVal *out) {
  int n, k = 0;
  int64_t dims[SHM_MAXDIM], shape[SHM_MAXDIM];
  bool mask[SHM_MAXDIM];
  if (prim_dims(P_SQUEEZE, p, "dimensions", in[0].ndim, &n, dims, mask) < 0)
    return -1;
  for (int i = 0; i < in[0].ndim; i++) {
    if (mask[i] && in[0].shape[i] != 1) {
      char a[128];
      err_set(ERR_VALUE, "cannot select an axis to squeeze out which has size not equal to "
              "one, got shape=%s and dimensions=(%d,)", prim_shape(a, &in[0]), i);
      return -1;
    }
    if (!mask[i])
      shape[k++] = in[0].shape[i];
  }
  prim_set(out, in[0].dtype, in[0].weak, k, shape);
  return 0;
}

static int shape_expand_dims(const AVal *in, int nin, const Params *p, AVal *out) {
  int n;
  int64_t dims[SHM_MAXDIM], shape[SHM_MAXDIM];
  bool mask[SHM_MAXDIM];
  if (params_ints(p, "dimensions", &n, dims, SHM_MAXDIM) < 0)
    return -1;
  int nout = in[0].ndim + n;
  if (nout > SHM_MAXDIM) {
    err_set(ERR_VALUE, "expand_dims: result rank %d exceeds %d", nout, SHM_MAXDIM);
    return -1;
  }
  if (prim_dims(P_EXPAND_DIMS, p, "dimensions", nout, &n, dims, mask) < 0)
    return -1;
  for (int i = 0, k = 0; i < nout; i++)
    shape[i] = mask[i] ? 1 : in[0].shape[k++];
  prim_set(out, in[0].dtype, in[0].weak, nout, shape);
  return 0;
}

static int shape_rev(const AVal *in, int nin, const Params *p, AVal *out) {
  int n;
  int64_t dims[SHM_MAXDIM];
  bool mask[SHM_MAXDIM];
  if (prim_dims(P_REV, p, "dimensions", in[0].ndim, &n, dims, mask) < 0)
    return -1;
  aval_copy(out, &in[0]);
  return 0;
}

static int shape_slice(const AVal *in, int nin, const Params *p, AVal *out) {
  int n, nl, ns = 0;
  int64_t st[SHM_MAXDIM], li[SHM_MAXDIM], sd[SHM_MAXDIM];
  char a[128], b[128], c[128];
  if (params_ints(p, "start_indices", &n, st, SHM_MAXDIM) < 0 ||
      params_ints(p, "limit_indices", &nl, li, SHM_MAXDIM) < 0)
    return -1;
  Value *sv = params_get(p, "strides");
  if (sv && sv != VAL_NONE && params_ints(p, "strides", &ns, sd, SHM_MAXDIM) < 0)
    return -1;
  if (n != in[0].ndim || nl != n || (ns && ns != n)) {
    err_set(ERR_VALUE, "slice start_indices, limit_indices and strides must have length equal "
            "to the operand rank %d", in[0].ndim);
    return -1;
  }
  aval_copy(out, &in[0]);
  for (int i = 0; i < n; i++) {
    int64_t s = ns ? sd[i] : 1;
    if (st[i] < 0 || li[i] < st[i] || li[i] > in[0].shape[i] || s < 1) {
      err_set(ERR_VALUE, "slice start_indices %s, limit_indices %s and strides must satisfy "
              "0 <= start <= limit <= shape %s with strides >= 1",
              prim_ints(a, n, st), prim_ints(b, n, li), prim_shape(c, &in[0]));
      return -1;
    }
    out->shape[i] = (li[i] - st[i] + s - 1) / s;
  }
  return 0;
}

static int shape_concatenate(const AVal *in, int nin, const Params *p, AVal *out) {
  int64_t dim;
  int d;
  char a[128], b[128];
  if (nin < 1) {
    err_set(ERR_VALUE, "concatenate requires at least one operand");
    return -1;
  }
  if (params_int(p, "dimension", &dim) < 0 || axis_normalize(dim, in[0].ndim, &d) < 0 ||
      prim_same_dtypes(P_CONCATENATE, in, 0, nin) < 0)
    return -1;
  aval_copy(out, &in[0]);
  out->weak = prim_all_weak(in, 0, nin);
  for (int k = 1; k < nin; k++) {
    bool ok = in[k].ndim == in[0].ndim;
    for (int i = 0; ok && i < in[0].ndim; i++)
      ok = i == d || in[k].shape[i] == in[0].shape[i];
    if (!ok) {
      err_set(ERR_VALUE, "concatenate operands must have the same shape except on dimension "
              "%d, got shapes %s and %s", d, prim_shape(a, &in[0]), prim_shape(b, &in[k]));
      return -1;
    }
    out->shape[d] += in[k].shape[d];
  }
  return 0;
}

static int shape_pad(const AVal *in, int nin, const Params *p, AVal *out) {
  int64_t lo[SHM_MAXDIM], hi[SHM_MAXDIM], it[SHM_MAXDIM];
  if (in[0].dtype != in[1].dtype) {   /* JAX's _pad_dtype_rule */
    err_set(ERR_TYPE, "pad operand and padding_value must be same dtype: got %s and %s.",
            dt_name(in[0].dtype), dt_name(in[1].dtype));
    return -1;
  }
  if (in[1].ndim != 0) {
    err_set(ERR_TYPE, "pad padding_value must be a scalar, got %d dimensions", in[1].ndim);
    return -1;
  }
  if (kern_padding_config(params_get(p, "padding_config"), in[0].ndim, lo, hi, it) < 0)
    return -1;
  aval_copy(out, &in[0]);
  for (int i = 0; i < in[0].ndim; i++) {
    int64_t n = in[0].shape[i];
    int64_t d = lo[i] + hi[i] + n + (n > 0 ? (n - 1) * it[i] : 0);
    if (it[i] < 0 || d < 0) {
      err_set(ERR_VALUE, "pad: interior padding must be non-negative and the padded dimension "
              "%d non-negative, got (%" PRId64 ", %" PRId64 ", %" PRId64 ")", i, lo[i], hi[i], it[i]);
      return -1;
    }
    out->shape[i] = d;
  }
  return 0;
}

/* ==== JVP rules ============================================================ */
static int jvp_concatenate(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  return jvp_multilinear(P_CONCATENATE, nin, x, t, nin, p, yo, to);
}
static int jvp_pad(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  return jvp_multilinear(P_PAD, 2, x, t, nin, p, yo, to);
}

/* ==== transpose rules ====================================================== */

/* broadcast_in_dim: sum over the dimensions the broadcast made (new ones,
 * and size-1 ones it stretched), then the operand's shape back */
static int tr_broadcast_in_dim(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                               const Params *p, Value **cts) {
  (void)in, (void)lin, (void)nin;
  int nb, nd;
  int64_t bd[SHM_MAXDIM], shape[SHM_MAXDIM], axes[SHM_MAXDIM];
  if (ints(p, "broadcast_dimensions", &nb, bd) < 0 || ints(p, "shape", &nd, shape) < 0) return -1;
  int na = 0;
  for (int i = 0; i < nd; i++) {
    int k = -1;
    for (int j = 0; j < nb; j++)
      if (bd[j] == i) k = j;
    if (k < 0 || (av[0].shape[k] == 1 && shape[i] != 1)) axes[na++] = i;
  }
  Scope s = {0};
  return ct_set(&s, cts, 0, reshape(&s, reduce_sum(&s, ct[0], na, axes), av[0].ndim, av[0].shape));
}

/* reshape, squeeze, expand_dims: the operand's shape back */
static int tr_reshape(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                      const Params *p, Value **cts) {
  (void)in, (void)lin, (void)nin, (void)p;
  Scope s = {0};
  return ct_set(&s, cts, 0, reshape(&s, ct[0], av[0].ndim, av[0].shape));
}

static int tr_transpose(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                        const Params *p, Value **cts) {
  (void)in, (void)av, (void)lin, (void)nin;
  int n;
  int64_t perm[SHM_MAXDIM], inv[SHM_MAXDIM];
  if (ints(p, "permutation", &n, perm) < 0) return -1;
  for (int i = 0; i < n; i++) inv[perm[i]] = i;
  Params q;
  params_init(&q);
  params_add(&q, "permutation", val_int_tuple(n, inv));
  Scope s = {0};
  return ct_set(&s, cts, 0, ap(&s, P_TRANSPOSE, 1, ct, &q));
}

static int tr_rev(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                  const Params *p, Value **cts) {
  (void)in, (void)av, (void)lin, (void)nin;
  Scope s = {0};
  return ct_set(&s, cts, 0, same(&s, P_REV, 1, ct, p));
}

/* slice: the cotangent padded back into the operand's shape */
static int tr_slice(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                    const Params *p, Value **cts) {
  (void)in, (void)lin, (void)nin;
  int n, m;
  int64_t st[SHM_MAXDIM], li[SHM_MAXDIM], sd[SHM_MAXDIM], lo[SHM_MAXDIM], hi[SHM_MAXDIM],
      it[SHM_MAXDIM];
  if (ints(p, "start_indices", &n, st) < 0 || ints(p, "limit_indices", &m, li) < 0) return -1;
  Value *strides = params_get(p, "strides");
  for (int i = 0; i < n; i++) sd[i] = 1;
  if (strides && strides != VAL_NONE && ints(p, "strides", &m, sd) < 0) return -1;
  AVal ca;
  if (prim_value_aval(ct[0], &ca) < 0) return -1;
  for (int i = 0; i < n; i++) {
    int64_t k = ca.shape[i];
    lo[i] = st[i];
    it[i] = sd[i] - 1;
    hi[i] = av[0].shape[i] - (k > 0 ? st[i] + (k - 1) * sd[i] + 1 : st[i]);
  }
  Scope s = {0};
  return ct_set(&s, cts, 0, pad_zeros(&s, ct[0], n, lo, hi, it));
}

/* pad: the operand's cotangent is the strided slice where it landed; the
 * padding value's is the sum of the rest */
static int tr_pad(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                  const Params *p, Value **cts) {
  (void)in, (void)nin;
  int64_t lo[SHM_MAXDIM], hi[SHM_MAXDIM], it[SHM_MAXDIM];
  int nd = av[0].ndim;
  if (kern_padding_config(params_get(p, "padding_config"), nd, lo, hi, it) < 0) return -1;
  for (int i = 0; i < nd; i++)
    if (lo[i] < 0 || hi[i] < 0) return prim_rule_missing(P_PAD, "transpose with negative padding");
  int64_t st[SHM_MAXDIM], li[SHM_MAXDIM], sd[SHM_MAXDIM];
  for (int i = 0; i < nd; i++) {
    int64_t n = av[0].shape[i];
    st[i] = lo[i];
    sd[i] = it[i] + 1;
    li[i] = n > 0 ? lo[i] + (n - 1) * sd[i] + 1 : lo[i];
  }
  Scope s = {0};
  Params q;
  params_init(&q);
  params_add(&q, "start_indices", val_int_tuple(nd, st));
  params_add(&q, "limit_indices", val_int_tuple(nd, li));
  params_add(&q, "strides", val_int_tuple(nd, sd));
  Value *x = nd ? ap(&s, P_SLICE, 1, ct, &q) : (params_clear(&q), ct[0]);
  if (lin[1]) {
    Value *rest = sub(&s, sum_all(&s, ct[0]), sum_all(&s, x));
    if (!rest || (cts[1] = val_incref(rest), 0)) {
      scope_end(&s);
      return -1;
    }
  }
  if (!lin[0]) {
    scope_end(&s);
    return 0;
  }
  return ct_set(&s, cts, 0, x);
}

/* concatenate: each linear operand's slice of the cotangent */
static int tr_concatenate(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                          const Params *p, Value **cts) {
  (void)in;
  int64_t dim;
  if (params_int(p, "dimension", &dim) < 0) return -1;
  int nd = av[0].ndim;
  int64_t at = 0;
  for (int i = 0; i < nin; i++) {
    int64_t st[SHM_MAXDIM] = {0}, li[SHM_MAXDIM];
    for (int k = 0; k < nd; k++) li[k] = av[i].shape[k];
    st[dim] = at;
    li[dim] = at + av[i].shape[dim];
    at += av[i].shape[dim];
    if (!lin[i]) continue;
    Params q;
    params_init(&q);
    params_add(&q, "start_indices", val_int_tuple(nd, st));
    params_add(&q, "limit_indices", val_int_tuple(nd, li));
    params_add(&q, "strides", val_incref(VAL_NONE));
    Scope s = {0};
    if (ct_set(&s, cts, i, ap(&s, P_SLICE, 1, ct, &q)) < 0) return -1;
  }
  return 0;
}

/* ==== batching rules ======================================================= */

/* ---- layout ------------------------------------------------------------------- */

static int b_broadcast_in_dim(Value **in, const int *dims, int nin, const Params *p, Value **out,
                              int *od) {
  (void)nin;
  int64_t b = prim_batch_size(in, dims, 1);
  Value *x = moveaxis(in[0], dims[0], 0);
  if (!x) return -1;
  Params q;
  params_but(&q, p, "shape", "broadcast_dimensions");
  params_add(&q, "shape", ints_shifted(p, "shape", 0, 1, b));
  params_add(&q, "broadcast_dimensions", ints_shifted(p, "broadcast_dimensions", 1, 1, 0));
  *out = app(P_BROADCAST_IN_DIM, 1, &x, &q);
  val_decref(x);
  *od = 0;
  return *out ? 0 : -1;
}

static int b_reshape(Value **in, const int *dims, int nin, const Params *p, Value **out, int *od) {
  (void)nin;
  Value *d = params_get(p, "dimensions");
  if (d && d != VAL_NONE) return BATCH_BY_LOOP;
  Value *x = moveaxis(in[0], dims[0], 0);
  return x ? on_front(P_RESHAPE, x, p, "new_sizes", 1, prim_batch_size(in, dims, 1), 0, out, od)
           : -1;
}

static int b_transpose(Value **in, const int *dims, int nin, const Params *p, Value **out,
                       int *od) {
  (void)nin;
  Value *x = moveaxis(in[0], dims[0], 0);
  return x ? on_front(P_TRANSPOSE, x, p, "permutation", 1, 0, 1, out, od) : -1;
}

static int b_slice(Value **in, const int *dims, int nin, const Params *p, Value **out, int *od) {
  (void)nin;
  int64_t b = prim_batch_size(in, dims, 1);
  Value *x = moveaxis(in[0], dims[0], 0);
  if (!x) return -1;
  Params q;
  params_but(&q, p, "start_indices", "limit_indices");
  Value *st = params_get(p, "strides");
  if (st && st != VAL_NONE) {
    params_clear(&q);
    params_but(&q, p, "start_indices", "limit_indices");
    for (int i = 0; i < q.n; i++)
      if (!strcmp(q.p[i].name, "strides")) {
        val_decref(q.p[i].value);
        q.p[i].value = ints_shifted(p, "strides", 0, 1, 1);
      }
  }
  params_add(&q, "start_indices", ints_shifted(p, "start_indices", 0, 1, 0));
  params_add(&q, "limit_indices", ints_shifted(p, "limit_indices", 0, 1, b));
  *out = app(P_SLICE, 1, &x, &q);
  val_decref(x);
  *od = 0;
  return *out ? 0 : -1;
}

static int b_pad(Value **in, const int *dims, int nin, const Params *p, Value **out, int *od) {
  (void)nin;
  if (dims[1] >= 0) return BATCH_BY_LOOP;
  Value *cfg = params_get(p, "padding_config");
  size_t n;
  Value *const *items;
  if (!cfg || !val_seq(cfg, &n, &items)) return BATCH_BY_LOOP;
  Value *c2 = tuple_new(n + 1);
  if (!c2) return -1;
  tuple_set_steal(c2, 0, val_int_tuple(3, (int64_t[]){0, 0, 0}));
  for (size_t i = 0; i < n; i++) tuple_set_steal(c2, i + 1, val_incref(items[i]));
  Value *x = moveaxis(in[0], dims[0], 0);
  Params q;
  params_but(&q, p, "padding_config", NULL);
  params_add(&q, "padding_config", c2);
  *out = x ? app(P_PAD, 2, (Value *[]){x, in[1]}, &q) : (params_clear(&q), NULL);
  if (x) val_decref(x);
  *od = 0;
  return *out ? 0 : -1;
}

static int b_concatenate(Value **in, const int *dims, int nin, const Params *p, Value **out,
                         int *od) {
  int64_t b = prim_batch_size(in, dims, nin), dim;
  if (params_int(p, "dimension", &dim) < 0) return -1;
  Value *few[64], **ops = nin <= 64 ? few : shm_malloc(sizeof(Value *) * (size_t)nin);
  if (!ops) return err_nomem(), -1;
  int made = 0;
  for (; made < nin; made++)
    if (!(ops[made] = front(in, dims, made, b))) break;
  Params q;
  params_but(&q, p, "dimension", NULL);
  params_add(&q, "dimension", val_int(dim + 1));
  *out = made == nin ? app(P_CONCATENATE, nin, ops, &q) : (params_clear(&q), NULL);
  for (int i = 0; i < made; i++) val_decref(ops[i]);
  if (ops != few) shm_free(ops);
  *od = 0;
  return *out ? 0 : -1;
}

/* ==== instances ============================================================ */

ZERO_JVP(iota, IOTA)
LINEAR1_JVP(broadcast_in_dim, BROADCAST_IN_DIM) LINEAR1_JVP(reshape, RESHAPE)
LINEAR1_JVP(transpose, TRANSPOSE) LINEAR1_JVP(squeeze, SQUEEZE)
LINEAR1_JVP(expand_dims, EXPAND_DIMS) LINEAR1_JVP(rev, REV) LINEAR1_JVP(slice, SLICE)
AXES_RULE(b_squeeze, SQUEEZE, "dimensions") AXES_RULE(b_expand_dims, EXPAND_DIMS, "dimensions")
AXES_RULE(b_rev, REV, "dimensions")


/* ==== sharding rules (prim.h; GSPMD's, shmap(7)) ============================= */

/* The set of dimensions param [name] lists, as bits. */
static uint64_t dims_mask(PrimId id, const Params *p, const char *name, int ndim) {
  int n;
  int64_t dims[SHM_MAXDIM];
  bool mask[SHM_MAXDIM];
  uint64_t m = 0;
  if (prim_dims(id, p, name, ndim, &n, dims, mask) < 0) return 0;
  for (int d = 0; d < ndim; d++) m |= (uint64_t)mask[d] << d;
  return m;
}

/* broadcast_in_dim: operand dimension i lands on broadcast_dimensions[i]
 * keeping its split, unless it is a size-1 dimension being broadcast. */
static int sh_broadcast_in_dim(const AVal *in, Sharding *in_sh, int nin, const Params *p,
                               Sharding *out_sh) {
  int n, nb;
  int64_t shape[SHM_MAXDIM], bd[SHM_MAXDIM];
  if (params_ints(p, "shape", &n, shape, SHM_MAXDIM) < 0 ||
      params_ints(p, "broadcast_dimensions", &nb, bd, SHM_MAXDIM) < 0)
    return -1;
  sh_replicated(out_sh, n, &in_sh[0]);
  for (int i = 0; i < nb && i < in[0].ndim; i++) {
    if (in[0].shape[i] != shape[bd[i]]) in_sh[0].nsplit[i] = 0;
    sh_copy_dim(out_sh, (int)bd[i], &in_sh[0], i);
  }
  for (int i = 1; i < nin; i++) sh_replicated(&in_sh[i], in[i].ndim, &in_sh[0]);
  return 0;
}

/* transpose: the spec permuted as the dimensions are. */
static int sh_transpose(const AVal *in, Sharding *in_sh, int nin, const Params *p,
                        Sharding *out_sh) {
  (void)nin;
  int n;
  int64_t perm[SHM_MAXDIM];
  if (params_ints(p, "permutation", &n, perm, SHM_MAXDIM) < 0) return -1;
  sh_replicated(out_sh, in[0].ndim, &in_sh[0]);
  for (int d = 0; d < n; d++) sh_copy_dim(out_sh, d, &in_sh[0], (int)perm[d]);
  return 0;
}

/* One group of a reshape: operand dimensions [i0, i1) and result
 * dimensions [o0, o1) of the same product.  A split survives when the
 * group is one dimension to one, or when only its major operand
 * dimension is split and the major result dimension's size is a multiple
 * of the blocks (a clean split or merge); otherwise the group is
 * resharded to replicated (an all_gather). */
static void reshape_group(const AVal *in, Sharding *in_sh, const int64_t *shape, int i0, int i1,
                          int o0, int o1, Sharding *out_sh) {
  /* leading unsplit size-1 dimensions move no data (JAX's rule for
   * singleton dimensions): the group's major dimensions are past them */
  while (i0 < i1 - 1 && in[0].shape[i0] == 1 && !in_sh[0].nsplit[i0]) i0++;
  while (o0 < o1 - 1 && shape[o0] == 1) o0++;
  bool minor_split = false;
  for (int i = i0 + 1; i < i1; i++) minor_split |= in_sh[0].nsplit[i] != 0;
  if (i0 < i1 && o0 < o1 && !minor_split && shape[o0] % sh_dim_blocks(&in_sh[0], i0) == 0 &&
      (i1 - i0 == 1 || in[0].shape[i0] % sh_dim_blocks(&in_sh[0], i0) == 0)) {
    sh_copy_dim(out_sh, o0, &in_sh[0], i0);
    return;
  }
  for (int i = i0; i < i1; i++) in_sh[0].nsplit[i] = 0;
}

/* Explicit mode's reshape (JAX's rule): a split over Explicit axes that
 * the reshape cannot keep (the operand [was] would be gathered to [now])
 * is an error asking for the result's layout with out_sharding=, unless
 * the reshape has it. */
static int reshape_explicit(const AVal *in, const Sharding *was, const Sharding *now,
                            const Params *p, int n, const int64_t *shape) {
  if (!was->explicit_axes || params_get(p, "out_sharding")) return 0;
  for (int d = 0; d < in[0].ndim; d++)
    if (!sh_same_dim(was, d, now, d) && sh_typed(was, sh_dim_axes(was, d))) {
      char ty[256], sizes[256];
      int w = 0;
      sh_type_str(&in[0], was, ty, sizeof ty);
      for (int k = 0; k < n && w < (int)sizeof sizes - 32; k++)
        w += snprintf(sizes + w, sizeof sizes - (size_t)w, "%s%lld", k ? ", " : "(", (long long)shape[k]);
      snprintf(sizes + w, sizeof sizes - (size_t)w, n == 1 ? ",)" : n ? ")" : "()");
      return sh_type_error("of %s to new sizes %s cannot keep the operand's layout; give the "
                           "result's with out_sharding= (or reshard the operand first)", ty, sizes);
    }
  return 0;
}

/* reshape: dimensions grouped by equal products, left to right. */
static int sh_reshape(const AVal *in, Sharding *in_sh, int nin, const Params *p,
                      Sharding *out_sh) {
  (void)nin;
  int n;
  int64_t shape[SHM_MAXDIM];
  if (params_ints(p, "new_sizes", &n, shape, SHM_MAXDIM) < 0) return -1;
  Sharding was = in_sh[0];
  sh_replicated(out_sh, n, &in_sh[0]);
  int i = 0, o = 0, nd = in[0].ndim;
  while (i < nd || o < n) {
    int i0 = i, o0 = o;
    int64_t a = i < nd ? in[0].shape[i++] : 1, b = o < n ? shape[o++] : 1;
    while (a != b && (i < nd || o < n)) {
      if ((a < b && i < nd) || o >= n) a *= in[0].shape[i++];
      else b *= shape[o++];
    }
    reshape_group(in, in_sh, shape, i0, i, o0, o, out_sh);
  }
  return reshape_explicit(in, &was, &in_sh[0], p, n, shape);
}

/* squeeze: the listed (size-1) dimensions drop out. */
static int sh_squeeze(const AVal *in, Sharding *in_sh, int nin, const Params *p,
                      Sharding *out_sh) {
  (void)nin;
  uint64_t m = dims_mask(P_SQUEEZE, p, "dimensions", in[0].ndim);
  return sh_reduce(in, in_sh, m, NULL, out_sh);
}

/* expand_dims: new unsplit dimensions at the listed places. */
static int sh_expand_dims(const AVal *in, Sharding *in_sh, int nin, const Params *p,
                          Sharding *out_sh) {
  (void)nin;
  int nout = in[0].ndim, n;
  int64_t dims[SHM_MAXDIM];
  if (params_ints(p, "dimensions", &n, dims, SHM_MAXDIM) < 0) return -1;
  nout += n;
  uint64_t m = dims_mask(P_EXPAND_DIMS, p, "dimensions", nout);
  sh_replicated(out_sh, nout, &in_sh[0]);
  for (int d = 0, k = 0; d < nout; d++)
    if (!(m >> d & 1)) sh_copy_dim(out_sh, d, &in_sh[0], k++);
  return 0;
}

/* rev: the reversed dimensions unsplit (the blocks trade places); in
 * Explicit mode the result has the operand's type (JAX's rule). */
static int sh_rev(const AVal *in, Sharding *in_sh, int nin, const Params *p, Sharding *out_sh) {
  Sharding type;
  sh_type_of(&in_sh[0], &type);
  if (sh_keep_but(in, in_sh, nin, dims_mask(P_REV, p, "dimensions", in[0].ndim), out_sh) < 0)
    return -1;
  return type.explicit_axes ? sh_retype(out_sh, &type) : 0;
}

/* slice: a dimension whose size changes is unsplit (one that keeps it is
 * whole: start 0, stride 1). */
static int sh_resize(const AVal *in, Sharding *in_sh, int nin, const Params *p,
                     Sharding *out_sh, PrimId id) {
  AVal out;
  if (prim_table[id].rules.shape(in, nin, p, &out) < 0) return -1;
  uint64_t m = 0;
  for (int d = 0; d < in[0].ndim; d++) m |= (uint64_t)(in[0].shape[d] != out.shape[d]) << d;
  for (int i = 1; i < nin; i++) sh_replicated(&in_sh[i], in[i].ndim, &in_sh[0]);
  return sh_keep_but(in, in_sh, 1, m, out_sh);
}

static int sh_slice(const AVal *in, Sharding *in_sh, int nin, const Params *p, Sharding *out_sh) {
  Sharding was = in_sh[0];
  if (sh_resize(in, in_sh, nin, p, out_sh, P_SLICE) < 0) return -1;
  return sh_explicit_varying(P_SLICE, in, nin, &was, p, "slicing", out_sh);
}

/* pad: a dimension padded at all is unsplit, even one whose size stays
 * (a low pad with a negative high one shifts the data across blocks). */
static int sh_pad(const AVal *in, Sharding *in_sh, int nin, const Params *p, Sharding *out_sh) {
  int64_t lo[SHM_MAXDIM], hi[SHM_MAXDIM], it[SHM_MAXDIM];
  if (kern_padding_config(params_get(p, "padding_config"), in[0].ndim, lo, hi, it) < 0) return -1;
  uint64_t m = 0;
  for (int d = 0; d < in[0].ndim; d++) m |= (uint64_t)(lo[d] || hi[d] || it[d]) << d;
  Sharding was = in_sh[0];
  for (int i = 1; i < nin; i++) sh_replicated(&in_sh[i], in[i].ndim, &in_sh[0]);
  if (sh_keep_but(in, in_sh, 1, m, out_sh) < 0) return -1;
  return sh_explicit_varying(P_PAD, in, nin, &was, p, "padding", out_sh);
}

/* concatenate: the joined dimension unsplit, the others element-wise;
 * in Explicit mode the operands have one type, the result's (JAX's
 * rule), even split along the joined dimension. */
static int sh_concatenate(const AVal *in, Sharding *in_sh, int nin, const Params *p, Sharding *out_sh) {
  Sharding type;
  sh_type_of(&in_sh[0], &type);
  if (type.explicit_axes &&
      sh_check_same_types(in, in_sh, 0, nin, "operands should all have the same sharding") < 0)
    return -1;
  if (sh_keep_but_param(in, in_sh, nin, p, "dimension", out_sh) < 0) return -1;
  return type.explicit_axes ? sh_retype(out_sh, &type) : 0;
}

/* broadcast_in_dim in a fused loop: result dimension bd[i] reads operand
 * dimension i, every other one is new (FuseRule.dims). */
static int fuse_dims_broadcast_in_dim(const AVal *in, const Params *p, int *src_dim) {
  int n, nb;
  int64_t shape[SHM_MAXDIM], bd[SHM_MAXDIM];
  if (params_ints(p, "shape", &n, shape, SHM_MAXDIM) < 0 ||
      params_ints(p, "broadcast_dimensions", &nb, bd, SHM_MAXDIM) < 0)
    return -1;
  (void)in;
  for (int d = 0; d < n; d++) src_dim[d] = -1;
  for (int i = 0; i < nb; i++) src_dim[bd[i]] = i;
  return 0;
}
static const FuseRule fuse_broadcast_in_dim = {.dims = fuse_dims_broadcast_in_dim};

/* ==== the rows ============================================================= */

/* Each primitive's rules, side by side (prim.h, PrimRules). */
static const PrimRow rows[] = {
    {P_IOTA, {.shape = shape_iota, .kernel = kern_iota, .jvp = jvp_iota}},
    {P_BROADCAST_IN_DIM, {.shape = shape_broadcast_in_dim, .kernel = kern_broadcast_in_dim, .batch = b_broadcast_in_dim, .jvp = jvp_broadcast_in_dim, .transpose = tr_broadcast_in_dim, .sharding = sh_broadcast_in_dim, .fuse = &fuse_broadcast_in_dim}},
    {P_RESHAPE, {.shape = shape_reshape, .kernel = kern_reshape, .batch = b_reshape, .jvp = jvp_reshape, .transpose = tr_reshape, .sharding = sh_reshape}},
    {P_TRANSPOSE, {.shape = shape_transpose, .kernel = kern_transpose, .batch = b_transpose, .jvp = jvp_transpose, .transpose = tr_transpose, .sharding = sh_transpose}},
    {P_SQUEEZE, {.shape = shape_squeeze, .kernel = kern_squeeze, .batch = b_squeeze, .jvp = jvp_squeeze, .transpose = tr_reshape, .sharding = sh_squeeze}},
    {P_EXPAND_DIMS, {.shape = shape_expand_dims, .kernel = kern_expand_dims, .batch = b_expand_dims, .jvp = jvp_expand_dims, .transpose = tr_reshape, .sharding = sh_expand_dims}},
    {P_REV, {.shape = shape_rev, .kernel = kern_rev, .batch = b_rev, .jvp = jvp_rev, .transpose = tr_rev, .sharding = sh_rev}},
    {P_SLICE, {.shape = shape_slice, .kernel = kern_slice, .batch = b_slice, .jvp = jvp_slice, .transpose = tr_slice, .sharding = sh_slice}},
    {P_CONCATENATE, {.shape = shape_concatenate, .kernel = kern_concatenate, .batch = b_concatenate, .jvp = jvp_concatenate, .transpose = tr_concatenate, .sharding = sh_concatenate}},
    {P_PAD, {.shape = shape_pad, .kernel = kern_pad, .batch = b_pad, .jvp = jvp_pad, .transpose = tr_pad, .sharding = sh_pad}},
};

void prim_layout_register(void) { prim_register_rows(rows, sizeof rows / sizeof rows[0]); }
