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
  if (prim_dot_dims_known(dn, &d->n[0], &d->n[2], d->d)) {
    d->n[1] = d->n[0];
    d->n[3] = d->n[2];
    return 0;
  }
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

/* The dimension numbers ((g_c, y_c), (g_b, y_b)) contracting g's
 * [nk] dims [g_c] with y's [y_c] and batching the first [nb] dims of
 * both; [y_first]: y is the left operand. */
static Value *tr_dnums(bool y_first, int nk, const int64_t *g_c, const int64_t *y_c, int nb,
                       const int64_t *g_b, const int64_t *y_b) {
  return y_first ? val_dot_dimension_numbers(nk, y_c, g_c, nb, y_b, g_b)
                 : val_dot_dimension_numbers(nk, g_c, y_c, nb, g_b, y_b);
}

/* The cotangent of dot_general's operand [xa] (aval; the linear one) given
 * the other operand [y] and the result's cotangent [g]; [swap]: x is the
 * right-hand operand.  JAX's _dot_general_transpose_lhs: contract g with
 * y over y's kept dimensions, then put x's dimensions back in order.
 * That product's result holds x's batch dims, then g's free dims (x's
 * kept ones) and y's (x's contracting ones), or these two groups the
 * other way round when y is the left operand: the order that needs no
 * transpose is chosen when there is one (a weight gradient x^T g, not
 * (g^T x)^T), as XLA would fold the transpose into the product. */
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
  /* y's remaining dims come out ascending: sort x_contract by y_contract */
  int64_t ys[SHM_MAXDIM], xs[SHM_MAXDIM];
  for (int i = 0; i < nc; i++) ys[i] = yc[i], xs[i] = xc[i];
  for (int i = 1; i < nc; i++)
    for (int j = i; j > 0 && ys[j - 1] > ys[j]; j--) {
      int64_t t1 = ys[j], t2 = xs[j];
      ys[j] = ys[j - 1], xs[j] = xs[j - 1];
      ys[j - 1] = t1, xs[j - 1] = t2;
    }
  /* the product's dims as x's, for g first (order) and for y first */
  int64_t order[SHM_MAXDIM], order_y[SHM_MAXDIM], perm[SHM_MAXDIM];
  int k = 0;
  for (int i = 0; i < nb; i++) order[k] = order_y[k] = xb[i], k++;
  for (int i = 0; i < nxk; i++) order[k + i] = order_y[k + nc + i] = x_kept[i];
  for (int i = 0; i < nc; i++) order[k + nxk + i] = order_y[k + i] = xs[i];
  k += nxk + nc;
  bool y_first = true;
  for (int i = 0; i < k; i++) y_first &= order_y[i] == i;
  y_first &= nxk > 0 && nc > 0;   /* else both orders agree: keep JAX's */
  Params q;
  params_init(&q);
  params_add(&q, "dimension_numbers", tr_dnums(y_first, nyk, ans_y, y_kept, nb, ans_batch, yb));
  Value *pet = params_get(p, "preferred_element_type");
  if (pet) params_add(&q, "preferred_element_type", val_incref(pet));
  /* the cotangent has the operand's type, as JAX's transpose says with
   * out_sharding=: not an ambiguity of Explicit mode (sh_dot_general) */
  params_add(&q, "out_sharding", str_from("operand"));
  Value *r = ap(s, P_DOT_GENERAL, 2, y_first ? (Value *[]){y, g} : (Value *[]){g, y}, &q);
  for (int i = 0; i < k; i++) perm[order[i]] = i;
  bool ident = true;
  for (int i = 0; i < k; i++) ident &= perm[i] == i;
  if (y_first || ident || !r) return r;
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
  return val_dot_dimension_numbers(nc, lc, rc, nb, lb, rb);
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
  Dims dd;
  int nc, nb;
  int64_t lc[SHM_MAXDIM + 1], rc[SHM_MAXDIM + 1], lb[SHM_MAXDIM + 1], rb[SHM_MAXDIM + 1];
  if (dims_read(p, &dd) < 0 || dd.n[0] != dd.n[1] || dd.n[2] != dd.n[3]) {
    err_clear();   /* malformed: batched by a loop, whose product reports it */
    return BATCH_BY_LOOP;
  }
  nc = dd.n[0];
  nb = dd.n[2];
  memcpy(lc + 1, dd.d[0], sizeof(int64_t) * (size_t)nc);
  memcpy(rc + 1, dd.d[1], sizeof(int64_t) * (size_t)nc);
  memcpy(lb + 1, dd.d[2], sizeof(int64_t) * (size_t)nb);
  memcpy(rb + 1, dd.d[3], sizeof(int64_t) * (size_t)nb);
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

