/*
 * collective_ad.c - the collectives' JVP, transpose and batching rules
 * (collective.h, coll_ad_install; semantics: LANGUAGE.md §11 and JAX's
 * parallel.py, whose psum/all_gather/ppermute/all_to_all transposes these
 * follow under the replication types).
 *
 * A cotangent has the replication type of its primal.  So the cotangent
 * of a psum's invariant result passes back to each device unchanged (the
 * transpose of psum is pvary, a copy), an all_gather's invariant result
 * gives each device its own slice back, and a collective whose operand is
 * invariant over some of its axes (summed n times over) sums its
 * cotangent over them.  The backward pass (transform/ad.c) sums, over
 * the extra axes, any cotangent that varies where its primal does not:
 * the transpose of the implicit pvary where an invariant value meets a
 * varying one.
 */
#include <string.h>

#include "base/intern.h"
#include "array/prim.h"
#include "array/prim.h"
#include "spmd/collective.h"

Value *coll_axis_names(uint32_t mask) {
  DevCtx *ctx = dev_ctx();
  if (!ctx || !ctx->mesh) return err_set(ERR_VALUE, "collective outside a shard_map body");
  int n = 0;
  for (int a = 0; a < ctx->mesh->naxes; a++) n += (mask >> a) & 1u;
  Value *t = tuple_new((size_t)n);
  for (int a = 0, k = 0; t && a < ctx->mesh->naxes; a++)
    if ((mask >> a) & 1u) tuple_set_steal(t, (size_t)k++, str_from(ctx->mesh->names[a]));
  return t;
}

/* [id][*p](x...), operands held across the call (prim_apply_rule); [p]
 * consumed when [own], else copied. */
static Value *apply(PrimId id, int n, Value **x, Params *p, bool own) {
  Params q;
  params_init(&q);
  for (int i = 0; p && i < p->n; i++) params_add(&q, p->p[i].name, val_incref(p->p[i].value));
  if (own && p) params_clear(p);
  return prim_apply_rule(id, n, x, &q);
}

/* A copy of [p] without [skip] (NULL: none). */
static void params_except(Params *dst, const Params *p, const char *skip) {
  params_init(dst);
  for (int i = 0; i < p->n; i++)
    if (!skip || strcmp(p->p[i].name, skip)) params_add(dst, p->p[i].name, val_incref(p->p[i].value));
}

/* psum of [x] over the axes of [mask] (none: a new reference to x). */
static Value *psum_over(Value *x, uint32_t mask) {
  if (!mask) return val_incref(x);
  Params q;
  params_init(&q);
  params_add(&q, "axes", coll_axis_names(mask));
  params_add(&q, "axis_index_groups", val_incref(VAL_NONE));
  return apply(P_PSUM, 1, &x, &q, true);
}

/* Whether a collective runs within axis_index_groups. */
static bool grouped(const Params *p) {
  Value *g = params_get(p, "axis_index_groups");
  return g && g != VAL_NONE;
}

/* The axes of [p] over which operand aval [a] is invariant: its cotangent
 * sums over them.  -1 with the error set for grouped collectives. */
static int invariant_axes(PrimId id, const Params *p, const AVal *a, uint32_t *extra) {
  (void)id;
  *extra = 0;
  if (grouped(p)) return 0;   /* grouped results keep their axes: they vary */
  uint32_t m = 0;
  if (!coll_axes_mask(p, &m)) m = 0;
  *extra = m & ~a->vma;
  return 0;
}

/* ---- JVP ------------------------------------------------------------------ */

