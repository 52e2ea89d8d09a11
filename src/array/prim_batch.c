/*
 * prim_batch.c - the batching rules of the array primitives (prim_batch.h).
 *
 * A rule gets each operand with the position of its batch axis (-1: the
 * operand is the same for every example) and computes every example at
 * once, usually by moving the batch axis to the front and shifting the
 * primitive's axis parameters by one, as JAX's batching rules do
 * (jax/_src/lax/lax.py, slicing.py).  Rules build with prim_apply, so
 * they compute eagerly and stage under jit alike.  A case a rule does not
 * cover (a batched index of a gather, say) returns BATCH_BY_LOOP and the
 * interpreter (transform/batch.c) applies the primitive example by
 * example: slower, never wrong.
 */
#include <string.h>

#include "array/prim_batch.h"

/* ---- building blocks (borrowed in, new references out) ------------------ */

/* id[*p](in...): prim_apply_rule. */
static Value *app(PrimId id, int n, Value **in, Params *p) { return prim_apply_rule(id, n, in, p); }

static int rank_of(Value *x) {
  AVal a;
  return prim_value_aval(x, &a) == 0 ? a.ndim : -1;
}

/* [x] with its axis [from] moved to [to]. */
static Value *moveaxis(Value *x, int from, int to) {
  AVal a;
  if (prim_value_aval(x, &a) < 0) return NULL;
  if (from == to) return val_incref(x);
  int64_t perm[SHM_MAXDIM];
  int k = 0;
  for (int i = 0; i < a.ndim; i++) {
    if (k == to) perm[k++] = from;
    if (i != from) perm[k++] = i;
  }
  if (k == to) perm[k++] = from;
  Params p;
  params_init(&p);
  params_add(&p, "permutation", val_int_tuple(a.ndim, perm));
  return app(P_TRANSPOSE, 1, &x, &p);
}

Value *prim_batch_moveaxis(Value *x, int from, int to) { return moveaxis(x, from, to); }

/* An unbatched [x] repeated [b] times along a new leading axis, its own
 * axes after it (or, with [shape], broadcast to (b,) + shape from its
 * axes [dims]). */
static Value *repeat_front(Value *x, int64_t b) {
  AVal a;
  if (prim_value_aval(x, &a) < 0) return NULL;
  int64_t shape[SHM_MAXDIM], dims[SHM_MAXDIM];
  shape[0] = b;
  for (int i = 0; i < a.ndim; i++) shape[i + 1] = a.shape[i], dims[i] = i + 1;
  Params p;
  params_init(&p);
  params_add(&p, "shape", val_int_tuple(a.ndim + 1, shape));
  params_add(&p, "broadcast_dimensions", val_int_tuple(a.ndim, dims));
  return app(P_BROADCAST_IN_DIM, 1, &x, &p);
}

Value *prim_batch_repeat_front(Value *x, int64_t b) { return repeat_front(x, b); }

/* Operand [i] with its batch axis first, or repeated along one. */
static Value *front(Value **in, const int *dims, int i, int64_t b) {
  return dims[i] >= 0 ? moveaxis(in[i], dims[i], 0) : repeat_front(in[i], b);
}

int64_t prim_batch_size(Value **in, const int *dims, int nin) {
  for (int i = 0; i < nin; i++) {
    AVal a;
    if (dims[i] >= 0 && prim_value_aval(in[i], &a) == 0) return a.shape[dims[i]];
  }
  return 1;
}

/* A copy of [p] without [skip1], [skip2] (NULL: none). */
static void params_but(Params *dst, const Params *p, const char *skip1, const char *skip2) {
  params_init(dst);
  for (int i = 0; p && i < p->n; i++) {
    const char *n = p->p[i].name;
    if ((skip1 && !strcmp(n, skip1)) || (skip2 && !strcmp(n, skip2))) continue;
    params_add(dst, n, val_incref(p->p[i].value));
  }
}

/* Parameter [name] (ints) with [lead] put first and every entry plus
 * [shift]: axes after a batch axis put at the front. */
static Value *ints_shifted(const Params *p, const char *name, int64_t shift, int nlead,
                           int64_t lead) {
  int n;
  int64_t xs[SHM_MAXDIM + 1];
  if (params_ints(p, name, &n, xs + nlead, SHM_MAXDIM) < 0) return NULL;
  for (int i = nlead; i < n + nlead; i++) xs[i] += shift;
  if (nlead) xs[0] = lead;
  return val_int_tuple(n + nlead, xs);
}

