/*
 * prim_dot.c - dot_general, the one contraction: side by side in its row
 * at the end of the file, the shape rule and kernel (linalg.c, through
 * BLIS), the batching rule and the JVP and transpose rules.  Semantics:
 * jax.lax.dot_general (jax/_src/lax/lax.py): dimension_numbers
 * ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)), the
 * result's dimensions batch, then lhs free, then rhs free.
 */
#include "array/linalg.h"
#include "array/prim_rules.h"

/* ==== JVP and transpose rules ============================================== */


/* ==== dot_general ======================================================== */

static int jvp_dot_general(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  (void)nin;
  if (primal(P_DOT_GENERAL, x, 2, p, yo) < 0) return -1;
  *to = NULL;
  if (!t[0] && !t[1]) return 0;
  Scope s = {0};
  Value *l = t[0] ? same(&s, P_DOT_GENERAL, 2, (Value *[]){t[0], x[1]}, p) : NULL;
  Value *r = t[1] ? same(&s, P_DOT_GENERAL, 2, (Value *[]){x[0], t[1]}, p) : NULL;
  return jvp_done(&s, l && r ? add(&s, l, r) : l ? l : r, false, yo, to);
}

/* The four dimension lists of dot_general's dimension_numbers. */
typedef struct Dims {
  int n[4];               /* lhs contract, rhs contract, lhs batch, rhs batch */
  int64_t d[4][SHM_MAXDIM];
} Dims;

static int dims_read(const Params *p, Dims *d) {
  Value *dn = params_get(p, "dimension_numbers");
  size_t n2, m;
  Value *const *pair, *const *two, *const *xs;
  if (!dn || !val_seq(dn, &n2, &pair) || n2 != 2) goto bad;
  for (int k = 0; k < 2; k++) {
    if (!val_seq(pair[k], &m, &two) || m != 2) goto bad;
    for (int j = 0; j < 2; j++) {
      if (!val_seq(two[j], &m, &xs) || m > SHM_MAXDIM) goto bad;
      d->n[2 * k + j] = (int)m;
      for (size_t i = 0; i < m; i++)
        if (arr_to_index(xs[i], &d->d[2 * k + j][i]) < 0) return -1;
    }
  }
  return 0;
bad:
  err_set(ERR_TYPE, "dot_general: malformed dimension_numbers");
  return -1;
}

static bool in_list(int64_t v, int n, const int64_t *xs) {
  for (int i = 0; i < n; i++)
    if (xs[i] == v) return true;
  return false;
}

/* The cotangent of dot_general's operand [xa] (aval; the linear one) given
 * the other operand [y] and the result's cotangent [g]; [swap]: x is the
 * right-hand operand.  JAX's _dot_general_transpose_lhs: contract g with
 * y over y's kept dimensions, then put x's dimensions back in order. */
