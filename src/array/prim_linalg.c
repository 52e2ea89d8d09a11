/*
 * prim_linalg.c - the factorisation primitives of jax.lax.linalg: lu,
 * triangular_solve, cholesky, eigh, svd and qr.  Their kernels call
 * LAPACK (lapack.c); here are their shape rules, batching (the kernels
 * loop over leading batch dimensions, so vmap moves its axis to the
 * front), JVP rules (JAX's, jax/_src/lax/linalg.py: lu, triangular_solve
 * with its transpose, cholesky, eigh, svd and qr, each raising JAX's
 * NotImplementedError for the shapes JAX's does not cover) and costs, side by side in
 * the rows at the end of the file, with their sharding rules: the batch
 * dimensions keep their splits, each device factoring its own matrices.
 */
#include "array/lapack.h"
#include "array/prim_rules.h"

/* ==== shape rules ========================================================== */

/* Checks that [a], operand of [id], is a float32 or float64 array of at
 * least two dimensions, square when [square]: jax.lax.linalg's checks. */
static int check_matrix(PrimId id, const AVal *a, bool square) {
  char b[128];
  if (a->dtype != DT_F32 && a->dtype != DT_F64) {
    err_set(ERR_TYPE, "%s requires a float32 or float64 operand, got %s", prim_table[id].name,
            dt_name(a->dtype));
    return -1;
  }
  if (a->ndim < 2 || (square && a->shape[a->ndim - 1] != a->shape[a->ndim - 2])) {
    err_set(ERR_VALUE, "Argument to %s must have shape [..., %s], got %s", prim_table[id].name,
            square ? "n, n" : "m, n", prim_shape(b, a));
    return -1;
  }
  return 0;
}

/* [a]'s aval with its last [drop] dimensions replaced by [nk] sizes [k]
 * and dtype [t], into [o]. */
static void aval_with(const AVal *a, int drop, int nk, const int64_t *k, DType t, AVal *o) {
  int64_t shape[SHM_MAXDIM];
  int nd = a->ndim - drop;
  for (int i = 0; i < nd; i++) shape[i] = a->shape[i];
  for (int i = 0; i < nk; i++) shape[nd + i] = k[i];
  prim_set(o, t, false, nd + nk, shape);
}

static int shape_lu(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)nin, (void)p;
  if (check_matrix(P_LU, &in[0], false) < 0) return -1;
  int64_t m = in[0].shape[in[0].ndim - 2], n = in[0].shape[in[0].ndim - 1];
  int64_t k = m < n ? m : n;
  aval_with(&in[0], 0, 0, NULL, in[0].dtype, &out[0]);
  aval_with(&in[0], 2, 1, &k, DT_I32, &out[1]);
  aval_with(&in[0], 2, 1, &m, DT_I32, &out[2]);
  return 0;
}

static bool flag(const Params *p, const char *name) {
  Value *v = params_get(p, name);
  return v && val_truth(v) > 0;
}

static int shape_triangular_solve(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)nin;
  char x[128], y[128];
  if (check_matrix(P_TRIANGULAR_SOLVE, &in[0], true) < 0 ||
      check_matrix(P_TRIANGULAR_SOLVE, &in[1], false) < 0 ||
      prim_same_dtypes(P_TRIANGULAR_SOLVE, in, 0, 2) < 0)
    return -1;
  const AVal *a = &in[0], *b = &in[1];
  int64_t m = a->shape[a->ndim - 1];
  int64_t common = flag(p, "left_side") ? b->shape[b->ndim - 2] : b->shape[b->ndim - 1];
  if (a->ndim != b->ndim || !prim_same_dims(a->ndim - 2, a->shape, b->shape) || common != m) {
    err_set(ERR_VALUE, "Incompatible shapes for arguments to triangular_solve: %s and %s.",
            prim_shape(x, a), prim_shape(y, b));
    return -1;
  }
  aval_with(b, 0, 0, NULL, b->dtype, &out[0]);
  return 0;
}

static int shape_cholesky(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)nin, (void)p;
  if (check_matrix(P_CHOLESKY, &in[0], true) < 0) return -1;
  aval_with(&in[0], 0, 0, NULL, in[0].dtype, &out[0]);
  return 0;
}

