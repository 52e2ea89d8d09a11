/*
 * collective_ad.c - what the collectives' rules share (collective_impl.h):
 * a primitive applied inside a rule, psum over the axes a cotangent must
 * sum over, the JVP of a linear collective and the batching of one that
 * is element-wise across devices.  Each collective's own rules sit in its
 * family's file, beside its kernel (collective_reduce.c,
 * collective_move.c, collective_ragged.c).
 *
 * Semantics: LANGUAGE.md §11 and JAX's parallel.py.  A cotangent has the
 * replication type of its primal, so a collective whose operand is
 * invariant over some of its axes (summed n times over) sums its
 * cotangent over them (coll_invariant_axes, coll_psum_over).  The
 * backward pass (transform/ad.c) sums, over the extra axes, any cotangent
 * that varies where its primal does not: the transpose of the implicit
 * pvary where an invariant value meets a varying one.
 */
#include <string.h>

#include "base/intern.h"
#include "spmd/collective_impl.h"

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
Value *coll_rule_apply(PrimId id, int n, Value **x, Params *p, bool own) {
  Params q;
  params_init(&q);
  for (int i = 0; p && i < p->n; i++) params_add(&q, p->p[i].name, val_incref(p->p[i].value));
  if (own && p) params_clear(p);
  return prim_apply_rule(id, n, x, &q);
}

/* A copy of [p] without [skip] (NULL: none). */
void coll_params_except(Params *dst, const Params *p, const char *skip) {
  params_init(dst);
  for (int i = 0; i < p->n; i++)
    if (!skip || strcmp(p->p[i].name, skip)) params_add(dst, p->p[i].name, val_incref(p->p[i].value));
}

/* psum of [x] over the axes of [mask] (none: a new reference to x). */
Value *coll_psum_over(Value *x, uint32_t mask) {
  if (!mask) return val_incref(x);
  Params q;
  params_init(&q);
  params_add(&q, "axes", coll_axis_names(mask));
  params_add(&q, "axis_index_groups", val_incref(VAL_NONE));
  return coll_rule_apply(P_PSUM, 1, &x, &q, true);
}

/* Whether a collective runs within axis_index_groups. */
bool coll_grouped(const Params *p) {
  Value *g = params_get(p, "axis_index_groups");
  return g && g != VAL_NONE;
}

/* The axes of [p] over which operand aval [a] is invariant: its cotangent
 * sums over them. */
int coll_invariant_axes(const Params *p, const AVal *a, uint32_t *extra) {
  *extra = 0;
  if (coll_grouped(p)) return 0;   /* grouped results keep their axes: they vary */
  uint32_t m = 0;
  if (!coll_axes_mask(p, &m)) m = 0;
  *extra = m & ~a->vma;
  return 0;
}

/* ---- JVP ------------------------------------------------------------------ */

/* A collective linear in its operand: the same collective on the tangent. */
int coll_jvp_linear(PrimId id, Value **x, Value **t, const Params *p, Value **yo, Value **to) {
  *to = NULL;
  if (!(*yo = coll_rule_apply(id, 1, x, (Params *)p, false))) return -1;
  if (!t[0]) return 0;
  if ((*to = coll_rule_apply(id, 1, t, (Params *)p, false))) return 0;
  val_decref(*yo);
  *yo = NULL;
  return -1;
}

/* ---- batching over mesh axes (a vmap inside or around a body) -------------- */

/* psum, pmax, pmin, ppermute: element-wise across devices, the batch axis
 * stays where it is. */
int coll_batch_same(PrimId id, Value **in, const int *dims, const Params *p, Value **out,
                    int *od) {
  *od = dims[0];
  return (*out = coll_rule_apply(id, 1, in, (Params *)p, false)) ? 0 : -1;
}
