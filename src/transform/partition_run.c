/*
 * partition_run.c - a partitioned plan run as a shard_map (partition.h,
 * "Execution").
 *
 * The body is an interpreter over the global plan: each device holds its
 * block of every variable, laid out as the PartPlan says, and before an
 * equation it reshards the operands the equation wants laid out
 * otherwise.  Every step goes through prim_bind, so the same body runs
 * eagerly on the device threads and stages into the shard_map's plan
 * under jit (where the inserted collectives carry the equation's source
 * line).
 */
#include <string.h>

#include "base/intern.h"
#include "base/mem.h"
#include "lang/eval.h"
#include "lang/ops.h"
#include "spmd/device.h"
#include "spmd/shardmap.h"
#include "transform/higher.h"
#include "transform/partition.h"
#include "transform/trace.h"

/* The names of the mesh axes [s->split[d]][from..] (a string for one),
 * and the product of their sizes in [*size]. */
static Value *axis_names(const PartPlan *pp, const Sharding *s, int d, int from, int64_t *size) {
  int n = s->nsplit[d] - from;
  *size = 1;
  for (int k = from; k < s->nsplit[d]; k++) *size *= s->axis_sizes[s->split[d][k]];
  if (n == 1) return str_from(pp->mesh->axis_names[s->split[d][from]]);
  Value *t = tuple_new((size_t)n);
  for (int k = 0; t && k < n; k++)
    tuple_set_steal(t, (size_t)k, str_from(pp->mesh->axis_names[s->split[d][from + k]]));
  return t;
}

/* all_gather (tiled) of [x] (consumed) along [d] over [names] (consumed). */
static Value *gather_dim(Value *x, int d, Value *names, int64_t size) {
  Params q;
  params_init(&q);
  params_add(&q, "axis_name", names);
  params_add(&q, "all_gather_dimension", val_int(d));
  params_add(&q, "axis_size", val_int(size));
  params_add(&q, "tiled", val_bool(true));
  params_add(&q, "axis_index_groups", val_incref(VAL_NONE));
  Value *r = x ? prim_bind(P_ALL_GATHER, 1, &x, &q) : NULL;
  params_clear(&q);
  if (x) val_decref(x);
  return r;
}

/* This device's block [count] ways of [x] (consumed) along [d]: a
 * dynamic slice at axis_index([names]) (consumed) times the block. */
static Value *slice_dim(Value *x, int d, Value *names, int64_t count) {
  AVal av;
  Value *r = NULL, *in[SHM_MAXDIM + 1] = {0}, *idx = NULL, *bv = NULL;
  if (!x || prim_value_aval(x, &av) < 0) goto out;
  Params q;
  params_init(&q);
  params_add(&q, "axis_name", val_incref(names));
  idx = prim_bind(P_AXIS_INDEX, 0, NULL, &q);
  params_clear(&q);
  int64_t block = av.shape[d] / count, sizes[SHM_MAXDIM];
  if (!idx || !(bv = val_int(block))) goto out;
  in[0] = x;
  for (int i = 0; i < av.ndim; i++) {
    sizes[i] = i == d ? block : av.shape[i];
    in[i + 1] = i == d ? ops_binary(OP_MUL, idx, bv) : val_int(0);
    if (!in[i + 1]) goto out;
  }
  params_init(&q);
  params_add(&q, "slice_sizes", val_int_tuple(av.ndim, sizes));
  r = ops_apply(P_DYNAMIC_SLICE, av.ndim + 1, in, &q);
  params_clear(&q);
out:
  for (int i = 1; i <= SHM_MAXDIM; i++)
    if (in[i]) val_decref(in[i]);
  if (idx) val_decref(idx);
  if (bv) val_decref(bv);
  if (x) val_decref(x);
  val_decref(names);
  return r;
}

/* [x] (borrowed), this device's block of a value laid out as [have],
 * as its block laid out as [want]: a new reference or NULL. */
static Value *complete(const PartPlan *pp, Value *x, const Sharding *out);

/* all_to_all (tiled) of [x] (consumed) over [names] (consumed): split
 * along [split], concatenated along [concat]. */
static Value *move_dim(Value *x, int split, int concat, Value *names) {
  Params q;
  params_init(&q);
  params_add(&q, "axis_name", names);
  params_add(&q, "split_axis", val_int(split));
  params_add(&q, "concat_axis", val_int(concat));
  params_add(&q, "axis_index_groups", val_incref(VAL_NONE));
  params_add(&q, "tiled", val_bool(true));
  Value *r = x ? prim_bind(P_ALL_TO_ALL, 1, &x, &q) : NULL;
  params_clear(&q);
  if (x) val_decref(x);
  return r;
}