/* ==== sharding rule (prim.h; GSPMD's dot, shmap(7)) ========================= */

/* Lays the pair of dimensions ([ld] of the lhs, [rd] of the rhs) out
 * alike: the lhs's split if it has one and its mesh axes are free, else
 * the rhs's; the other operand is resharded to it.  Returns the axes. */
static uint32_t dot_pair(Sharding *in_sh, int ld, int rd, uint32_t *used) {
  Sharding *l = &in_sh[0], *r = &in_sh[1];
  const Sharding *src = l->nsplit[ld] && !(sh_dim_axes(l, ld) & *used) ? l
                        : r->nsplit[rd] && !(sh_dim_axes(r, rd) & *used) ? r : NULL;
  if (!src) {
    l->nsplit[ld] = r->nsplit[rd] = 0;
    return 0;
  }
  if (src == l) sh_copy_dim(r, rd, l, ld);
  else sh_copy_dim(l, ld, r, rd);
  *used |= sh_dim_axes(l, ld);
  return sh_dim_axes(l, ld);
}

/* Keeps a free dimension's split when its mesh axes are still free. */
static void dot_free(Sharding *s, int d, uint32_t *used) {
  if (sh_dim_axes(s, d) & *used) s->nsplit[d] = 0;
  *used |= sh_dim_axes(s, d);
}

/* Whether paired dimensions [ld] of [l] and [rd] of [r] are both split,
 * differently, over Explicit axes. */
static bool pair_clash(const Sharding *l, int ld, const Sharding *r, int rd) {
  return l->nsplit[ld] && r->nsplit[rd] && !sh_same_dim(l, ld, r, rd) &&
         sh_typed(l, sh_dim_axes(l, ld) | sh_dim_axes(r, rd));
}

/* JAX's check that paired dimension lists ([k] = 0 contracting, 2
 * batch) are split alike where both are split. */
static int pairs_agree(const Sharding *in_sh, const Dims *d, int k, const char *what) {
  for (int i = 0; i < d->n[k]; i++)
    if (pair_clash(&in_sh[0], (int)d->d[k][i], &in_sh[1], (int)d->d[k + 1][i])) {
      char l[256], r[256];
      sh_spec_tuple(&in_sh[0], d->n[k], d->d[k], l, sizeof l);
      sh_spec_tuple(&in_sh[1], d->n[k], d->d[k + 1], r, sizeof r);
      return sh_type_error("requires the lhs and rhs %s dimensions to be sharded consistently, "
                           "got %s and %s", what, l, r);
    }
  return 0;
}

/* Explicit mode's dot_general (JAX's rule; without out_sharding=):
 * batch and contracting pairs split alike; a contracting dimension split
 * on both sides leaves the result's layout ambiguous (a psum to a
 * replicated result, or a psum_scatter to one split some way), so it is
 * an error asking for out_sharding=; the result, batch then lhs free
 * then rhs free dimensions, may not split two dimensions over one axis. */