static int shape_eigh(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)nin, (void)p;
  if (check_matrix(P_EIGH, &in[0], true) < 0) return -1;
  int64_t n = in[0].shape[in[0].ndim - 1];
  aval_with(&in[0], 0, 0, NULL, in[0].dtype, &out[0]);
  aval_with(&in[0], 2, 1, &n, in[0].dtype, &out[1]);
  return 0;
}

static int shape_svd(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)nin;
  if (check_matrix(P_SVD, &in[0], false) < 0) return -1;
  bool full = flag(p, "full_matrices");
  int64_t m = in[0].shape[in[0].ndim - 2], n = in[0].shape[in[0].ndim - 1];
  int64_t k = m < n ? m : n;
  aval_with(&in[0], 2, 1, &k, in[0].dtype, &out[0]);
  aval_with(&in[0], 2, 2, (int64_t[]){m, full ? m : k}, in[0].dtype, &out[1]);
  aval_with(&in[0], 2, 2, (int64_t[]){full ? n : k, n}, in[0].dtype, &out[2]);
  return 0;
}

static int shape_qr(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)nin;
  if (check_matrix(P_QR, &in[0], false) < 0) return -1;
  bool full = flag(p, "full_matrices");
  int64_t m = in[0].shape[in[0].ndim - 2], n = in[0].shape[in[0].ndim - 1];
  int64_t k = full ? m : m < n ? m : n;
  aval_with(&in[0], 2, 2, (int64_t[]){m, k}, in[0].dtype, &out[0]);
  aval_with(&in[0], 2, 2, (int64_t[]){k, n}, in[0].dtype, &out[1]);
  return 0;
}

/* ==== batching ============================================================= */

/* Every operand with the batch axis first (an unbatched one repeated
 * along it), then the primitive with the same parameters: the kernels
 * loop over leading batch dimensions.  Every result is batched along 0;
 * several results come back as a tuple (batch.c splits it). */
static int batch_front(PrimId id, Value **in, const int *dims, int nin, const Params *p,
                       Value **out, int *od) {
  int64_t b = prim_batch_size(in, dims, nin);
  Value *ops[2] = {NULL, NULL};
  int made = 0;
  for (; made < nin; made++) {
    ops[made] = dims[made] >= 0 ? prim_batch_moveaxis(in[made], dims[made], 0)
                                : prim_batch_repeat_front(in[made], b);
    if (!ops[made]) break;
  }
  *out = made == nin ? prim_apply(id, nin, ops, p) : NULL;
  for (int i = 0; i < made; i++) val_decref(ops[i]);
  *od = 0;
  return *out ? 0 : -1;
}