static Value *reshard(const PartPlan *pp, Value *x, const Sharding *have, const Sharding *want) {
  Value *r = val_incref(x);
  if (have->partial && !want->partial) r = complete(pp, r, have);
  /* axes moving from one dimension to another: one all_to_all each */
  Sharding cur = *have;
  uint32_t done = 0;
  for (int d = 0; r && d < have->ndim; d++) {
    int d2 = part_moves(have, want, d);
    if (d2 < 0 || (done >> d2 & 1)) continue;
    int64_t n;
    Value *names = axis_names(pp, have, d, 0, &n);
    r = names ? move_dim(r, d2, d, names) : (val_decref(r), NULL);
    cur.nsplit[d] = 0;
    cur.nsplit[d2] = want->nsplit[d2];
    memcpy(cur.split[d2], want->split[d2], sizeof cur.split[d2]);
    done |= 1u << d | 1u << d2;
  }
  have = &cur;
  /* every gather before any slice: a mesh axis leaving one dimension may
   * start splitting another, and the blocks it gathers must still be the
   * ones the devices along it hold (P(None, 'y') to P(('y', 'x'), None)) */
  for (int d = 0; r && d < have->ndim; d++) {
    bool gather;
    int from;
    int64_t n;
    part_dim_steps(have, want, d, &gather, &from);
    if (gather) {
      Value *names = axis_names(pp, have, d, 0, &n);
      r = names ? gather_dim(r, d, names, n) : (val_decref(r), NULL);
    }
  }
  for (int d = 0; r && d < have->ndim; d++) {
    bool gather;
    int from;
    int64_t n;
    part_dim_steps(have, want, d, &gather, &from);
    if (from < want->nsplit[d]) {
      Value *names = axis_names(pp, want, d, from, &n);
      r = names ? slice_dim(r, d, names, n) : (val_decref(r), NULL);
    }
  }
  return r;
}

/* The collective completing a partial result [x] (consumed) over the
 * mesh axes [out->partial]. */
static Value *complete(const PartPlan *pp, Value *x, const Sharding *out) {
  PrimId id = !strcmp(out->partial_coll, "pmax") ? P_PMAX
              : !strcmp(out->partial_coll, "pmin") ? P_PMIN : P_PSUM;
  int n = 0;
  for (int a = 0; a < pp->mesh->naxes; a++) n += out->partial >> a & 1;
  Value *names = tuple_new((size_t)n);
  for (int a = 0, k = 0; names && a < pp->mesh->naxes; a++)
    if (out->partial >> a & 1) tuple_set_steal(names, (size_t)k++, str_from(pp->mesh->axis_names[a]));
  Params q;
  params_init(&q);
  params_add(&q, "axes", names);
  params_add(&q, "axis_index_groups", val_incref(VAL_NONE));
  Value *r = x && names ? prim_bind(id, 1, &x, &q) : NULL;
  params_clear(&q);
  if (x) val_decref(x);
  return r;
}

static Value *run_body(const PartPlan *pp, const Plan *p, Value **in);

/* [spec] (a PSpec, borrowed) over the plan's mesh as a layout of rank
 * [ndim]. */
static void spec_layout(const PartPlan *pp, Value *spec, int ndim, Sharding *out) {
  NamedSharding ns = {.mesh = pp->mesh, .spec = (PSpec *)spec, .device = -1};
  sharding_to_rule(&ns, ndim, out);
}

/* [x] (borrowed, of rank [ndim]), whole on this device, split as [spec]
 * says (a local slice, [to_block]) or [x] a block so split made whole
 * again (a tiled all_gather): a new reference or NULL. */
static Value *nested_reshard(const PartPlan *pp, Value *x, int ndim, Value *spec, bool to_block) {
  Sharding whole, split;
  spec_layout(pp, spec, ndim, &split);
  whole = split;
  for (int d = 0; d < whole.ndim; d++) whole.nsplit[d] = 0;
  return to_block ? reshard(pp, x, &whole, &split) : reshard(pp, x, &split, &whole);
}

/* The mesh axes (bits) [v] (a str or tuple of them, e.g. manual_axes)
 * or the entries of PSpec [v] name. */
static uint32_t named_axes(const PartPlan *pp, Value *v) {
  uint32_t bits = 0;
  if (v->type == V_PSPEC) {
    const PSpec *s = (const PSpec *)v;
    for (int d = 0; d < s->n; d++)
      for (int q = 0; q < s->e[d].nnames; q++) bits |= 1u << mesh_axis(pp->mesh, s->e[d].names[q]);
    return bits;
  }
  size_t n = 1;
  Value *const *items = &v;
  if (v->type != V_STR && !val_seq(v, &n, &items)) return 0;
  for (size_t i = 0; i < n; i++) {
    int a = items[i]->type == V_STR ? mesh_axis(pp->mesh, intern_cstr(str_cstr(items[i]))) : -1;
    if (a >= 0) bits |= 1u << a;
  }
  return bits;
}

/* The replication check of nested equation [e] (check_rep) from its
 * body's traced result types: over its manual axes a result may vary
 * only along axes its out_spec names.  The blocks here carry no types
 * (every axis is manual), so the check the call makes on the devices
 * is made from the plan.  0, or -1 with the ValueError. */