/* The primitive on [x] (batch axis first) with [name] remapped. */
static int on_front(PrimId id, Value *x, const Params *p, const char *name, int nlead,
                    int64_t lead, int64_t shift, Value **out, int *od) {
  Params q;
  params_but(&q, p, name, NULL);
  Value *v = ints_shifted(p, name, shift, nlead, lead);
  if (!v) {
    params_clear(&q);
    val_decref(x);
    return -1;
  }
  params_add(&q, name, v);
  *out = app(id, 1, &x, &q);
  val_decref(x);
  *od = 0;
  return *out ? 0 : -1;
}

/* ---- element-wise -------------------------------------------------------- */

static int batch_elementwise(PrimId id, Value **in, const int *dims, int nin, const Params *p,
                             Value **out, int *od) {
  int64_t b = prim_batch_size(in, dims, nin);
  int d = -1, rank = -1, ex = 0;   /* the examples' rank: the largest */
  bool same = true;
  for (int i = 0; i < nin; i++) {
    int r = rank_of(in[i]);
    if (r < 0) return -1;
    int er = r - (dims[i] >= 0);
    if (er > ex) ex = er;
    if (dims[i] >= 0) {
      same &= (d < 0 || d == dims[i]) && (rank < 0 || rank == r);
      d = dims[i], rank = r;
    } else {
      same &= r == 0;
    }
  }
  bool scalars_ok = id != P_SELECT_N && id != P_CLAMP;
  if (same && (scalars_ok || nin == 1) && rank == ex + 1) {
    Params q;
    params_but(&q, p, NULL, NULL);
    *out = app(id, nin, in, &q);
    *od = d;
    return *out ? 0 : -1;
  }
  /* the batch axis first everywhere; per-example scalars broadcast */
  AVal big;
  int bigi = -1;
  for (int i = 0; i < nin; i++)
    if (rank_of(in[i]) - (dims[i] >= 0) == ex) bigi = i;
  if (prim_value_aval(in[bigi], &big) < 0) return -1;
  int64_t shape[SHM_MAXDIM];
  shape[0] = b;
  for (int k = 0, j = 0; k < big.ndim; k++)
    if (k != dims[bigi]) shape[1 + j++] = big.shape[k];
  Value *ops[16];
  if (nin > 16) return BATCH_BY_LOOP;
  int made = 0, rc = -1;
  for (; made < nin; made++) {
    int r = rank_of(in[made]);
    Value *x;
    if (dims[made] < 0 && r == 0 && scalars_ok) {
      x = val_incref(in[made]);
    } else if (r - (dims[made] >= 0) == ex) {
      x = front(in, dims, made, b);
    } else {   /* a per-example scalar among arrays */
      Value *f = dims[made] >= 0 ? val_incref(in[made]) : NULL;
      Params q;
      params_init(&q);
      params_add(&q, "shape", val_int_tuple(ex + 1, shape));
      params_add(&q, "broadcast_dimensions", dims[made] >= 0 ? val_int_tuple(1, (int64_t[]){0})
                                                              : val_int_tuple(0, NULL));
      x = app(P_BROADCAST_IN_DIM, 1, f ? &f : &in[made], &q);
      if (f) val_decref(f);
    }
    if (!(ops[made] = x)) goto out;
  }
  Params q;
  params_but(&q, p, NULL, NULL);
  *out = app(id, nin, ops, &q);
  *od = 0;
  rc = *out ? 0 : -1;
out:
  for (int i = 0; i < made; i++) val_decref(ops[i]);
  return rc;
}

/* ---- reductions and axis-parameter primitives ------------------------------ */

static int batch_axes(PrimId id, const char *name, Value **in, const int *dims, const Params *p,
                      Value **out, int *od) {
  Value *x = moveaxis(in[0], dims[0], 0);
  return x ? on_front(id, x, p, name, 0, 0, 1, out, od) : -1;
}

/* An int parameter plus one, the batch axis first. */
static int batch_axis1(PrimId id, const char *name, Value **in, const int *dims, const Params *p,
                       Value **out, int *od) {
  int64_t ax;
  if (params_int(p, name, &ax) < 0) return -1;
  int r = rank_of(in[0]);
  if (ax < 0) ax += r - 1;
  Value *x = moveaxis(in[0], dims[0], 0);
  if (!x) return -1;
  Params q;
  params_but(&q, p, name, NULL);
  params_add(&q, name, val_int(ax + 1));
  *out = app(id, 1, &x, &q);
  val_decref(x);
  *od = 0;
  return *out ? 0 : -1;
}