/* A collective linear in its operand: the same collective on the tangent. */
static int jvp_linear(PrimId id, Value **x, Value **t, const Params *p, Value **yo, Value **to) {
  *to = NULL;
  if (!(*yo = apply(id, 1, x, (Params *)p, false))) return -1;
  if (!t[0]) return 0;
  if ((*to = apply(id, 1, t, (Params *)p, false))) return 0;
  val_decref(*yo);
  *yo = NULL;
  return -1;
}
#define LINEAR(name, ID)                                                                \
  static int jvp_##name(Value **x, Value **t, int nin, const Params *p, Value **yo,      \
                        Value **to) {                                                   \
    (void)nin;                                                                          \
    return jvp_linear(P_##ID, x, t, p, yo, to);                                         \
  }
LINEAR(psum, PSUM) LINEAR(all_gather, ALL_GATHER) LINEAR(psum_scatter, PSUM_SCATTER)
LINEAR(ppermute, PPERMUTE) LINEAR(all_to_all, ALL_TO_ALL) LINEAR(pvary, PVARY)

/* pmax/pmin: the mean of the tangents of the devices holding the
 * extremum, as reduce_max's rule over the devices. */
static int jvp_chooser(PrimId id, Value **x, Value **t, const Params *p, Value **yo, Value **to) {
  *to = NULL;
  if (!(*yo = apply(id, 1, x, (Params *)p, false))) return -1;
  if (!t[0]) return 0;
  AVal a;
  Params q;
  Value *eq = NULL, *at = NULL, *num = NULL, *den = NULL, *prod = NULL;
  if (prim_value_aval(x[0], &a) == 0 && (eq = apply(P_EQ, 2, (Value *[]){x[0], *yo}, NULL, false))) {
    params_init(&q);
    params_add(&q, "new_dtype", dtype_value(a.dtype));
    params_add(&q, "weak_type", val_bool(a.weak));
    at = apply(P_CONVERT_ELEMENT_TYPE, 1, &eq, &q, true);
  }
  Params none;
  params_init(&none);
  if (at) prod = apply(P_MUL, 2, (Value *[]){t[0], at}, &none, false);
  Params s;
  if (prod) {
    params_except(&s, p, NULL);
    num = apply(P_PSUM, 1, &prod, &s, true);
    params_except(&s, p, NULL);
    den = apply(P_PSUM, 1, &at, &s, true);
  }
  if (num && den) *to = apply(P_DIV, 2, (Value *[]){num, den}, &none, false);
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
  if (grouped(p))   /* the result varies: each device's sum of its group's cotangents */
    return (cts[0] = apply(P_PSUM, 1, ct, (Params *)p, false)) ? 0 : -1;
  if (invariant_axes(P_PSUM, p, &av[0], &extra) < 0) return -1;
  return (cts[0] = psum_over(ct[0], extra)) ? 0 : -1;
}

/* all_gather (invariant result): this device's own slice of the
 * cotangent along the gathered dimension. */
static int tr_all_gather(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                         const Params *p, Value **cts) {
  (void)in, (void)lin, (void)nin;
  int64_t dim;
  bool tiled = false;
  uint32_t extra;
  if (grouped(p)) {   /* a varying result: the group's cotangents summed and scattered */
    Params q;
    params_except(&q, p, "all_gather_dimension");
    params_add(&q, "scatter_dimension", val_incref(params_get(p, "all_gather_dimension")));
    return (cts[0] = apply(P_PSUM_SCATTER, 1, ct, &q, true)) ? 0 : -1;
  }
  if (invariant_axes(P_ALL_GATHER, p, &av[0], &extra) < 0 ||
      params_int(p, "all_gather_dimension", &dim) < 0 ||
      (params_get(p, "tiled") && params_bool(p, "tiled", &tiled) < 0))
    return -1;
  Params q;
  params_init(&q);
  params_add(&q, "axis_name", val_incref(params_get(p, "axis_name")));
  Value *idx = prim_bind(P_AXIS_INDEX, 0, NULL, &q);   /* staged too: it has no operand */
  params_clear(&q);
  if (!idx) return -1;
  int nd = av[0].ndim + (tiled ? 0 : 1);
  int64_t sizes[SHM_MAXDIM];
  Value *ops[SHM_MAXDIM + 1];
  Value *zero = val_int(0), *start = NULL;
  Params none;
  params_init(&none);
  if (tiled) {
    Value *bs = val_int(av[0].shape[dim]);
    start = apply(P_MUL, 2, (Value *[]){idx, bs}, &none, false);
    val_decref(bs);
  } else {
    start = val_incref(idx);
  }
  ops[0] = ct[0];
  for (int d = 0, k = 0; d < nd; d++) {
    ops[d + 1] = d == dim ? start : zero;
    sizes[d] = d == dim ? (tiled ? av[0].shape[dim] : 1) : av[0].shape[k];
    if (d != dim || tiled) k++;
  }
  Value *sl = NULL;
  if (start) {
    params_init(&q);
    params_add(&q, "slice_sizes", val_int_tuple(nd, sizes));
    sl = apply(P_DYNAMIC_SLICE, nd + 1, ops, &q, true);
  }
  Value *r = sl;
  if (sl && !tiled) {
    params_init(&q);
    params_add(&q, "new_sizes", val_int_tuple(av[0].ndim, av[0].shape));
    params_add(&q, "dimensions", val_incref(VAL_NONE));
    r = apply(P_RESHAPE, 1, &sl, &q, true);
    val_decref(sl);
  }
  val_decref(idx);
  val_decref(zero);
  if (start) val_decref(start);
  cts[0] = r ? psum_over(r, extra) : NULL;
  if (r) val_decref(r);
  return cts[0] ? 0 : -1;
}

/* psum_scatter: all_gather of the cotangent */
static int tr_psum_scatter(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                           const Params *p, Value **cts) {
  (void)in, (void)lin, (void)nin;
  uint32_t extra;
  if (invariant_axes(P_PSUM_SCATTER, p, &av[0], &extra) < 0) return -1;
  Params q;
  params_except(&q, p, "scatter_dimension");
  params_add(&q, "all_gather_dimension", val_incref(params_get(p, "scatter_dimension")));
  Value *g = apply(P_ALL_GATHER, 1, ct, &q, true);
  cts[0] = g ? psum_over(g, extra) : NULL;
  if (g) val_decref(g);
  return cts[0] ? 0 : -1;
}

/* ppermute: the inverse permutation */
static int tr_ppermute(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                       const Params *p, Value **cts) {
  (void)in, (void)lin, (void)nin;
  uint32_t extra;
  size_t n, k;
  Value *const *items, *const *pr;
  if (invariant_axes(P_PPERMUTE, p, &av[0], &extra) < 0) return -1;
  Value *perm = params_get(p, "perm");
  if (!perm || !val_seq(perm, &n, &items)) return prim_rule_missing(P_PPERMUTE, "transpose");
  Value *inv = tuple_new(n);
  for (size_t i = 0; inv && i < n; i++) {
    val_seq(items[i], &k, &pr);
    Value *sw = tuple_pack(2, (Value *[]){pr[1], pr[0]});
    tuple_set_steal(inv, i, sw ? sw : val_incref(VAL_NONE));
  }
  Params q;
  params_except(&q, p, "perm");
  params_add(&q, "perm", inv);
  Value *r = apply(P_PPERMUTE, 1, ct, &q, true);
  cts[0] = r ? psum_over(r, extra) : NULL;
  if (r) val_decref(r);
  return cts[0] ? 0 : -1;
}

/* all_to_all: the same with split_axis and concat_axis swapped */
static int tr_all_to_all(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                         const Params *p, Value **cts) {
  (void)in, (void)lin, (void)nin;
  uint32_t extra;
  if (invariant_axes(P_ALL_TO_ALL, p, &av[0], &extra) < 0) return -1;
  Params q;
  params_init(&q);
  for (int i = 0; i < p->n; i++) {
    const char *nm = p->p[i].name;
    const char *to = !strcmp(nm, "split_axis") ? "concat_axis"
                   : !strcmp(nm, "concat_axis") ? "split_axis" : nm;
    params_add(&q, to, val_incref(p->p[i].value));
  }
  Value *r = apply(P_ALL_TO_ALL, 1, ct, &q, true);
  cts[0] = r ? psum_over(r, extra) : NULL;
  if (r) val_decref(r);
  return cts[0] ? 0 : -1;
}

/* ---- ragged_all_to_all (seed 002) ------------------------------------------ */

/* Linear in (operand, output) jointly; the offsets and sizes are integers:
 * the same collective on the tangents, zeros for a symbolic zero. */
static int jvp_ragged_all_to_all(Value **x, Value **t, int nin, const Params *p, Value **yo,
                                 Value **to) {
  (void)nin;
  *to = NULL;
  if (!(*yo = apply(P_RAGGED_ALL_TO_ALL, 6, x, (Params *)p, false))) return -1;
  if (!t[0] && !t[1]) return 0;
  Value *in[6] = {t[0], t[1], x[2], x[3], x[4], x[5]}, *z[2] = {NULL, NULL};
  for (int i = 0; i < 2; i++) {
    AVal a;
    if (!in[i] && prim_value_aval(x[i], &a) == 0) in[i] = z[i] = prim_zeros(&a);
  }
  if (in[0] && in[1]) *to = apply(P_RAGGED_ALL_TO_ALL, 6, in, (Params *)p, false);
  for (int i = 0; i < 2; i++)
    if (z[i]) val_decref(z[i]);
  if (*to) return 0;
  val_decref(*yo);
  *yo = NULL;
  return -1;
}

/* all_to_all of a per-peer vector [v] (one entry per device of the axis):
 * entry j of the result is entry i of device j's, i this device. */
static Value *exchange(Value *v, const Params *p, int64_t n) {
  Params q;
  params_init(&q);
  params_add(&q, "axis_name", val_incref(params_get(p, "axis_name")));
  params_add(&q, "axis_size", val_int(n));
  params_add(&q, "axis_index_groups", val_incref(params_get(p, "axis_index_groups")));
  params_add(&q, "split_axis", val_int(0));
  params_add(&q, "concat_axis", val_int(0));
  params_add(&q, "tiled", val_bool(true));
  return apply(P_ALL_TO_ALL, 1, &v, &q, true);
}

/* [acc] with [c] added at each of the positions [at] (scatter-add). */
static Value *add_at(Value *acc, Value *at, int64_t c) {
  AVal a;
  if (!acc || prim_value_aval(at, &a) < 0) return NULL;
  Value *cv = &arr_scalar_i64(DT_I32, c, false)->hdr;
  Params q;
  params_init(&q);
  params_add(&q, "shape", val_int_tuple(a.ndim, a.shape));
  params_add(&q, "broadcast_dimensions", val_int_tuple(0, NULL));
  Value *upd = apply(P_BROADCAST_IN_DIM, 1, &cv, &q, true);
  params_init(&q);
  params_add(&q, "axis", val_int(0));
  params_add(&q, "mode", str_from("add"));
  Value *r = upd ? apply(P_SCATTER, 3, (Value *[]){acc, at, upd}, &q, true) : NULL;
  params_clear(&q);
  val_decref(cv);
  if (upd) val_decref(upd);
  return r;
}

/* The rows of an output of [rows] rows that the peers wrote: rows
 * [start_j, start_j + size_j) for each j, as a bool vector, from a
 * difference array (+1 at each start, -1 at each end, summed). */
static Value *written_rows(Value *start, Value *size, int64_t rows) {
  Params q;
  params_init(&q);
  Value *end = apply(P_ADD, 2, (Value *[]){start, size}, &q, false);
  AVal ma = {.dtype = DT_I32, .ndim = 1, .shape = {rows + 1}};
  Value *z = prim_zeros(&ma), *m1 = add_at(z, start, 1), *m2 = end ? add_at(m1, end, -1) : NULL;
  Value *run = NULL, *cut = NULL, *r = NULL;
  if (m2) {
    params_init(&q);
    params_add(&q, "axis", val_int(0));
    params_add(&q, "reverse", val_bool(false));
    run = apply(P_CUMSUM, 1, &m2, &q, true);
  }
  if (run) {
    params_init(&q);
    params_add(&q, "start_indices", val_int_tuple(1, (int64_t[]){0}));
    params_add(&q, "limit_indices", val_int_tuple(1, (int64_t[]){rows}));
    params_add(&q, "strides", val_incref(VAL_NONE));
    cut = apply(P_SLICE, 1, &run, &q, true);
  }
  if (cut) {
    Value *zs = &arr_scalar_i64(DT_I32, 0, false)->hdr;
    params_init(&q);
    r = apply(P_GT, 2, (Value *[]){cut, zs}, &q, false);
    val_decref(zs);
  }
  Value *tmp[] = {end, z, m1, m2, run, cut};
  for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
    if (tmp[i]) val_decref(tmp[i]);
  return r;
}

/* The transpose sends each device's output cotangent back where it came
 * from: the rows a peer wrote (at that peer's output_offsets for this
 * device, learned by an all_to_all) go back to the peer's operand rows
 * (its input_offsets, likewise); the output's cotangent keeps the rows no
 * peer wrote.  JAX's rule in parallel.py. */
static int tr_ragged_all_to_all(Value **ct, Value **in, const AVal *av, const bool *lin,
                                int nin, const Params *p, Value **cts) {
  (void)nin;
  int64_t n = av[2].ndim ? av[2].shape[0] : 1, rows = av[1].ndim ? av[1].shape[0] : 0;
  Value *out_off = exchange(in[4], p, n), *in_off = out_off ? exchange(in[2], p, n) : NULL;
  Value *zero = prim_zeros(&av[0]);
  int rc = -1;
  if (out_off && in_off && zero) {
    if (lin[0]) {
      Value *args[6] = {ct[0], zero, out_off, in[5], in_off, in[3]};
      cts[0] = apply(P_RAGGED_ALL_TO_ALL, 6, args, (Params *)p, false);
    }
    if (lin[1]) {
      Value *w = written_rows(out_off, in[5], rows);
      AVal ca = av[1];
      Value *bw = NULL;
      if (w) {
        Params q;
        params_init(&q);
        params_add(&q, "shape", val_int_tuple(ca.ndim, ca.shape));
        params_add(&q, "broadcast_dimensions", val_int_tuple(1, (int64_t[]){0}));
        bw = apply(P_BROADCAST_IN_DIM, 1, &w, &q, true);
        val_decref(w);
      }
      Value *zo = bw ? prim_zeros(&ca) : NULL;
      Params none;
      params_init(&none);
      cts[1] = zo ? apply(P_SELECT_N, 3, (Value *[]){bw, ct[0], zo}, &none, false) : NULL;
      if (bw) val_decref(bw);
      if (zo) val_decref(zo);
    }
    rc = (!lin[0] || cts[0]) && (!lin[1] || cts[1]) ? 0 : -1;
  }
  Value *tmp[] = {out_off, in_off, zero};
  for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
    if (tmp[i]) val_decref(tmp[i]);
  return rc;
}

/* ---- batching over mesh axes (a vmap inside or around a body) -------------- */

/* psum, pmax, pmin, ppermute: element-wise across devices, the batch axis
 * stays where it is. */
static int batch_same(PrimId id, Value **in, const int *dims, const Params *p, Value **out,
                      int *od) {
  *od = dims[0];
  return (*out = apply(id, 1, in, (Params *)p, false)) ? 0 : -1;
}
#define SAME(name, ID)                                                                  \
  static int b_##name(Value **in, const int *dims, int nin, const Params *p, Value **out, \
                      int *od) {                                                        \
    (void)nin;                                                                          \
    return batch_same(P_##ID, in, dims, p, out, od);                                    \
  }
SAME(psum, PSUM) SAME(pmax, PMAX) SAME(pmin, PMIN) SAME(ppermute, PPERMUTE) SAME(pvary, PVARY)

/* all_gather, psum_scatter, all_to_all: the batch axis first and their
 * dimension parameters one further. */
static int batch_shift(PrimId id, const char *const *names, Value **in, const int *dims,
                       const Params *p, Value **out, int *od) {
  Value *x = prim_batch_moveaxis(in[0], dims[0], 0);
  if (!x) return -1;
  Params q;
  params_init(&q);
  for (int i = 0; i < p->n; i++) {
    bool shift = false;
    for (int k = 0; names[k]; k++) shift |= !strcmp(p->p[i].name, names[k]);
    int64_t v;
    if (shift && arr_to_index(p->p[i].value, &v) == 0)
      params_add(&q, p->p[i].name, val_int(v + 1));
    else
      params_add(&q, p->p[i].name, val_incref(p->p[i].value));
  }
  *out = apply(id, 1, &x, &q, true);
  val_decref(x);
  *od = 0;
  return *out ? 0 : -1;
}
static int b_all_gather(Value **in, const int *dims, int nin, const Params *p, Value **out,
                        int *od) {
  (void)nin;
  return batch_shift(P_ALL_GATHER, (const char *[]){"all_gather_dimension", NULL}, in, dims, p,
                     out, od);
}
static int b_psum_scatter(Value **in, const int *dims, int nin, const Params *p, Value **out,
                          int *od) {
  (void)nin;
  return batch_shift(P_PSUM_SCATTER, (const char *[]){"scatter_dimension", NULL}, in, dims, p,
                     out, od);
}
static int b_all_to_all(Value **in, const int *dims, int nin, const Params *p, Value **out,
                        int *od) {
  (void)nin;
  return batch_shift(P_ALL_TO_ALL, (const char *[]){"split_axis", "concat_axis", NULL}, in, dims,
                     p, out, od);
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
  return (cts[0] = psum_over(ct[0], m & ~av[0].vma)) ? 0 : -1;
}

void coll_ad_install(void) {
  prim_table[P_PVARY].rules.shape = shape_pvary;
  prim_table[P_PVARY].rules.kernel = kernel_pvary;
  prim_table[P_PVARY].rules.vma = vma_pvary;
  prim_table[P_PVARY].rules.jvp = jvp_pvary;
  prim_table[P_PVARY].rules.transpose = tr_pvary;
  prim_table[P_PVARY].rules.batch = b_pvary;
#define J(ID, name) prim_table[P_##ID].rules.jvp = jvp_##name;
#define T(ID, name) prim_table[P_##ID].rules.transpose = tr_##name;
  J(PSUM, psum) J(PMAX, pmax) J(PMIN, pmin) J(ALL_GATHER, all_gather)
  J(PSUM_SCATTER, psum_scatter) J(PPERMUTE, ppermute) J(ALL_TO_ALL, all_to_all)
  T(PSUM, psum) T(ALL_GATHER, all_gather) T(PSUM_SCATTER, psum_scatter)
  T(PPERMUTE, ppermute) T(ALL_TO_ALL, all_to_all)
  J(RAGGED_ALL_TO_ALL, ragged_all_to_all) T(RAGGED_ALL_TO_ALL, ragged_all_to_all)
#define B(ID, name) prim_table[P_##ID].rules.batch = b_##name;
  B(PSUM, psum) B(PMAX, pmax) B(PMIN, pmin) B(PPERMUTE, ppermute) B(ALL_GATHER, all_gather)
  B(PSUM_SCATTER, psum_scatter) B(ALL_TO_ALL, all_to_all)
#undef B
#undef J
#undef T
}