static int nested_check_vma(const PartPlan *pp, const PlanEqn *e, const Plan *body, Value *outs) {
  Value *cr = params_get(&e->params, "check_rep"), *manual = params_get(&e->params, "manual_axes");
  if (!cr || !IS_ARRAY(cr) || !arr_get_i64(AS_ARRAY(cr), 0)) return 0;
  uint32_t inner = manual ? named_axes(pp, manual) : ~0u;
  for (int k = 0; k < body->nout; k++) {
    AVal av;
    plan_atom_aval(body, &body->outs[k], &av);
    Value *spec = tuple_get(outs, (size_t)k);
    uint32_t bad = av.vma & inner & ~named_axes(pp, spec);
    for (int a = 0; bad && a < pp->mesh->naxes; a++)
      if (bad >> a & 1)
        return part_vma_error(pp->mesh, e, body, (const PSpec *)spec, k, a);
  }
  return 0;
}

/* A shard_map equation [e] inside a body run in place, where every mesh
 * axis is manual: a nested shard_map (shmap(7)), whose inner manual axes
 * here are manual already.  Its operands [ops] are split by its
 * in_specs, its body runs on them as this one does, and its results come
 * back whole along the axes its out_specs split.  A tuple of its
 * results. */
static Value *run_nested(const PartPlan *pp, const PlanEqn *e, Value **ops) {
  Value *ins = params_get(&e->params, "in_specs"), *outs = params_get(&e->params, "out_specs");
  Value *body = params_get(&e->params, "jaxpr");
  if (!ins || !outs || !body || tuple_len(ins) != (size_t)e->nin ||
      tuple_len(outs) != (size_t)e->nout)
    return err_set(ERR_VALUE, "shard_map equation without its specs");
  if (nested_check_vma(pp, e, AS_PLAN(body), outs) < 0) return NULL;
  Value **blocks = shm_calloc((size_t)e->nin + 1, sizeof(Value *)), *r = NULL;
  if (!blocks) return err_nomem();
  int made = 0;
  for (; made < e->nin; made++) {
    AVal av;
    if (ops_aval(ops[made], &av) < 0 ||
        !(blocks[made] = nested_reshard(pp, ops[made], av.ndim, tuple_get(ins, (size_t)made), true)))
      break;
  }
  Value *res = made == e->nin ? run_body(pp, AS_PLAN(body), blocks) : NULL;
  if (res) r = tuple_new((size_t)e->nout);
  for (int k = 0; r && k < e->nout; k++) {
    Value *x = tuple_get(res, (size_t)k);
    AVal av;
    Value *w = ops_aval(x, &av) < 0 ? NULL
               : nested_reshard(pp, x, av.ndim, tuple_get(outs, (size_t)k), false);
    if (!w) {
      for (int j = k; j < e->nout; j++) tuple_set_steal(r, (size_t)j, val_incref(VAL_NONE));
      val_decref(r);
      r = NULL;
      break;
    }
    tuple_set_steal(r, (size_t)k, w);
  }
  if (res) val_decref(res);
  for (int i = 0; i < made; i++) val_decref(blocks[i]);
  shm_free(blocks);
  return r;
}

/* Plan [p] (a shard_map's body) on this device's blocks [in]: a tuple of
 * its results.  Each equation through its row (a higher-order one by its
 * eval rule, a shard_map as a nested call), as the body runs under
 * shard_map. */
static Value *run_body(const PartPlan *pp, const Plan *p, Value **in) {
  Value **env = shm_calloc((size_t)p->nvars + 1, sizeof(Value *)), *r = NULL;
  if (!env) return err_nomem();
  for (int i = 0; i < p->nconst; i++) env[p->constvars[i]] = val_incref(p->consts[i]);
  for (int i = 0; i < p->nin; i++) env[p->invars[i]] = val_incref(in[i]);
  int k = 0;
  for (; k < p->neqn; k++) {
    const PlanEqn *e = &p->eqns[k];
    Value *stack[8], **ops = e->nin <= 8 ? stack : shm_calloc((size_t)e->nin, sizeof(Value *));
    if (!ops) break;
    /* the operands held while the equation runs: a variable the scope
     * alone holds would look unshared, and an element-wise kernel would
     * write its result over it (value.h) while a later equation reads it */
    for (int i = 0; i < e->nin; i++) ops[i] = val_incref(e->in[i].var >= 0 ? env[e->in[i].var] : e->in[i].lit);
    eval_set_current_loc(e->loc);
    const HigherRules *h = higher_rules(e->prim);
    bool nested = e->prim == P_SHARD_MAP;
    Value *res = nested ? run_nested(pp, e, ops)
                 : h && h->eval ? h->eval(e, ops) : prim_bind(e->prim, e->nin, ops, &e->params);
    for (int i = 0; i < e->nin; i++) val_decref(ops[i]);
    if (ops != stack) shm_free(ops);
    if (!res) break;
    bool tup = e->nout != 1 || nested || (h && h->eval && h->eval_tuple);
    for (int j = 0; j < e->nout; j++) env[e->out[j]] = val_incref(tup ? tuple_get(res, (size_t)j) : res);
    val_decref(res);
  }
  if (k == p->neqn) r = tuple_new((size_t)p->nout);
  for (int i = 0; r && i < p->nout; i++)
    tuple_set_steal(r, (size_t)i, val_incref(p->outs[i].var >= 0 ? env[p->outs[i].var] : p->outs[i].lit));
  for (int i = 0; i < p->nvars; i++)
    if (env[i]) val_decref(env[i]);
  shm_free(env);
  return r;
}

