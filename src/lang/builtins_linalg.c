/*
 * builtins_linalg.c - jax.lax.linalg: the factorisation primitives
 * (array/prim_linalg.c) with jax.lax.linalg's arguments and results
 * (jax/_src/lax/linalg.py): lu, triangular_solve, cholesky, eigh, svd,
 * qr.  jax.numpy.linalg and jax.scipy.linalg are built over them in
 * stdlib/_jax_numpy_linalg.shm and stdlib/_jax_scipy_linalg.shm.
 */
#include "array/prim.h"
#include "lang/builtins.h"
#include "lang/builtins_impl.h"
#include "lang/ops.h"

/* A keyword flag: [v] when given, else [dflt]; -1 on an error. */
static int flag_arg(Value *v, bool dflt) {
  if (!v) return dflt;
  return val_truth(v);
}

/* Adds the boolean parameter [name] = [on] to [p]. */
static void param_flag(Params *p, const char *name, int on) {
  params_add(p, name, val_incref(val_bool(on > 0)));
}

/* Primitive [id] on the [n] operands [x] (borrowed, made arrays), its
 * parameters [p] consumed: the primitive's result. */
static Value *bind_linalg(PrimId id, int n, Value **x, Params *p) {
  Value *ops[2] = {NULL, NULL}, *r = NULL;
  int k = 0;
  for (; k < n; k++)
    if (!(ops[k] = bi_arr(x[k]))) break;
  if (k == n) r = ops_apply(id, n, ops, p);
  for (int i = 0; i < k; i++) val_decref(ops[i]);
  params_clear(p);
  return r;
}

/* (x + x^T) / 2 over the last two dimensions, as lax.linalg's
 * symmetrize (a new reference). */
static Value *symmetrize(Value *x) {
  AVal a;
  Value *xa = bi_arr(x);
  if (!xa || prim_value_aval(xa, &a) < 0 || a.ndim < 2) {
    if (xa && !err_occurred())
      err_set(ERR_VALUE, "Argument to symmetrize must have shape [..., n, n], got %d dimensions",
              a.ndim);
    val_decref(xa);
    return NULL;
  }
  int64_t perm[SHM_MAXDIM];
  for (int i = 0; i < a.ndim; i++) perm[i] = i;
  perm[a.ndim - 1] = a.ndim - 2;
  perm[a.ndim - 2] = a.ndim - 1;
  Params p;
  params_init(&p);
  params_add(&p, "permutation", val_int_tuple(a.ndim, perm));
  Value *xt = ops_apply(P_TRANSPOSE, 1, &xa, &p);
  params_clear(&p);
  Value *s = xt ? ops_apply(P_ADD, 2, (Value *[]){xa, xt}, NULL) : NULL;
  Value *half = s ? arr_value(arr_scalar_f64(a.dtype, 0.5, false)) : NULL;
  Value *r = half ? ops_apply(P_MUL, 2, (Value *[]){s, half}, NULL) : NULL;
  val_decref(xa);
  if (xt) val_decref(xt);
  if (s) val_decref(s);
  if (half) val_decref(half);
  return r;
}

/* lu(x) -> (lu, pivots, permutation) */
static Value *ll_lu(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("lu", a, "x", slots) < 0) return NULL;
  Params p;
  params_init(&p);
  return bind_linalg(P_LU, 1, &x, &p);
}

static Value *ll_triangular_solve(const CallArgs *a) {
  Value *x, *b, *left = NULL, *lower = NULL, *trans = NULL, *conj = NULL, *unit = NULL;
  Value **slots[] = {&x, &b, &left, &lower, &trans, &conj, &unit};
  if (args_bind("triangular_solve", a,
                "a, b, left_side=, lower=, transpose_a=, conjugate_a=, unit_diagonal=", slots) < 0)
    return NULL;
  int f[5] = {flag_arg(left, false), flag_arg(lower, false), flag_arg(trans, false),
              flag_arg(conj, false), flag_arg(unit, false)};
  for (int i = 0; i < 5; i++)
    if (f[i] < 0) return NULL;
  Params p;
  params_init(&p);
  param_flag(&p, "left_side", f[0]);
  param_flag(&p, "lower", f[1]);
  param_flag(&p, "transpose_a", f[2]);
  param_flag(&p, "conjugate_a", f[3]);
  param_flag(&p, "unit_diagonal", f[4]);
  return bind_linalg(P_TRIANGULAR_SOLVE, 2, (Value *[]){x, b}, &p);
}

/* The operand [x], symmetrized when [sym] (a keyword flag, default on). */
static Value *maybe_symmetric(Value *x, Value *sym) {
  int s = flag_arg(sym, true);
  if (s < 0) return NULL;
  return s ? symmetrize(x) : bi_arr(x);
}