static int dot_explicit(const AVal *in, const Sharding *in_sh, const Dims *d) {
  if (pairs_agree(in_sh, d, 2, "batch") < 0 || pairs_agree(in_sh, d, 0, "contracting") < 0)
    return -1;
  for (int k = 0; k < d->n[0]; k++) {
    int ld = (int)d->d[0][k], rd = (int)d->d[1][k];
    if (in_sh[0].nsplit[ld] && in_sh[1].nsplit[rd] && sh_typed(&in_sh[0], sh_dim_axes(&in_sh[0], ld))) {
      char l[256], r[256];
      sh_spec_tuple(&in_sh[0], d->n[0], d->d[0], l, sizeof l);
      sh_spec_tuple(&in_sh[1], d->n[0], d->d[1], r, sizeof r);
      return sh_type_error("contracts dimensions sharded on both sides (lhs %s, rhs %s), so "
                           "the layout of the result is ambiguous: give it with out_sharding=",
                           l, r);
    }
  }
  Sharding res;
  int o = 0;
  sh_replicated(&res, 0, &in_sh[0]);
  for (int k = 0; k < d->n[2]; k++) sh_copy_dim(&res, o++, &in_sh[0], (int)d->d[2][k]);
  for (int side = 0; side < 2; side++)
    for (int x = 0; x < in[side].ndim; x++)
      if (!in_list(x, d->n[side], d->d[side]) && !in_list(x, d->n[2 + side], d->d[2 + side]))
        sh_copy_dim(&res, o++, &in_sh[side], x);
  return sh_check_unique(in, in_sh, 2, &res, o);
}

/* dot_general: batch dimensions keep their (agreed) split; free
 * dimensions keep theirs where no mesh axis is used twice; a contracting
 * dimension split on both sides by axes still free gives partial sums
 * over them (a psum completes them), else it is gathered.  The result:
 * batch, lhs free, rhs free. */
static int sh_dot_general(const AVal *in, Sharding *in_sh, int nin, const Params *p,
                          Sharding *out_sh) {
  (void)nin;
  Dims d;
  if (dims_read(p, &d) < 0) return -1;
  /* out_sharding= says the result's layout: the choice below, then laid
   * out so by the constraint that follows */
  if (in_sh[0].explicit_axes && !params_get(p, "out_sharding") && dot_explicit(in, in_sh, &d) < 0)
    return -1;
  uint32_t used = 0, partial = 0;
  for (int k = 0; k < d.n[2]; k++) dot_pair(in_sh, (int)d.d[2][k], (int)d.d[3][k], &used);
  /* free dimensions before contracting ones: where a mesh axis splits
   * both, the contracting dimension is gathered (the weight, in FSDP)
   * rather than the free one resharded and the result summed */
  for (int side = 0; side < 2; side++)
    for (int x = 0; x < in[side].ndim; x++)
      if (!in_list(x, d.n[side], d.d[side]) && !in_list(x, d.n[2 + side], d.d[2 + side]))
        dot_free(&in_sh[side], x, &used);
  for (int k = 0; k < d.n[0]; k++) partial |= dot_pair(in_sh, (int)d.d[0][k], (int)d.d[1][k], &used);
  int o = 0;
  sh_replicated(out_sh, 0, &in_sh[0]);
  for (int k = 0; k < d.n[2]; k++) sh_copy_dim(out_sh, o++, &in_sh[0], (int)d.d[2][k]);
  for (int side = 0; side < 2; side++)
    for (int x = 0; x < in[side].ndim; x++)
      if (!in_list(x, d.n[side], d.d[side]) && !in_list(x, d.n[2 + side], d.d[2 + side]))
        sh_copy_dim(out_sh, o++, &in_sh[side], x);
  out_sh->ndim = o;
  out_sh->partial = partial;
  out_sh->partial_coll = partial ? "psum" : NULL;
  return 0;
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
    {P_DOT_GENERAL, {.shape = la_shape_dot_general, .kernel = la_kernel_dot_general, .batch = b_dot_general, .jvp = jvp_dot_general, .transpose = tr_dot_general, .sharding = sh_dot_general, .through_transpose = la_dot_through_transpose, .cost = cost_dot_general}},
};

void prim_dot_register(void) { prim_register_rows(rows, sizeof rows / sizeof rows[0]); }