/* plan(): [text] (NULL: none) as the comment after the last equation
 * staged into [bp] (NULL: not annotating), when any was staged since
 * [before] equations. */
static void note_after(Plan *bp, int before, const char *text) {
  if (bp && text && bp->neqn > before && plan_note_add(bp, bp->neqn - 1, text) < 0) err_clear();
}

/* A device's variables: each one's block as the plan lays it out, and
 * the last other layout an equation needed it in (a weight FSDP gathers
 * for the forward pass is not gathered again for the backward one). */
typedef struct Env {
  Value **v;          /* p->nvars */
  Value **alt;        /* p->nvars, or NULL entries */
  Sharding *alt_sh;   /* p->nvars */
} Env;

static bool same_layout(const Sharding *a, const Sharding *b) {
  if (a->ndim != b->ndim || a->partial != b->partial) return false;
  for (int d = 0; d < a->ndim; d++) {
    if (a->nsplit[d] != b->nsplit[d]) return false;
    for (int k = 0; k < a->nsplit[d]; k++)
      if (a->split[d][k] != b->split[d][k]) return false;
  }
  return true;
}

/* Variable [v]'s block laid out as [want]: a new reference or NULL.  A
 * partial sum completed here counts at the line of the equation that
 * made it (--comm-stats, the plan's comments). */
static Value *var_as(const PartPlan *pp, Env *env, int v, const Sharding *want) {
  if (same_layout(&pp->vars[v], want)) return val_incref(env->v[v]);
  if (env->alt[v] && same_layout(&env->alt_sh[v], want)) return val_incref(env->alt[v]);
  bool completes = pp->vars[v].partial && !want->partial;
  Loc was = completes ? eval_set_current_loc(pp->p->eqns[pp->origin[v]].loc) : (Loc){0};
  Value *r = reshard(pp, env->v[v], &pp->vars[v], want);
  if (completes) eval_set_current_loc(was);
  if (!r) return NULL;
  if (env->alt[v]) val_decref(env->alt[v]);
  env->alt[v] = val_incref(r);
  env->alt_sh[v] = *want;
  return r;
}

static Value *body_call(Value *self, const CallArgs *a);

/* A control-flow equation on this device's blocks [ops]: its row's eval
 * rule (the language's cond, while_loop, scan: eager on the device
 * threads, staged under jit) with each sub-plan replaced by the
 * per-device body of its partitioned form. */
static Value *run_control(const PlanEqn *e, const PartEqn *pe, Value **ops) {
  /* each sub-plan's parameter and the first of pe->subs it takes
   * (part_control's order) */
  static const struct {
    const char *name;
    int first;
  } names[] = {{"branches", 0}, {"cond_jaxpr", 0}, {"body_jaxpr", 1}, {"jaxpr", 0}};
  PlanEqn t = *e;
  params_init(&t.params);
  bool ok = true;
  for (int i = 0; i < e->params.n; i++) {
    const char *n = e->params.p[i].name;
    Value *v = e->params.p[i].value, *w = NULL;
    int next = -1;
    for (size_t j = 0; j < sizeof names / sizeof *names; j++)
      if (!strcmp(n, names[j].name)) next = names[j].first;
    if (next < 0) {
      params_add(&t.params, n, val_incref(v));
      continue;
    }
    size_t m = v->type == V_TUPLE ? tuple_len(v) : 1;
    Value *tup = v->type == V_TUPLE ? tuple_new(m) : NULL;
    for (size_t j = 0; j < m; j++) {
      Value *f = next < pe->nsubs ? bound_new("partitioned", body_call, &pe->subs[next++]->base.hdr) : NULL;
      ok = ok && f;
      if (!tup) w = f;
      else tuple_set_steal(tup, j, f ? f : val_incref(VAL_NONE));
    }
    params_add(&t.params, n, tup ? tup : w ? w : val_incref(VAL_NONE));
  }
  Value *r = ok ? higher_rules(e->prim)->eval(&t, ops) : NULL;
  if (!ok && !err_occurred()) err_nomem();
  params_clear(&t.params);
  return r;
}

/* The callback of a debug_callback (jax.debug.print, breakpoint) run
 * by the mesh's first device only, on the whole values: a partitioned
 * jit prints once and stops once, as JAX's runs its callbacks on one
 * device. */
static Value *first_device_call(Value *self, const CallArgs *a) {
  DevCtx *ctx = dev_ctx();
  if (ctx && ctx->rank != 0) return val_incref(VAL_NONE);
  return val_call(self, a);
}