static Value *ll_cholesky(const CallArgs *a) {
  Value *x, *sym = NULL;
  Value **slots[] = {&x, &sym};
  if (args_bind("cholesky", a, "x, symmetrize_input=", slots) < 0) return NULL;
  Value *xs = maybe_symmetric(x, sym);
  if (!xs) return NULL;
  Params p;
  params_init(&p);
  Value *r = bind_linalg(P_CHOLESKY, 1, &xs, &p);
  val_decref(xs);
  return r;
}

/* eigh(x, lower=True, symmetrize_input=True, sort_eigenvalues=True) -> (v, w) */
static Value *ll_eigh(const CallArgs *a) {
  Value *x, *lower = NULL, *sym = NULL, *sort = NULL, *subset = NULL;
  Value **slots[] = {&x, &lower, &sym, &sort, &subset};
  if (args_bind("eigh", a, "x, lower=, symmetrize_input=, sort_eigenvalues=, subset_by_index=",
                slots) < 0)
    return NULL;
  if (subset && !bi_is_none(subset))
    return err_set(ERR_NOT_IMPLEMENTED, "eigh: subset_by_index is not implemented");
  int lo = flag_arg(lower, true), so = flag_arg(sort, true);
  if (lo < 0 || so < 0) return NULL;
  Value *xs = maybe_symmetric(x, sym);
  if (!xs) return NULL;
  Params p;
  params_init(&p);
  param_flag(&p, "lower", lo);
  param_flag(&p, "sort_eigenvalues", 1);   /* syevd sorts them ascending */
  Value *r = bind_linalg(P_EIGH, 1, &xs, &p);
  val_decref(xs);
  return r;
}

/* svd(x, full_matrices=True, compute_uv=True) -> (u, s, vh), or s */
static Value *ll_svd(const CallArgs *a) {
  Value *x, *full = NULL, *uv = NULL, *subset = NULL, *algo = NULL;
  Value **slots[] = {&x, &full, &uv, &subset, &algo};
  if (args_bind("svd", a, "x, full_matrices=, compute_uv=, subset_by_index=, algorithm=",
                slots) < 0)
    return NULL;
  if (subset && !bi_is_none(subset))
    return err_set(ERR_NOT_IMPLEMENTED, "svd: subset_by_index is not implemented");
  int fm = flag_arg(full, true), cu = flag_arg(uv, true);
  if (fm < 0 || cu < 0) return NULL;
  Params p;
  params_init(&p);
  param_flag(&p, "full_matrices", fm && cu);
  param_flag(&p, "compute_uv", cu);
  Value *r = bind_linalg(P_SVD, 1, &x, &p);
  if (!r) return NULL;
  Value *out = cu ? tuple_pack(3, (Value *[]){tuple_get(r, 1), tuple_get(r, 0), tuple_get(r, 2)})
                  : val_incref(tuple_get(r, 0));
  val_decref(r);
  return out;
}

/* qr(x, full_matrices=True) -> (q, r) */
static Value *ll_qr(const CallArgs *a) {
  Value *x, *pivoting = NULL, *full = NULL, *algo = NULL;
  Value **slots[] = {&x, &pivoting, &full, &algo};
  if (args_bind("qr", a, "x, pivoting=, full_matrices=, use_magma=", slots) < 0) return NULL;
  if (pivoting && val_truth(pivoting) > 0)
    return err_set(ERR_NOT_IMPLEMENTED, "qr: pivoting=True is not implemented");
  int fm = flag_arg(full, true);
  if (fm < 0) return NULL;
  Params p;
  params_init(&p);
  param_flag(&p, "full_matrices", fm);
  return bind_linalg(P_QR, 1, &x, &p);
}

const BiEntry bi_linalg_table[] = {
  {"lu", ll_lu, IN_LAX_LINALG, "lu(x) -> (lu, pivots, permutation): LU with partial pivoting"},
  {"triangular_solve", ll_triangular_solve, IN_LAX_LINALG,
   "triangular_solve(a, b, *, left_side=False, lower=False, transpose_a=False, "
   "conjugate_a=False, unit_diagonal=False)"},
  {"cholesky", ll_cholesky, IN_LAX_LINALG, "cholesky(x, *, symmetrize_input=True): lower factor"},
  {"eigh", ll_eigh, IN_LAX_LINALG,
   "eigh(x, *, lower=True, symmetrize_input=True, sort_eigenvalues=True) -> (v, w)"},
  {"svd", ll_svd, IN_LAX_LINALG, "svd(x, *, full_matrices=True, compute_uv=True) -> (u, s, vh)"},
  {"qr", ll_qr, IN_LAX_LINALG, "qr(x, *, full_matrices=True) -> (q, r)"},
  {NULL, NULL, 0, NULL},
};