static Value *dot_transpose(Scope *s, Value *g, Value *y, const AVal *xa, const AVal *ya,
                            const int64_t *xc, const int64_t *yc, int nc, const int64_t *xb,
                            const int64_t *yb, int nb, bool swap, const Params *p) {
  int64_t x_kept[SHM_MAXDIM] = {0}, y_kept[SHM_MAXDIM] = {0};   /* only the first n are read */
  int nxk = 0, nyk = 0;
  for (int i = 0; i < xa->ndim; i++)
    if (!in_list(i, nc, xc) && !in_list(i, nb, xb)) x_kept[nxk++] = i;
  for (int i = 0; i < ya->ndim; i++)
    if (!in_list(i, nc, yc) && !in_list(i, nb, yb)) y_kept[nyk++] = i;
  /* g's dimensions: batch, then lhs kept, then rhs kept */
  int64_t ans_batch[SHM_MAXDIM] = {0}, ans_y[SHM_MAXDIM] = {0};
  for (int i = 0; i < nb; i++) ans_batch[i] = i;
  int y_at = swap ? nb : nb + nxk;
  for (int i = 0; i < nyk; i++) ans_y[i] = y_at + i;
  Value *dn = val_dot_dimension_numbers(nyk, ans_y, y_kept, nb, ans_batch, yb);
  Params q;
  params_init(&q);
  params_add(&q, "dimension_numbers", dn);
  Value *pet = params_get(p, "preferred_element_type");
  if (pet) params_add(&q, "preferred_element_type", val_incref(pet));
  Value *r = ap(s, P_DOT_GENERAL, 2, (Value *[]){g, y}, &q);
  /* r: x_batch, x_kept, then x's contracting dims in the order of y's */
  int64_t order[SHM_MAXDIM], perm[SHM_MAXDIM];
  int k = 0;
  for (int i = 0; i < nb; i++) order[k++] = xb[i];
  for (int i = 0; i < nxk; i++) order[k++] = x_kept[i];
  /* y's remaining dims come out ascending: sort x_contract by y_contract */
  int64_t ys[SHM_MAXDIM], xs[SHM_MAXDIM];
  for (int i = 0; i < nc; i++) ys[i] = yc[i], xs[i] = xc[i];
  for (int i = 1; i < nc; i++)
    for (int j = i; j > 0 && ys[j - 1] > ys[j]; j--) {
      int64_t t1 = ys[j], t2 = xs[j];
      ys[j] = ys[j - 1], xs[j] = xs[j - 1];
      ys[j - 1] = t1, xs[j - 1] = t2;
    }
  for (int i = 0; i < nc; i++) order[k++] = xs[i];
  for (int i = 0; i < k; i++) perm[order[i]] = i;
  bool ident = true;
  for (int i = 0; i < k; i++) ident &= perm[i] == i;
  if (ident || !r) return r;
  Params tp;
  params_init(&tp);
  params_add(&tp, "permutation", val_int_tuple(k, perm));
  return ap(s, P_TRANSPOSE, 1, &r, &tp);
}

static int tr_dot_general(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                          const Params *p, Value **cts) {
  (void)nin;
  Dims d;
  if (dims_read(p, &d) < 0) return -1;
  if (lin[0] && lin[1]) return prim_rule_missing(P_DOT_GENERAL, "transpose (both operands linear)");
  Scope s = {0};
  Value *r;
  if (lin[0])
    r = dot_transpose(&s, ct[0], in[1], &av[0], &av[1], d.d[0], d.d[1], d.n[0], d.d[2], d.d[3],
                      d.n[2], false, p);
  else
    r = dot_transpose(&s, ct[0], in[0], &av[1], &av[0], d.d[1], d.d[0], d.n[0], d.d[3], d.d[2],
                      d.n[2], true, p);
  AVal ra, xa = lin[0] ? av[0] : av[1];
  if (r && prim_value_aval(r, &ra) == 0 && ra.dtype != xa.dtype) r = convert(&s, r, xa.dtype, xa.weak);
  cts[lin[0] ? 0 : 1] = scope_return(&s, r);
  return cts[lin[0] ? 0 : 1] ? 0 : -1;
}

/* ==== batching rule ======================================================== */

/* ---- dot_general ---------------------------------------------------------------- */

/* ((lc, rc), (lb, rb)) from int lists. */
static Value *dnums(int nc, const int64_t *lc, const int64_t *rc, int nb, const int64_t *lb,
                    const int64_t *rb) {
  Value *c = tuple_new(2), *bb = tuple_new(2), *d = tuple_new(2);
  if (!c || !bb || !d) {
    if (c) val_decref(c);
    if (bb) val_decref(bb);
    if (d) val_decref(d);
    return NULL;
  }
  tuple_set_steal(c, 0, val_int_tuple(nc, lc));
  tuple_set_steal(c, 1, val_int_tuple(nc, rc));
  tuple_set_steal(bb, 0, val_int_tuple(nb, lb));
  tuple_set_steal(bb, 1, val_int_tuple(nb, rb));
  tuple_set_steal(d, 0, c);
  tuple_set_steal(d, 1, bb);
  return d;
}

static int read_seq(Value *v, int *n, int64_t *out) {
  size_t m;
  Value *const *xs;
  if (!val_seq(v, &m, &xs) || m > SHM_MAXDIM) return -1;
  *n = (int)m;
  for (size_t i = 0; i < m; i++)
    if (arr_to_index(xs[i], &out[i]) < 0) return -1;
  return 0;
}