static Value *run_callback(const PlanEqn *e, Value **ops) {
  PlanEqn t = *e;
  params_init(&t.params);
  for (int i = 0; i < e->params.n; i++) {
    Value *v = e->params.p[i].value;
    bool cb = !strcmp(e->params.p[i].name, "callback");
    params_add(&t.params, e->params.p[i].name, cb ? bound_new("callback", first_device_call, v) : val_incref(v));
  }
  Value *r = t.params.nomem ? err_nomem() : higher_rules(e->prim)->eval(&t, ops);
  params_clear(&t.params);
  return r;
}

/* A scalar constant of dtype [t], weak: [v]. */
static Value *scalar(DType t, double v) {
  return dt_is_float(t) ? (Value *)arr_scalar_f64(t, v, true) : (Value *)arr_scalar_i64(t, (int64_t)v, true);
}

/* Scalar [c] (borrowed) broadcast to the shape of [like]: staged under
 * jit as a broadcast_in_dim, so the plan holds no constant of that size. */
static Value *filled_like(Value *c, Value *like) {
  AVal a;
  if (prim_value_aval(like, &a) < 0) return NULL;
  Params q;
  params_init(&q);
  params_add(&q, "shape", val_int_tuple(a.ndim, a.shape));
  params_add(&q, "broadcast_dimensions", tuple_new(0));
  Value *r = prim_bind(P_BROADCAST_IN_DIM, 1, &c, &q);
  params_clear(&q);
  return r;
}

/* Where this device's block of dimension [d] of a value laid out as [s]
 * starts: axis_index of the mesh axes splitting it times the block's
 * length [blk], as dtype [t] (weak, so it takes the indices' type);
 * [*count] the number of blocks.  A new reference, or NULL. */
static Value *block_start(const PartPlan *pp, const Sharding *s, int d, int64_t blk, DType t,
                          int64_t *count) {
  Value *names = axis_names(pp, s, d, 0, count);
  Params q;
  params_init(&q);
  params_add(&q, "axis_name", names);
  Value *ai = prim_bind(P_AXIS_INDEX, 0, NULL, &q);
  params_clear(&q);
  Value *aic = ai ? ops_convert(ai, t, true) : NULL, *c_blk = aic ? scalar(t, (double)blk) : NULL;
  Value *off = c_blk ? ops_binary(OP_MUL, aic, c_blk) : NULL;
  val_decref(ai);
  val_decref(aic);
  val_decref(c_blk);
  return off;
}

/* The dimension a gather or scatter [e] takes along, when this device's
 * operand block [pe->want[0]] is split there (the rule kept it:
 * prim_index.c, taken_split); else -1. */
static int taken_axis(const PlanEqn *e, const PartEqn *pe) {
  int64_t ax;
  if (e->prim != P_GATHER && e->prim != P_SCATTER) return -1;
  if (params_int(&e->params, "axis", &ax) < 0) {
    err_clear();   /* its own lookup's error: the kernel reports it */
    return -1;
  }
  int nd = pe->want[0].ndim, a = (int)(ax < 0 ? ax + nd : ax);
  return a >= 0 && a < nd && pe->want[0].nsplit[a] ? a : -1;
}

/* Gather or scatter [e] along [axis] of this device's operand block
 * ops[0], split there: the global indices ops[1] offset by the block's
 * start (axis_index of its mesh axes times the block's length) and
 * masked to the rows this device holds.  A gather takes its rows (the
 * indices clamped to the global length first, as the kernel clamps) and
 * fills the others with -0.0 (0 for integers, False), so the psum that
 * completes the partial result adds exactly one value to zeros: the
 * unsharded gather's bits.  A scatter drops the others (index -1, which
 * the kernel drops), so each device updates only its own rows. */