#define AXES_RULE(fn, ID, NAME)                                                             \
  static int fn(Value **in, const int *dims, int nin, const Params *p, Value **out, int *od) { \
    (void)nin;                                                                              \
    return batch_axes(P_##ID, NAME, in, dims, p, out, od);                                  \
  }
AXES_RULE(b_reduce_sum, REDUCE_SUM, "axes") AXES_RULE(b_reduce_max, REDUCE_MAX, "axes")
AXES_RULE(b_reduce_min, REDUCE_MIN, "axes") AXES_RULE(b_reduce_prod, REDUCE_PROD, "axes")
AXES_RULE(b_reduce_and, REDUCE_AND, "axes") AXES_RULE(b_reduce_or, REDUCE_OR, "axes")
AXES_RULE(b_argmax, ARGMAX, "axes") AXES_RULE(b_argmin, ARGMIN, "axes")
AXES_RULE(b_squeeze, SQUEEZE, "dimensions") AXES_RULE(b_expand_dims, EXPAND_DIMS, "dimensions")
AXES_RULE(b_rev, REV, "dimensions")

#define AXIS1_RULE(fn, ID, NAME)                                                            \
  static int fn(Value **in, const int *dims, int nin, const Params *p, Value **out, int *od) { \
    (void)nin;                                                                              \
    return batch_axis1(P_##ID, NAME, in, dims, p, out, od);                                 \
  }
AXIS1_RULE(b_cumsum, CUMSUM, "axis") AXIS1_RULE(b_cumprod, CUMPROD, "axis")
AXIS1_RULE(b_cummax, CUMMAX, "axis") AXIS1_RULE(b_sort, SORT, "dimension")
AXIS1_RULE(b_argsort, ARGSORT, "dimension")

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
  Value *ops[64];
  if (nin > 64 || params_int(p, "dimension", &dim) < 0) return nin > 64 ? BATCH_BY_LOOP : -1;
  int made = 0;
  for (; made < nin; made++)
    if (!(ops[made] = front(in, dims, made, b))) break;
  Params q;
  params_but(&q, p, "dimension", NULL);
  params_add(&q, "dimension", val_int(dim + 1));
  *out = made == nin ? app(P_CONCATENATE, nin, ops, &q) : (params_clear(&q), NULL);
  for (int i = 0; i < made; i++) val_decref(ops[i]);
  *od = 0;
  return *out ? 0 : -1;
}

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
    zero = &arr_scalar_i64(it, 0, false)->hdr;
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

/* ---- installing -------------------------------------------------------------------- */

#define ELEMENTWISE(fn, ID)                                                                 \
  __attribute__((unused)) static int fn(Value **in, const int *dims, int nin, const Params *p, Value **out, int *od) { \
    return batch_elementwise(P_##ID, in, dims, nin, p, out, od);                            \
  }
#define PRIM(id, nm, ni, no, k, kn) ELEMENTWISE(b_ew_##id, id)
#include "array/prim.def"
#undef PRIM

void prim_batch_install(void) {
#define PRIM(id, nm, ni, no, k, kn)                                                        \
  if (k == PK_UNARY || (k == PK_BINARY)) prim_table[P_##id].rules.batch = b_ew_##id;
#include "array/prim.def"
#undef PRIM
#define B(ID, fn) prim_table[P_##ID].rules.batch = fn;
  B(REDUCE_SUM, b_reduce_sum) B(REDUCE_MAX, b_reduce_max) B(REDUCE_MIN, b_reduce_min)
  B(REDUCE_PROD, b_reduce_prod) B(REDUCE_AND, b_reduce_and) B(REDUCE_OR, b_reduce_or)
  B(ARGMAX, b_argmax) B(ARGMIN, b_argmin) B(CUMSUM, b_cumsum) B(CUMPROD, b_cumprod)
  B(CUMMAX, b_cummax) B(SORT, b_sort) B(ARGSORT, b_argsort) B(SQUEEZE, b_squeeze) B(EXPAND_DIMS, b_expand_dims)
  B(REV, b_rev) B(BROADCAST_IN_DIM, b_broadcast_in_dim) B(RESHAPE, b_reshape)
  B(TRANSPOSE, b_transpose) B(SLICE, b_slice) B(PAD, b_pad) B(CONCATENATE, b_concatenate)
  B(DYNAMIC_SLICE, b_dynamic_slice) B(DYNAMIC_UPDATE_SLICE, b_dynamic_update_slice)
  B(GATHER, b_gather) B(SCATTER, b_scatter) B(DOT_GENERAL, b_dot_general)
#undef B
}