/* Both batched: a new leading batch dimension of the contraction.  One
 * batched: its batch axis is one more free dimension of that side. */
static int b_dot_general(Value **in, const int *dims, int nin, const Params *p, Value **out,
                         int *od) {
  (void)nin;
  Value *dn = params_get(p, "dimension_numbers");
  size_t n2;
  Value *const *pr, *const *cc, *const *bb;
  int nc, nb, t;
  int64_t lc[SHM_MAXDIM + 1], rc[SHM_MAXDIM + 1], lb[SHM_MAXDIM + 1], rb[SHM_MAXDIM + 1];
  if (!dn || !val_seq(dn, &n2, &pr) || n2 != 2 || !val_seq(pr[0], &n2, &cc) ||
      !val_seq(pr[1], &n2, &bb) || read_seq(cc[0], &nc, lc + 1) < 0 ||
      read_seq(cc[1], &t, rc + 1) < 0 || read_seq(bb[0], &nb, lb + 1) < 0 ||
      read_seq(bb[1], &t, rb + 1) < 0)
    return BATCH_BY_LOOP;
  Value *l = dims[0] >= 0 ? moveaxis(in[0], dims[0], 0) : val_incref(in[0]);
  Value *r = l ? (dims[1] >= 0 ? moveaxis(in[1], dims[1], 0) : val_incref(in[1])) : NULL;
  if (!r) {
    if (l) val_decref(l);
    return -1;
  }
  for (int i = 1; i <= nc; i++) lc[i] += dims[0] >= 0, rc[i] += dims[1] >= 0;
  for (int i = 1; i <= nb; i++) lb[i] += dims[0] >= 0, rb[i] += dims[1] >= 0;
  Value *d;
  if (dims[0] >= 0 && dims[1] >= 0) {
    lb[0] = rb[0] = 0;
    d = dnums(nc, lc + 1, rc + 1, nb + 1, lb, rb);
    *od = 0;
  } else {
    d = dnums(nc, lc + 1, rc + 1, nb, lb + 1, rb + 1);
    /* the result: batch dims, lhs free dims, rhs free dims, in order */
    int lfree = rank_of(l) - nc - nb;
    *od = dims[0] >= 0 ? nb : nb + lfree;
  }
  Params q;
  params_but(&q, p, "dimension_numbers", NULL);
  params_add(&q, "dimension_numbers", d);
  *out = app(P_DOT_GENERAL, 2, (Value *[]){l, r}, &q);
  val_decref(l);
  val_decref(r);
  return *out ? 0 : -1;
}

/* Each result element is a dot product over the contracted dimensions:
 * as many multiply-adds, two flops each (XLA's count). */
static void cost_dot_general(const Params *p, int nin, const AVal *in, int nout, const AVal *out,
                             PrimCost *c) {
  (void)nin, (void)nout;
  Value *dn = params_get(p, "dimension_numbers");
  size_t n2;
  Value *const *pr, *const *cc;
  int nc;
  int64_t lc[SHM_MAXDIM];
  if (!dn || !val_seq(dn, &n2, &pr) || n2 != 2 || !val_seq(pr[0], &n2, &cc) ||
      read_seq(cc[0], &nc, lc) < 0) {
    err_clear();
    return;
  }
  double k = 1;
  for (int i = 0; i < nc; i++) k *= (double)in[0].shape[lc[i]];
  c->flops += 2 * k * (double)shape_size(out[0].ndim, out[0].shape);
}

/* ==== the rows ============================================================= */

/* Each primitive's rules, side by side (prim.h, PrimRules). */
static const PrimRow rows[] = {
    {P_DOT_GENERAL, {.shape = la_shape_dot_general, .kernel = la_kernel_dot_general, .batch = b_dot_general, .jvp = jvp_dot_general, .transpose = tr_dot_general, .cost = cost_dot_general}},
};

void prim_dot_register(void) { prim_register_rows(rows, sizeof rows / sizeof rows[0]); }