static Value *masked_take(const PartPlan *pp, const PlanEqn *e, const PartEqn *pe, int axis,
                          Value **ops) {
  AVal ob, ia;
  int64_t count;
  if (prim_value_aval(ops[0], &ob) < 0 || prim_value_aval(ops[1], &ia) < 0) return NULL;
  int64_t blk = ob.shape[axis];
  Value *off = block_start(pp, &pe->want[0], axis, blk, ia.dtype, &count);
  Value *c_blk = scalar(ia.dtype, (double)blk), *c0 = scalar(ia.dtype, 0),
        *c_last = scalar(ia.dtype, (double)(blk * count - 1)), *c_neg = scalar(ia.dtype, -1);
  bool gather = e->prim == P_GATHER;
  Value *g = NULL, *li = NULL, *ge = NULL, *lt = NULL, *valid = NULL,
        *pick = NULL, *r = NULL;
  if (gather && off) {   /* the kernel clamps: so do the global indices */
    Value *in[3] = {c0, ops[1], c_last};
    Params none;
    params_init(&none);
    g = prim_bind(P_CLAMP, 3, in, &none);
  }
  Value *idx = gather ? g : ops[1];
  if (idx && off) li = ops_binary(OP_SUB, idx, off);
  if (li) ge = ops_compare(OP_GE, li, c0);
  if (ge) lt = ops_compare(OP_LT, li, c_blk);
  if (lt) valid = ops_binary(OP_BITAND, ge, lt);
  Value *other = valid ? filled_like(gather ? c0 : c_neg, li) : NULL;
  if (other) pick = ops_select(valid, li, other);
  val_decref(other);
  const Params *p = pe->local ? &pe->params : &e->params;
  if (pick && !gather) {
    Value *in[3] = {ops[0], pick, ops[2]};
    r = prim_bind(P_SCATTER, 3, in, p);
  } else if (pick) {
    Value *in[2] = {ops[0], pick};
    Value *t = prim_bind(P_GATHER, 2, in, p);
    /* the validity along the indices' dimensions of the result */
    int64_t vs[SHM_MAXDIM];
    int nd = 0;
    for (int d = 0; d < axis; d++) vs[nd++] = 1;
    for (int d = 0; d < ia.ndim; d++) vs[nd++] = ia.shape[d];
    for (int d = axis + 1; d < ob.ndim; d++) vs[nd++] = 1;
    Value *vr = t ? ops_reshape(valid, nd, vs) : NULL;
    Value *fill = !t ? NULL : dt_is_float(ob.dtype) ? scalar(ob.dtype, -0.0)
                                                    : (Value *)arr_scalar_i64(ob.dtype, 0, false);
    Value *fb = vr && fill ? filled_like(fill, t) : NULL;
    r = fb ? ops_select(vr, t, fb) : NULL;
    val_decref(fb);
    val_decref(t);
    val_decref(vr);
    val_decref(fill);
  }
  val_decref(off); val_decref(c_blk); val_decref(c0);
  val_decref(c_last); val_decref(c_neg); val_decref(g); val_decref(li); val_decref(ge);
  val_decref(lt); val_decref(valid); val_decref(pick);
  return r;
}

/* Whether dynamic_update_slice [e] keeps its operand split along a
 * dimension its update covers only in part (prim_index.c's rule: the
 * update is whole there, the operand split). */
static bool masked_update(const PlanEqn *e, const PartEqn *pe) {
  if (e->prim != P_DYNAMIC_UPDATE_SLICE || e->nin < 2 || pe->want[1].ndim != pe->want[0].ndim) return false;
  for (int d = 0; d < pe->want[0].ndim; d++)
    if (pe->want[0].nsplit[d] && !pe->want[1].nsplit[d]) return true;
  return false;
}

/* dynamic_update_slice on this device's operand block ops[0], split
 * along dimensions the whole update ops[1] covers in part (masked_update):
 * along each such dimension the start is clamped globally, as the
 * kernel clamps it, and the update's rows are gathered to the block's
 * positions (global position g takes row g - start, clamped) and written
 * where g - start is a row; the other dimensions are updated as the
 * kernel would, locally.  Each device so writes just the part of the box
 * it holds: the unsharded result's bits, the operand never gathered
 * (GSPMD partitions dynamic-update-slice the same way). */