#define BATCH_FRONT(name, ID)                                                                 \
  static int batch_##name(Value **in, const int *dims, int nin, const Params *p, Value **out, \
                          int *od) {                                                          \
    return batch_front(P_##ID, in, dims, nin, p, out, od);                                    \
  }
BATCH_FRONT(lu, LU)
BATCH_FRONT(triangular_solve, TRIANGULAR_SOLVE)
BATCH_FRONT(cholesky, CHOLESKY)
BATCH_FRONT(eigh, EIGH)
BATCH_FRONT(svd, SVD)
BATCH_FRONT(qr, QR)

/* ==== building blocks of the JVP rules ====================================== */

/* The batched matrix product a @ b over the last two dimensions, the
 * leading ones batch dimensions of both (lax.batch_matmul). */
static Value *mm(Scope *s, Value *a, Value *b) {
  AVal x;
  if (!aval_ok(a, &x) || !b) return NULL;
  int nb = x.ndim - 2;
  int64_t batch[SHM_MAXDIM], lc = x.ndim - 1, rc = x.ndim - 2;
  for (int i = 0; i < nb; i++) batch[i] = i;
  Params p;
  params_init(&p);
  params_add(&p, "dimension_numbers", val_dot_dimension_numbers(1, &lc, &rc, nb, batch, batch));
  params_add(&p, "preferred_element_type", val_incref(VAL_NONE));
  return ap(s, P_DOT_GENERAL, 2, (Value *[]){a, b}, &p);
}

/* [x] with its last two dimensions swapped. */
static Value *mt(Scope *s, Value *x) {
  AVal a;
  if (!aval_ok(x, &a)) return NULL;
  int64_t perm[SHM_MAXDIM];
  for (int i = 0; i < a.ndim; i++) perm[i] = i;
  perm[a.ndim - 1] = a.ndim - 2;
  perm[a.ndim - 2] = a.ndim - 1;
  Params p;
  params_init(&p);
  params_add(&p, "permutation", val_int_tuple(a.ndim, perm));
  return ap(s, P_TRANSPOSE, 1, &x, &p);
}

/* A constant of [x]'s aval (..., n, n) whose element (i, j) is [below]
 * under the diagonal, [on] on it and [above] over it, in every matrix of
 * the batch: the masks of tril, triu and the identity. */
static Value *band_from(Scope *s, Value *x, double below, double on, double above, int64_t from);

static Value *band(Scope *s, Value *x, double below, double on, double above) {
  return band_from(s, x, below, on, above, 0);
}

/* band's constant with [on] only on the diagonal's elements from
 * (from, from) on, 0 on those before. */
static Value *band_from(Scope *s, Value *x, double below, double on, double above, int64_t from) {
  AVal a;
  if (!aval_ok(x, &a)) return NULL;
  int64_t r = a.shape[a.ndim - 2], c = a.shape[a.ndim - 1];
  Array *m = arr_new(a.dtype, 2, (int64_t[]){r, c});
  if (!m) return NULL;
  for (int64_t i = 0; i < r; i++)
    for (int64_t j = 0; j < c; j++) {
      double v = i > j ? below : i == j ? (i >= from ? on : 0.0) : above;
      if (a.dtype == DT_F64)
        ((double *)arr_data(m))[i * c + j] = v;
      else
        ((float *)arr_data(m))[i * c + j] = (float)v;
    }
  Value *mv = keep(s, &m->hdr);
  int64_t bd[2] = {a.ndim - 2, a.ndim - 1};
  return a.ndim == 2 ? mv : bcast(s, mv, a.ndim, a.shape, 2, bd);
}

/* [x]'s first [r] rows and [c] columns (a slice of its last two
 * dimensions). */
static Value *corner(Scope *s, Value *x, int64_t r, int64_t c) {
  AVal a;
  if (!aval_ok(x, &a)) return NULL;
  int64_t st[SHM_MAXDIM] = {0}, li[SHM_MAXDIM];
  for (int i = 0; i < a.ndim; i++) li[i] = a.shape[i];
  li[a.ndim - 2] = r;
  li[a.ndim - 1] = c;
  Params p;
  params_init(&p);
  params_add(&p, "start_indices", val_int_tuple(a.ndim, st));
  params_add(&p, "limit_indices", val_int_tuple(a.ndim, li));
  params_add(&p, "strides", val_incref(VAL_NONE));
  return ap(s, P_SLICE, 1, &x, &p);
}

/* [x] padded with zeros after its last rows and columns to [r] x [c]. */
static Value *grow(Scope *s, Value *x, int64_t r, int64_t c) {
  AVal a;
  if (!aval_ok(x, &a)) return NULL;
  int64_t lo[SHM_MAXDIM] = {0}, hi[SHM_MAXDIM] = {0}, it[SHM_MAXDIM] = {0};
  hi[a.ndim - 2] = r - a.shape[a.ndim - 2];
  hi[a.ndim - 1] = c - a.shape[a.ndim - 1];
  return pad_zeros(s, x, a.ndim, lo, hi, it);
}

/* triangular_solve(a, b) with the given parameters. */
static Value *trisolve(Scope *s, Value *a, Value *b, bool left, bool lower, bool trans,
                       bool unit) {
  Params p;
  params_init(&p);
  params_add(&p, "left_side", val_incref(val_bool(left)));
  params_add(&p, "lower", val_incref(val_bool(lower)));
  params_add(&p, "transpose_a", val_incref(val_bool(trans)));
  params_add(&p, "conjugate_a", val_incref(val_bool(false)));
  params_add(&p, "unit_diagonal", val_incref(val_bool(unit)));
  return ap(s, P_TRIANGULAR_SOLVE, 2, (Value *[]){a, b}, &p);
}

/* The [nout] results of [id] on [x], split into [yo] (new references). */
static int primal_n(PrimId id, Value **x, int nin, const Params *p, int nout, Value **yo) {
  Value *r;
  if (primal(id, x, nin, p, &r) < 0) return -1;
  for (int k = 0; k < nout; k++) yo[k] = val_incref(tuple_get(r, (size_t)k));
  val_decref(r);
  return 0;
}

/* Finishes a JVP rule of several results: the tangent [t] (borrowed
 * from [s]) of result 0, the others symbolic zeros; on an error the
 * primal results [yo] are released. */
static int jvp_done_n(Scope *s, Value *t, int nout, Value **yo, Value **to) {
  to[0] = scope_return(s, t);
  if (to[0]) return 0;
  for (int k = 0; k < nout; k++) {
    val_decref(yo[k]);
    yo[k] = NULL;
  }
  return -1;
}

/* ==== JVP and transpose rules =============================================== */

/* triangular_solve: linear in b; in a, JAX's _triangular_solve_jvp_rule_a:
 * with g_a = -op(tri(dA)), x' = A^-1 (g_a x) (left) or (x g_a) A^-1. */
static int jvp_triangular_solve(Value **x, Value **t, int nin, const Params *p, Value **yo,
                                Value **to) {
  (void)nin;
  if (primal(P_TRIANGULAR_SOLVE, x, 2, p, yo) < 0) return -1;
  *to = NULL;
  if (!t[0] && !t[1]) return 0;
  Scope s = {0};
  bool left = flag(p, "left_side"), lower = flag(p, "lower"), trans = flag(p, "transpose_a");
  bool unit = flag(p, "unit_diagonal");
  Value *da = NULL, *db = t[1] ? same(&s, P_TRIANGULAR_SOLVE, 2, (Value *[]){x[0], t[1]}, p) : NULL;
  if (t[0]) {
    double d = unit ? 0.0 : 1.0;
    Value *g = mul(&s, t[0], band(&s, t[0], lower ? 1.0 : 0.0, d, lower ? 0.0 : 1.0));
    g = neg(&s, g);
    if (trans) g = mt(&s, g);
    Value *prod = left ? mm(&s, g, *yo) : mm(&s, *yo, g);
    da = trisolve(&s, x[0], prod, left, lower, trans, unit);
  }
  return jvp_done(&s, da && db ? add(&s, da, db) : da ? da : db, false, yo, to);
}

/* Linear in b: the cotangent solves with op(a) transposed (JAX's
 * _triangular_solve_transpose_rule). */
static int tr_triangular_solve(Value **ct, Value **in, const AVal *av, const bool *linear, int nin,
                               const Params *p, Value **cts) {
  (void)av, (void)nin;
  cts[0] = cts[1] = NULL;
  if (linear[0]) return prim_rule_missing(P_TRIANGULAR_SOLVE, "transposition in a");
  if (!ct[0]) return 0;
  Scope s = {0};
  Value *r = trisolve(&s, in[0], ct[0], flag(p, "left_side"), flag(p, "lower"),
                      !flag(p, "transpose_a"), flag(p, "unit_diagonal"));
  cts[1] = scope_return(&s, r);
  return cts[1] ? 0 : -1;
}

/* lu: JAX's _lu_jvp_rule.  With k = min(m, n), L (m x m) the unit lower
 * triangle of lu's first k columns and U (n x n) the upper triangle of
 * its first k rows, the identity below them: X = P dA, W = L^-1 X U^-1,
 * lu' = L tril(W, -1) + triu(W) U. */
static int jvp_lu(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  AVal a;
  if (prim_value_aval(x[0], &a) < 0) return -1;
  if (primal_n(P_LU, x, nin, p, 3, yo) < 0) return -1;
  to[0] = to[1] = to[2] = NULL;
  if (!t[0]) return 0;
  Scope s = {0};
  int nd = a.ndim;
  int64_t m = a.shape[nd - 2], n = a.shape[nd - 1], k = m < n ? m : n;
  Value *lu = yo[0];
  Value *lk = corner(&s, lu, m, k), *uk = corner(&s, lu, k, n);
  Value *l = grow(&s, mul(&s, lk, band(&s, lk, 1, 0, 0)), m, m);
  l = add(&s, l, band(&s, l, 0, 1, 0));
  Value *u = grow(&s, mul(&s, uk, band(&s, uk, 0, 1, 1)), n, n);
  u = add(&s, u, band_from(&s, u, 0, 1, 0, k));
  int64_t shape[SHM_MAXDIM];
  for (int i = 0; i < nd - 1; i++) shape[i] = a.shape[i];
  shape[nd - 1] = 1;
  Value *rows = reshape(&s, yo[2], nd, shape);
  Value *px = rows ? keep(&s, prim_take_along(t[0], rows, nd - 2)) : NULL;
  Value *la = trisolve(&s, l, px, true, true, false, true);
  Value *lau = trisolve(&s, u, la, false, false, false, false);
  Value *ld = mm(&s, l, mul(&s, lau, band(&s, lau, 1, 0, 0)));
  Value *ud = mm(&s, mul(&s, lau, band(&s, lau, 0, 1, 1)), u);
  return jvp_done_n(&s, add(&s, ld, ud), 3, yo, to);
}

/* cholesky: JAX's _cholesky_jvp_rule (Murray, arXiv:1602.07527):
 * L' = L phi(L^-1 dA L^-T), phi taking the lower triangle with the
 * diagonal halved. */
static int jvp_cholesky(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  (void)nin;
  if (primal(P_CHOLESKY, x, 1, p, yo) < 0) return -1;
  *to = NULL;
  if (!t[0]) return 0;
  Scope s = {0};
  Value *l = *yo;
  Value *tmp = trisolve(&s, l, t[0], false, true, true, false);
  Value *w = trisolve(&s, l, tmp, true, true, false, false);
  Value *phi = mul(&s, w, band(&s, w, 1.0, 0.5, 0.0));
  return jvp_done(&s, mm(&s, l, phi), false, yo, to);
}

/* eigh: JAX's _eigh_jvp_rule: with F = 1 / (w_j - w_i) off the diagonal
 * and 0 on it, and M = V^T dA V, V' = V (F * M) and w' = diag(M). */
static int jvp_eigh(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  if (primal_n(P_EIGH, x, nin, p, 2, yo) < 0) return -1;
  to[0] = to[1] = NULL;
  if (!t[0]) return 0;
  Scope s = {0};
  Value *v = yo[0], *w = yo[1];
  AVal va;
  if (prim_value_aval(v, &va) < 0) return jvp_done_n(&s, NULL, 2, yo, to);
  int nd = va.ndim;
  int64_t row[SHM_MAXDIM], col[SHM_MAXDIM];
  for (int i = 0; i < nd - 2; i++) row[i] = col[i] = i;
  row[nd - 2] = nd - 1;   /* w[..., None, :] */
  col[nd - 2] = nd - 2;   /* w[..., :, None] */
  Value *eye = band(&s, v, 0, 1, 0);
  Value *diff = sub(&s, bcast(&s, w, nd, va.shape, nd - 1, row), bcast(&s, w, nd, va.shape, nd - 1, col));
  Value *f = sub(&s, dvd(&s, scal(&s, 1.0, v), add(&s, eye, diff)), eye);
  Value *m = mm(&s, mm(&s, mt(&s, v), t[0]), v);
  Value *dv = mm(&s, v, mul(&s, f, m));
  int64_t last = nd - 1;
  Value *dw = reduce_sum(&s, mul(&s, m, eye), 1, &last);
  if (!dv || !dw) return jvp_done_n(&s, NULL, 2, yo, to);
  to[1] = val_incref(dw);
  to[0] = scope_return(&s, dv);
  return 0;
}

/* [s] (..., k) broadcast along a new dimension to [shape] (rank [nd], its
 * last dimension k): each row s when [along_rows], else each column. */
static Value *spread(Scope *s, Value *v, int nd, const int64_t *shape, bool along_rows) {
  int64_t dims[SHM_MAXDIM];
  for (int i = 0; i < nd - 2; i++) dims[i] = i;
  dims[nd - 2] = along_rows ? nd - 1 : nd - 2;
  return bcast(s, v, nd, shape, nd - 1, dims);
}

/* svd: JAX's _svd_jvp_rule (real dtypes, where its dUdV_diag term is
 * zero): with dS = U^T dA V, s' = diag(dS); F = 1 / (s_j^2 - s_i^2) off
 * the diagonal, U' = U (F * (dS S + S dS^T)), V' = V (F * (S dS + dS^T
 * S)), plus the parts outside U's (m > n) or V's (n > m) columns. */
static int jvp_svd(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  AVal a;
  if (prim_value_aval(x[0], &a) < 0) return -1;
  int nd = a.ndim;
  int64_t m = a.shape[nd - 2], n = a.shape[nd - 1];
  bool uv = !params_get(p, "compute_uv") || flag(p, "compute_uv");
  if (t[0] && uv && flag(p, "full_matrices") && m != n)
    return err_set(ERR_NOT_IMPLEMENTED,
                   "Singular value decomposition JVP not implemented for full matrices"), -1;
  /* U and V with their own derivatives even when only s is asked for
   * (a second derivative of s goes through them), as JAX binds svd with
   * compute_uv=True in its rule */
  Params q;
  params_init(&q);
  params_add(&q, "full_matrices", val_incref(val_bool(flag(p, "full_matrices"))));
  params_add(&q, "compute_uv", val_incref(val_bool(true)));
  int rc = primal_n(P_SVD, x, nin, &q, 3, yo);
  params_clear(&q);
  if (rc < 0) return -1;
  to[0] = to[1] = to[2] = NULL;
  if (!t[0]) return 0;
  Scope s = {0};
  Value *sv = yo[0], *u = yo[1], *vt = yo[2], *v = mt(&s, vt), *ut = mt(&s, u);
  Value *ds_mat = mm(&s, mm(&s, ut, t[0]), v);
  AVal ka;
  if (!aval_ok(ds_mat, &ka)) return jvp_done_n(&s, NULL, 3, yo, to);
  Value *eye = band(&s, ds_mat, 0, 1, 0);
  int64_t last = nd - 1;
  Value *ds = reduce_sum(&s, mul(&s, ds_mat, eye), 1, &last);
  if (!uv) return jvp_done_n(&s, ds, 3, yo, to);
  Value *row = spread(&s, sv, nd, ka.shape, true), *col = spread(&s, sv, nd, ka.shape, false);
  Value *diffs = mul(&s, add(&s, row, col), sub(&s, row, col));
  Value *f = sub(&s, dvd(&s, scal(&s, 1.0, diffs), add(&s, diffs, eye)), eye);
  Value *dss = mul(&s, row, ds_mat), *sds = mul(&s, col, ds_mat);
  Value *du = mm(&s, u, mul(&s, f, add(&s, dss, mt(&s, dss))));
  Value *dv = mm(&s, v, mul(&s, f, add(&s, sds, mt(&s, sds))));
  AVal pa;
  if (m > n) {   /* dA V's part outside U's columns */
    Value *dav = mm(&s, t[0], v);
    if (!aval_ok(dav, &pa)) return jvp_done_n(&s, NULL, 3, yo, to);
    Value *rest = sub(&s, dav, mm(&s, u, mm(&s, ut, dav)));
    du = add(&s, du, dvd(&s, rest, spread(&s, sv, nd, pa.shape, true)));
  }
  if (n > m) {   /* dA^T U's part outside V's columns */
    Value *dahu = mm(&s, mt(&s, t[0]), u);
    if (!aval_ok(dahu, &pa)) return jvp_done_n(&s, NULL, 3, yo, to);
    Value *rest = sub(&s, dahu, mm(&s, v, mm(&s, vt, dahu)));
    dv = add(&s, dv, dvd(&s, rest, spread(&s, sv, nd, pa.shape, true)));
  }
  Value *dvt = mt(&s, dv);
  if (!ds || !du || !dvt) return jvp_done_n(&s, NULL, 3, yo, to);
  to[1] = val_incref(du);
  to[2] = val_incref(dvt);
  return jvp_done_n(&s, ds, 3, yo, to);
}

/* qr of a matrix with m >= n (reduced, or square): JAX's qr_jvp_rule
 * (j-towns.github.io/papers/qr-derivative.pdf): with X = dA R^-1 and
 * C = Q^T X, O = tril(C, -1) - tril(C, -1)^T, Q' = Q (O - C) + X and
 * R' = (C - O) R. */
static int jvp_qr(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  AVal a;
  if (prim_value_aval(x[0], &a) < 0) return -1;
  int64_t m = a.shape[a.ndim - 2], n = a.shape[a.ndim - 1];
  if (t[0] && (m < n || (flag(p, "full_matrices") && m != n)))
    return err_set(ERR_NOT_IMPLEMENTED, "Unimplemented case of QR decomposition derivative"), -1;
  if (primal_n(P_QR, x, nin, p, 2, yo) < 0) return -1;
  to[0] = to[1] = NULL;
  if (!t[0]) return 0;
  Scope s = {0};
  Value *q = yo[0], *r = yo[1];
  Value *xr = trisolve(&s, r, t[0], false, false, false, false);
  Value *c = mm(&s, mt(&s, q), xr);
  Value *low = mul(&s, c, band(&s, c, 1, 0, 0));
  Value *o = sub(&s, low, mt(&s, low));
  Value *dq = add(&s, mm(&s, q, sub(&s, o, c)), xr);
  Value *dr = mm(&s, sub(&s, c, o), r);
  if (!dq || !dr) return jvp_done_n(&s, NULL, 2, yo, to);
  to[1] = val_incref(dr);
  return jvp_done_n(&s, dq, 2, yo, to);
}

/* ==== costs ================================================================== */

/* The textbook flop counts of the factorisations (Golub and Van Loan),
 * per matrix of the batch: XLA counts nothing for its LAPACK calls. */
static double batch_of(const AVal *a) {
  double n = 1;
  for (int i = 0; i + 2 < a->ndim; i++) n *= (double)a->shape[i];
  return n;
}

static void cost_factor(const AVal *a, double per_mnk, PrimCost *c) {
  double m = (double)a->shape[a->ndim - 2], n = (double)a->shape[a->ndim - 1];
  double k = m < n ? m : n;
  c->flops += batch_of(a) * per_mnk * m * n * k;
}

static void cost_lu(const Params *p, int nin, const AVal *in, int nout, const AVal *out, PrimCost *c) {
  (void)p, (void)nin, (void)nout, (void)out;
  cost_factor(&in[0], 2.0 / 3.0, c);
}

static void cost_triangular_solve(const Params *p, int nin, const AVal *in, int nout, const AVal *out,
                                  PrimCost *c) {
  (void)p, (void)nin, (void)nout, (void)out;
  double m = (double)in[0].shape[in[0].ndim - 1];
  c->flops += batch_of(&in[0]) * m * (double)in[1].shape[in[1].ndim - 2] *
              (double)in[1].shape[in[1].ndim - 1];
}

static void cost_cholesky(const Params *p, int nin, const AVal *in, int nout, const AVal *out,
                          PrimCost *c) {
  (void)p, (void)nin, (void)nout, (void)out;
  cost_factor(&in[0], 1.0 / 3.0, c);
}

static void cost_eigh(const Params *p, int nin, const AVal *in, int nout, const AVal *out, PrimCost *c) {
  (void)p, (void)nin, (void)nout, (void)out;
  cost_factor(&in[0], 9.0, c);
}

static void cost_svd(const Params *p, int nin, const AVal *in, int nout, const AVal *out, PrimCost *c) {
  (void)p, (void)nin, (void)nout, (void)out;
  cost_factor(&in[0], 12.0, c);
}

static void cost_qr(const Params *p, int nin, const AVal *in, int nout, const AVal *out, PrimCost *c) {
  (void)p, (void)nin, (void)nout, (void)out;
  cost_factor(&in[0], 4.0, c);
}

/* ==== sharding ================================================================ */

/* triangular_solve and cholesky: the leading batch dimensions keep their
 * splits, the operands laid out alike there, each device solving or
 * factoring its own matrices (GSPMD's partitioning of a batched
 * factorisation); the two matrix dimensions are unsplit. */
static int sh_batched_matrices(const AVal *in, Sharding *in_sh, int nin, const Params *p,
                               Sharding *out_sh) {
  (void)p;
  int nd = in[0].ndim;
  bool alike = nd >= 2;
  for (int i = 1; i < nin; i++) alike &= in[i].ndim == nd;
  if (alike) return sh_keep_but(in, in_sh, nin, (uint64_t)3 << (nd - 2), out_sh);
  Sharding like = in_sh[0];   /* not a batch of matrices: the shape rule's error follows */
  for (int i = 0; i < nin; i++) sh_replicated(&in_sh[i], in[i].ndim, &like);
  sh_replicated(out_sh, nd, &like);
  return 0;
}

/* lu, eigh, svd and qr: each result keeps the operand's batch
 * dimensions' splits (every result of a batched factorisation leads
 * with them), its other dimensions unsplit; the operand's two matrix
 * dimensions are unsplit. */
static int sh_batched_factor(PrimId id, const AVal *in, Sharding *in_sh, const Params *p,
                             Sharding *out_sh) {
  AVal outs[PRIM_MAX_OUTS];
  int nd = in[0].ndim, nb = nd - 2;
  if (nd < 2 || prim_table[id].nout > PRIM_MAX_OUTS || prim_table[id].rules.shape(in, 1, p, outs) < 0) {
    err_clear();   /* the shape rule's error follows */
    return 1;
  }
  in_sh[0].nsplit[nd - 1] = in_sh[0].nsplit[nd - 2] = 0;
  for (int j = 0; j < prim_table[id].nout; j++) {
    sh_replicated(&out_sh[j], outs[j].ndim, &in_sh[0]);
    for (int d = 0; d < nb && d < outs[j].ndim; d++) sh_copy_dim(&out_sh[j], d, &in_sh[0], d);
  }
  return 0;
}

#define SH_FACTOR(name, ID)                                                                  \
  static int sh_##name(const AVal *in, Sharding *in_sh, int nin, const Params *p,           \
                       Sharding *out_sh) {                                                  \
    (void)nin;                                                                              \
    return sh_batched_factor(P_##ID, in, in_sh, p, out_sh);                                 \
  }
SH_FACTOR(lu, LU)
SH_FACTOR(eigh, EIGH)
SH_FACTOR(svd, SVD)
SH_FACTOR(qr, QR)

/* ==== the rows ================================================================ */

#define FLOATS (1u << DT_F32 | 1u << DT_F64)

/* Each primitive's rules, side by side (prim.h, PrimRules). */
static const PrimRow rows[] = {
    {P_LU, {.shape = shape_lu, .kernel = lapack_kernel_lu, .batch = batch_lu, .jvp = jvp_lu, .sharding = sh_lu, .dtypes = FLOATS, .cost = cost_lu}},
    {P_TRIANGULAR_SOLVE, {.shape = shape_triangular_solve, .kernel = lapack_kernel_triangular_solve, .batch = batch_triangular_solve, .jvp = jvp_triangular_solve, .transpose = tr_triangular_solve, .sharding = sh_batched_matrices, .dtypes = FLOATS, .cost = cost_triangular_solve}},
    {P_CHOLESKY, {.shape = shape_cholesky, .kernel = lapack_kernel_cholesky, .batch = batch_cholesky, .jvp = jvp_cholesky, .sharding = sh_batched_matrices, .dtypes = FLOATS, .cost = cost_cholesky}},
    {P_EIGH, {.shape = shape_eigh, .kernel = lapack_kernel_eigh, .batch = batch_eigh, .jvp = jvp_eigh, .sharding = sh_eigh, .dtypes = FLOATS, .cost = cost_eigh}},
    {P_SVD, {.shape = shape_svd, .kernel = lapack_kernel_svd, .batch = batch_svd, .jvp = jvp_svd, .sharding = sh_svd, .dtypes = FLOATS, .cost = cost_svd}},
    {P_QR, {.shape = shape_qr, .kernel = lapack_kernel_qr, .batch = batch_qr, .jvp = jvp_qr, .sharding = sh_qr, .dtypes = FLOATS, .cost = cost_qr}},
};

void prim_linalg_register(void) { prim_register_rows(rows, sizeof rows / sizeof rows[0]); }