static Value *run_masked_update(const PartPlan *pp, const PlanEqn *e, const PartEqn *pe,
                                Value **ops) {
  AVal ob, ua;
  if (prim_value_aval(ops[0], &ob) < 0 || prim_value_aval(ops[1], &ua) < 0) return NULL;
  int nd = ob.ndim;
  Value *u = val_incref(ops[1]), *mask = NULL, *start[SHM_MAXDIM] = {0};
  bool ok = true;
  for (int d = 0; d < nd && ok; d++) {
    if (!pe->want[0].nsplit[d] || pe->want[1].nsplit[d]) {   /* the kernel's own start */
      AVal sa;
      ok = prim_value_aval(ops[2 + d], &sa) == 0;
      start[d] = !ok ? NULL : pe->want[0].nsplit[d] ? scalar(sa.dtype, 0) : val_incref(ops[2 + d]);
      ok = ok && start[d];
      continue;
    }
    AVal sa;
    int64_t count = 1, blk = ob.shape[d], len = ua.shape[d];
    ok = prim_value_aval(ops[2 + d], &sa) == 0;
    Value *off = ok ? block_start(pp, &pe->want[0], d, blk, sa.dtype, &count) : NULL;
    Params q;
    params_init(&q);
    params_add(&q, "dtype", dtype_value(sa.dtype));
    params_add(&q, "shape", val_int_tuple(1, &blk));
    params_add(&q, "dimension", val_int(0));
    Value *io = off ? prim_bind(P_IOTA, 0, NULL, &q) : NULL;
    params_clear(&q);
    Value *c0 = scalar(sa.dtype, 0), *c_len = scalar(sa.dtype, (double)len),
          *c_top = scalar(sa.dtype, (double)(blk * count - len)),
          *c_last = scalar(sa.dtype, (double)(len - 1));
    Params none;
    params_init(&none);
    Value *in3[3] = {c0, ops[2 + d], c_top};
    Value *s = io ? prim_bind(P_CLAMP, 3, in3, &none) : NULL;   /* the kernel's clamp */
    Value *gpos = s ? ops_binary(OP_ADD, io, off) : NULL;
    Value *rel = gpos ? ops_binary(OP_SUB, gpos, s) : NULL;
    Value *ge = rel ? ops_compare(OP_GE, rel, c0) : NULL;
    Value *lt = ge ? ops_compare(OP_LT, rel, c_len) : NULL;
    Value *valid = lt ? ops_binary(OP_BITAND, ge, lt) : NULL;
    Value *in3b[3] = {c0, rel, c_last};
    Value *row = valid ? prim_bind(P_CLAMP, 3, in3b, &none) : NULL;
    Value *g = NULL;
    if (row) {
      Value *in2[2] = {u, row};
      params_init(&q);
      params_add(&q, "axis", val_int(d));
      g = prim_bind(P_GATHER, 2, in2, &q);
      params_clear(&q);
    }
    int64_t vs[SHM_MAXDIM];
    for (int i = 0; i < nd; i++) vs[i] = i == d ? blk : 1;
    Value *vr = g ? ops_reshape(valid, nd, vs) : NULL;
    Value *m = !vr ? NULL : mask ? ops_binary(OP_BITAND, mask, vr) : val_incref(vr);
    val_decref(mask);
    mask = m;
    val_decref(u);
    u = g;
    start[d] = scalar(sa.dtype, 0);
    ok = mask && u && start[d];
    val_decref(io); val_decref(c0); val_decref(c_len); val_decref(c_top);
    val_decref(c_last); val_decref(s); val_decref(off);
    val_decref(gpos); val_decref(rel); val_decref(ge); val_decref(lt); val_decref(valid);
    val_decref(row); val_decref(vr);
  }
  Value *r = NULL;
  AVal na;
  if (ok && mask && u && prim_value_aval(u, &na) == 0) {
    Value *in[SHM_MAXDIM + 2] = {ops[0], NULL};
    for (int d = 0; d < nd; d++) in[1 + d] = start[d];
    Params q;
    params_init(&q);
    params_add(&q, "slice_sizes", val_int_tuple(nd, na.shape));
    Value *cur = prim_bind(P_DYNAMIC_SLICE, nd + 1, in, &q);   /* the block's part of the box */
    params_clear(&q);
    Value *mb = cur ? ops_broadcast_to(mask, nd, na.shape) : NULL;
    Value *nw = mb ? ops_select(mb, u, cur) : NULL;
    if (nw) {
      Value *in2[SHM_MAXDIM + 2] = {ops[0], nw};
      for (int d = 0; d < nd; d++) in2[2 + d] = start[d];
      params_init(&q);
      r = prim_bind(P_DYNAMIC_UPDATE_SLICE, nd + 2, in2, &q);
      params_clear(&q);
    }
    val_decref(cur); val_decref(mb); val_decref(nw);
  }
  for (int d = 0; d < nd; d++) val_decref(start[d]);
  val_decref(u);
  val_decref(mask);
  return r;
}

/* Equation [k] on this device's blocks in [env], annotating [bp]. */
static int run_eqn(const PartPlan *pp, int k, Env *env, Plan *bp) {
  int n0 = bp ? bp->neqn : 0;
  const PlanEqn *e = &pp->p->eqns[k];
  const PartEqn *pe = &pp->eqns[k];
  Value *stack[8], **ops = e->nin <= 8 ? stack : shm_calloc((size_t)e->nin, sizeof(Value *));
  if (!ops) return err_nomem(), -1;
  int made = 0;
  for (; made < e->nin; made++) {
    const PlanAtom *a = &e->in[made];
    if (a->var >= 0) ops[made] = var_as(pp, env, a->var, &pe->want[made]);
    else {
      Sharding have = pe->want[made];
      for (int d = 0; d < have.ndim; d++) have.nsplit[d] = 0;
      ops[made] = reshard(pp, a->lit, &have, &pe->want[made]);
    }
    if (!ops[made]) break;
  }
  Value *res = NULL;
  const HigherRules *h = higher_rules(e->prim);
  int taken = taken_axis(e, pe);
  note_after(bp, n0, pp->notes[k]);
  if (made == e->nin) {
    if ((pe->manual || e->prim == P_PJIT) && pe->nsubs) {   /* partitioned along its automatic axes, or a jit's body */
      CallArgs ca = {.nargs = e->nin, .args = ops};
      res = body_call(&pe->subs[0]->base.hdr, &ca);
    } else if (pe->manual) res = run_body(pp, AS_PLAN(params_get(&e->params, "jaxpr")), ops);
    else if (pe->nsubs) res = run_control(e, pe, ops);
    else if (e->prim == P_DEBUG_CALLBACK) res = run_callback(e, ops);
    else if (taken >= 0) res = masked_take(pp, e, pe, taken, ops);
    else if (masked_update(e, pe)) res = run_masked_update(pp, e, pe, ops);
    else if (h && h->eval) res = h->eval(e, ops);
    else res = prim_bind(e->prim, e->nin, ops, pe->local ? &pe->params : &e->params);
  }
  for (int i = 0; i < made; i++) val_decref(ops[i]);
  if (ops != stack) shm_free(ops);
  if (res && pe->sliced) {   /* the whole result, sliced to its type */
    Sharding whole = pe->out;
    for (int d = 0; d < whole.ndim; d++) whole.nsplit[d] = 0;
    Value *b = reshard(pp, res, &whole, &pe->out);
    val_decref(res);
    res = b;
  }
  if (!res) return -1;
  bool tup = e->nout != 1 || pe->manual || (h && h->eval && h->eval_tuple);
  for (int j = 0; j < e->nout; j++) env->v[e->out[j]] = val_incref(tup ? tuple_get(res, (size_t)j) : res);
  val_decref(res);
  return 0;
}

/* The shard_map's body: the plan on this device's blocks [a->args], a
 * tuple of its results' blocks laid out as pp->outs. */
static Value *body_call(Value *self, const CallArgs *a) {
  const PartPlan *pp = (const PartPlan *)self;
  const Plan *p = pp->p;
  if (a->nkw || a->nargs != p->nin)
    return err_set(ERR_TYPE, "partitioned %s: %d arguments for %d inputs", p->name ? p->name : "jit",
                   a->nargs, p->nin);
  Env env = {shm_calloc((size_t)p->nvars + 1, sizeof(Value *)),
             shm_calloc((size_t)p->nvars + 1, sizeof(Value *)),
             shm_calloc((size_t)p->nvars + 1, sizeof(Sharding))};
  Value *r = NULL;
  if (!env.v || !env.alt || !env.alt_sh) goto out;
  Loc saved = eval_current_loc();
  Trace *t = pp->annotate && prim_tracing() ? trace_current() : NULL;
  Plan *bp = t ? trace_plan(t) : NULL;
  for (int i = 0; i < p->nconst; i++) env.v[p->constvars[i]] = val_incref(p->consts[i]);
  for (int i = 0; i < p->nin; i++) env.v[p->invars[i]] = val_incref(a->args[i]);
  int k = 0;
  for (; k < p->neqn; k++) {
    eval_set_current_loc(p->eqns[k].loc);
    if (run_eqn(pp, k, &env, bp) < 0) break;
  }
  int n0 = bp ? bp->neqn : 0;
  if (k == p->neqn) r = tuple_new((size_t)p->nout);
  for (int i = 0; r && i < p->nout; i++) {
    const PlanAtom *o = &p->outs[i];
    Value *v;
    if (o->var >= 0) {
      v = var_as(pp, &env, o->var, &pp->outs[i]);
    } else {
      Sharding have = pp->outs[i];
      for (int d = 0; d < have.ndim; d++) have.nsplit[d] = 0;
      v = reshard(pp, o->lit, &have, &pp->outs[i]);
    }
    if (!v) {
      val_decref(r);
      r = NULL;
      break;
    }
    tuple_set_steal(r, (size_t)i, v);
  }
  note_after(bp, n0, pp->notes[p->neqn]);
  eval_set_current_loc(saved);
out:
  for (int i = 0; i < p->nvars; i++) {
    if (env.v && env.v[i]) val_decref(env.v[i]);
    if (env.alt && env.alt[i]) val_decref(env.alt[i]);
  }
  shm_free(env.v);
  shm_free(env.alt);
  shm_free(env.alt_sh);
  return r ? r : err_occurred() ? NULL : err_nomem();
}

/* A tuple of each layout's PartitionSpec. */
static Value *specs(const PartPlan *pp, const Sharding *s, int n) {
  Value *t = tuple_new((size_t)n);
  for (int i = 0; t && i < n; i++) {
    Value *ns = sharding_from_rule_spec(pp->mesh, &s[i]);
    if (!ns) {
      for (int k = i; k < n; k++) tuple_set_steal(t, (size_t)k, val_incref(VAL_NONE));
      val_decref(t);
      return NULL;
    }
    tuple_set_steal(t, (size_t)i, val_incref(&((NamedSharding *)ns)->spec->hdr));
    val_decref(ns);
  }
  return t;
}

Value *part_shard_fn(PartPlan *pp) {
  const Plan *p = pp->p;
  Sharding *ins = shm_calloc((size_t)p->nin + 1, sizeof(Sharding));
  if (!ins) return err_nomem();
  for (int i = 0; i < p->nin; i++) ins[i] = pp->vars[p->invars[i]];
  Value *in_specs = specs(pp, ins, p->nin), *out_specs = specs(pp, pp->outs, p->nout);
  shm_free(ins);
  const char *name = p->name ? p->name : "jit";
  Value *body = in_specs && out_specs ? bound_new(name, body_call, &pp->base.hdr) : NULL;
  /* unchecked: the layouts say what varies, and a shard_map inside
   * (check_vma=False) may return blocks the static check cannot see are
   * equal */
  Value *r = body ? shardmap_new(name, body, &pp->mesh->hdr, in_specs, out_specs, false) : NULL;
  if (r) ((ShardFn *)r)->local_results = true;
  if (body) val_decref(body);
  if (in_specs) val_decref(in_specs);
  if (out_specs) val_decref(out_specs);
  return r;
}
