/*
 * partition.c - sharding propagation over a plan (partition.h).
 */
#include <string.h>

#include "base/intern.h"
#include "base/mem.h"
#include "base/strbuf.h"
#include "lang/builtins.h"
#include "spmd/shardmap.h"
#include "transform/aot.h"
#include "transform/partition.h"

/* The pass's state: the plan being laid out and each equation's notes. */
typedef struct Part {
  PartPlan *pp;
  StrBuf *notes;    /* owned, p->neqn + 1: operand reshards, then the outputs' */
  const Sharding *hint;   /* p->nvars: the layout a broadcast scalar is made in */
  const bool *hinted;     /* which have one (NULL: none; free_hints) */
} Part;

/* [s] replicated at rank [ndim] over [m]. */
static void replicated(const Mesh *m, int ndim, Sharding *s) {
  memset(s, 0, sizeof *s);
  s->ndim = ndim;
  s->naxes = m->naxes;
  for (int i = 0; i < s->naxes; i++) s->axis_sizes[i] = m->axis_sizes[i];
  sharding_rule_mesh(m, s);
}

static void atom_sharding(const PartPlan *pp, const PlanAtom *a, Sharding *s) {
  AVal av;
  plan_atom_aval(pp->p, a, &av);
  if (a->var >= 0) *s = pp->vars[a->var];
  else replicated(pp->mesh, av.ndim, s);
}

/* Writes the mesh axes of [bits] as "'x', 'y'". */
static void put_axes(StrBuf *b, const Mesh *m, uint32_t bits) {
  bool first = true;
  for (int i = 0; i < m->naxes; i++)
    if (bits >> i & 1) {
      sbuf_printf(b, "%s'%s'", first ? "" : ", ", m->axis_names[i]);
      first = false;
    }
}

static uint32_t axes_bits(const Sharding *s, int d, int from) {
  uint32_t u = 0;
  for (int k = from; k < s->nsplit[d]; k++) u |= 1u << s->split[d][k];
  return u;
}

void part_dim_steps(const Sharding *have, const Sharding *want, int d, bool *gather, int *from) {
  int h = have->nsplit[d], w = want->nsplit[d];
  bool prefix = h <= w;
  for (int k = 0; prefix && k < h; k++) prefix = have->split[d][k] == want->split[d][k];
  *gather = !prefix;
  *from = prefix ? h : 0;
}

int part_moves(const Sharding *have, const Sharding *want, int d1) {
  int h = have->nsplit[d1];
  if (!h || want->nsplit[d1]) return -1;
  for (int d2 = 0; d2 < have->ndim; d2++) {
    int h2 = have->nsplit[d2];
    if (d2 == d1 || want->nsplit[d2] != h2 + h) continue;
    bool ok = true;
    for (int k = 0; ok && k < h2; k++) ok = have->split[d2][k] == want->split[d2][k];
    for (int k = 0; ok && k < h; k++) ok = have->split[d1][k] == want->split[d2][h2 + k];
    if (ok) return d2;
  }
  return -1;
}

/* Notes the resharding of a value laid out as [have] to [want]: the
 * all_to_all, all_gather and local slices partition_run.c performs. */
static void note_reshard(Part *pt, StrBuf *b, const char *where, const Sharding *have,
                         const Sharding *want, const char *what) {
  uint32_t gone = 0, come = 0, moved = 0, dims = 0;
  for (int d = 0; d < have->ndim; d++) {
    int d2 = part_moves(have, want, d);
    if (d2 >= 0 && !(dims >> d2 & 1)) {
      moved |= axes_bits(have, d, 0);
      dims |= 1u << d | 1u << d2;
    }
  }
  for (int d = 0; d < have->ndim; d++) {
    if (dims >> d & 1) continue;
    bool gather;
    int from;
    part_dim_steps(have, want, d, &gather, &from);
    if (gather) gone |= axes_bits(have, d, 0);
    come |= axes_bits(want, d, from);
  }
  const Mesh *m = pt->pp->mesh;
  if (moved) {
    sbuf_printf(b, "# %s: all_to_all over ", where);
    put_axes(b, m, moved);
    sbuf_printf(b, ": %s\n", what);
  }
  if (!gone && !come) return;
  sbuf_printf(b, "# %s: ", where);
  if (gone) {
    sbuf_puts(b, "all_gather over ");
    put_axes(b, m, gone);
  }
  if (come) {
    sbuf_puts(b, gone ? ", then a local slice over " : "local slice over ");
    put_axes(b, m, come);
  }
  sbuf_printf(b, ": %s\n", what);
}

/* [spec] (a PSpec, borrowed) over the plan's mesh as a layout of rank [ndim]. */
static void spec_layout(const PartPlan *pp, Value *spec, int ndim, Sharding *out) {
  NamedSharding ns = {.mesh = pp->mesh, .spec = (PSpec *)spec, .device = -1};
  sharding_to_rule(&ns, ndim, out);
}

static PartPlan *plan_layouts(Plan *p, Mesh *mesh, const Sharding *in, const Sharding *want,
                              const bool *wanted, const char *why);

/* The mesh axes (bits) a partial-manual shard_map equation [e] leaves
 * automatic: those its manual_axes parameter does not name (0 when it
 * has none: manual over every axis). */
static uint32_t eqn_auto_axes(const PlanEqn *e, const Mesh *m) {
  Value *ma = params_get(&e->params, "manual_axes");
  if (!ma || ma->type != V_TUPLE) return 0;
  uint32_t manual = 0;
  for (size_t i = 0; i < tuple_len(ma); i++) {
    Value *n = tuple_get(ma, i);
    int a = n->type == V_STR ? mesh_axis(m, intern_cstr(str_cstr(n))) : -1;
    if (a >= 0) manual |= 1u << a;
  }
  return ((m->naxes >= 32 ? ~0u : (1u << m->naxes) - 1)) & ~manual;
}

/* [s]'s splits over the mesh axes [bits] only, in [*out] (not partial). */
static void only_axes(const Sharding *s, uint32_t bits, Sharding *out) {
  *out = *s;
  out->partial = 0;
  out->partial_coll = NULL;
  for (int d = 0; d < s->ndim; d++) {
    int n = 0;
    for (int k = 0; k < s->nsplit[d]; k++)
      if (bits >> s->split[d][k] & 1) out->split[d][n++] = s->split[d][k];
    out->nsplit[d] = (uint8_t)n;
  }
}

/* [*s] (a layout over manual axes) with [add]'s splits appended, minor,
 * on each dimension: a block of the manual block split further. */
static void append_axes(Sharding *s, const Sharding *add) {
  for (int d = 0; d < s->ndim && d < add->ndim; d++)
    for (int k = 0; k < add->nsplit[d] && s->nsplit[d] < SHARDING_MAX_AXES; k++)
      s->split[d][s->nsplit[d]++] = add->split[d][k];
}

/* A partial-manual shard_map (axis_names=) partitioned along its automatic
 * axes [autos]: each operand keeps the automatic axes it is split over
 * (after its in_spec's manual ones, minor), the body is partitioned over
 * them from those layouts as a jit on the manual block would be (its
 * collectives over the automatic axes run among the devices of one
 * manual group), and each result is laid out as its out_spec over the
 * manual axes followed by the body's result layout over the automatic
 * ones.  0, or -1 with the error. */
static int part_auto_body(Part *pt, int k, const Sharding *have, uint32_t autos) {
  PartPlan *pp = pt->pp;
  PlanEqn *e = &pp->p->eqns[k];
  PartEqn *pe = &pp->eqns[k];
  Value *body = params_get(&e->params, "jaxpr");
  if (!body || !IS_PLAN(body)) return err_set(ERR_VALUE, "shard_map equation without its body"), -1;
  Plan *bp = AS_PLAN(body);
  Sharding *in = shm_calloc((size_t)e->nin + 1, sizeof(Sharding));
  if (!in) return err_nomem(), -1;
  for (int i = 0; i < e->nin; i++) {
    only_axes(&have[i], autos, &in[i]);
    const AVal *b = &bp->vars[bp->invars[i]];
    in[i].ndim = b->ndim;
    for (int d = 0; d < b->ndim; d++) {   /* the block must divide evenly */
      int64_t n = 1;
      for (int q = 0; q < in[i].nsplit[d]; q++) n *= in[i].axis_sizes[in[i].split[d][q]];
      if (b->shape[d] % n) in[i].nsplit[d] = 0;
    }
    in[i].explicit_axes = 0;   /* the body's layouts along automatic axes are Auto */
    append_axes(&pe->want[i], &in[i]);
  }
  pe->subs = shm_calloc(1, sizeof(PartPlan *));
  PartPlan *s = pe->subs ? plan_layouts(bp, pp->mesh, in, NULL, NULL, NULL) : NULL;
  shm_free(in);
  if (!s) return pe->subs ? -1 : (err_nomem(), -1);
  pe->subs[pe->nsubs++] = s;
  for (int j = 0; j < e->nout; j++) {
    Sharding o;
    only_axes(&s->outs[j], autos, &o);
    append_axes(&pp->vars[e->out[j]], &o);
  }
  return 0;
}

int part_vma_error(const Mesh *m, const PlanEqn *e, const Plan *body, const PSpec *spec, int k,
                   int a) {
  VmaWhy *why = shm_calloc((size_t)body->nvars + 1, sizeof(VmaWhy)), w = {0};
  if (why) plan_vma_whys(body, why);   /* out of memory: the message unexplained */
  if (why && body->outs[k].var >= 0) w = why[body->outs[k].var];
  shm_free(why);
  Value *ins = params_get(&e->params, "in_specs");
  const PSpec *arg_spec = NULL;
  const char *label = NULL;
  char buf[64];
  int i = w.arg - 1;
  if (w.arg && ins && ins->type == V_TUPLE && (size_t)i < tuple_len(ins)) {
    arg_spec = (const PSpec *)tuple_get(ins, (size_t)i);
    if (body->in_labels && (size_t)i < tuple_len(body->in_labels)) {
      label = str_cstr(tuple_get(body->in_labels, (size_t)i));
    } else {
      snprintf(buf, sizeof buf, "argument %d", i);
      label = buf;
    }
  }
  return shardmap_vma_error(m, spec, k, a, w, label, arg_spec, body->ret);
}

/* JAX's check of a shard_map equation [e] with check_rep over its manual
 * axes (the mesh's less [autos]): a body result may vary only along
 * axes its out_spec names, from the body's traced types.  Made when the
 * plan is partitioned, as JAX makes it when tracing; the devices' own
 * check (shardmap.c) does not run for a body run in place.  0, or -1
 * with the ValueError. */
static int manual_check_vma(const PartPlan *pp, const PlanEqn *e, uint32_t autos) {
  Value *cr = params_get(&e->params, "check_rep"), *os = params_get(&e->params, "out_specs");
  Value *b = params_get(&e->params, "jaxpr");
  if (!cr || !IS_ARRAY(cr) || !arr_get_i64(AS_ARRAY(cr), 0) || !b || !IS_PLAN(b)) return 0;
  const Plan *body = AS_PLAN(b);
  const Mesh *m = pp->mesh;
  for (int k = 0; k < body->nout && k < (int)tuple_len(os); k++) {
    AVal av;
    plan_atom_aval(body, &body->outs[k], &av);
    const PSpec *spec = (const PSpec *)tuple_get(os, (size_t)k);
    uint32_t named = 0;
    for (int d = 0; d < spec->n; d++)
      for (int q = 0; q < spec->e[d].nnames; q++) named |= 1u << mesh_axis(m, spec->e[d].names[q]);
    uint32_t bad = av.vma & ~autos & ~named;
    for (int a = 0; bad && a < m->naxes; a++)
      if (bad >> a & 1)
        return part_vma_error(m, e, body, spec, k, a);
  }
  return 0;
}

/* A shard_map equation (Manual inside Auto, shmap(7)): over the plan's
 * mesh its operands are resharded to its in_specs and its body runs on
 * the blocks in place, its results laid out as its out_specs say (a
 * partial-manual one's body partitioned along its automatic axes:
 * part_auto_body); over another mesh it cannot run inside this one.  0,
 * or -1 with the error. */
static int part_manual(Part *pt, int k, const Sharding *have) {
  PartPlan *pp = pt->pp;
  PlanEqn *e = &pp->p->eqns[k];
  PartEqn *pe = &pp->eqns[k];
  Value *m = params_get(&e->params, "mesh"), *is = params_get(&e->params, "in_specs"),
        *os = params_get(&e->params, "out_specs");
  if (!m || m->type != V_MESH || !mesh_same((Mesh *)m, pp->mesh))
    return err_set(ERR_NOT_IMPLEMENTED, "a shard_map over another mesh inside a jit partitioned "
                   "over %s: use one mesh for both", pp->mesh->name ? pp->mesh->name : "its "
                   "arguments' mesh"), -1;
  if (!is || is->type != V_TUPLE || tuple_len(is) != (size_t)e->nin || !os ||
      os->type != V_TUPLE || tuple_len(os) != (size_t)e->nout)
    return err_set(ERR_VALUE, "shard_map equation without its specs"), -1;
  char where[32];
  snprintf(where, sizeof where, "line %d", e->loc.line);
  uint32_t autos = eqn_auto_axes(e, pp->mesh);
  if (manual_check_vma(pp, e, autos) < 0) return -1;
  for (int i = 0; i < e->nin; i++)
    spec_layout(pp, tuple_get(is, (size_t)i), have[i].ndim, &pe->want[i]);
  for (int j = 0; j < e->nout; j++)
    spec_layout(pp, tuple_get(os, (size_t)j), pp->p->vars[e->out[j]].ndim, &pp->vars[e->out[j]]);
  if (autos && part_auto_body(pt, k, have, autos) < 0) return -1;
  for (int i = 0; i < e->nin; i++)
    note_reshard(pt, &pt->notes[k], where, &have[i], &pe->want[i], "shard_map's in_specs");
  pe->manual = true;
  return 0;
}

/* Whether [e] is linear in exactly its operands [mask] (bits), so a
 * partial sum in them passes through to its result and one psum after it
 * completes both (GSPMD's order: the sum of a contraction's partial
 * results reduced first, then summed over the devices). */
static bool carries_partial(const PartPlan *pp, const PlanEqn *e, uint32_t mask) {
  switch (e->prim) {
  case P_NEG: case P_REDUCE_SUM: case P_TRANSPOSE: case P_RESHAPE: case P_SQUEEZE:
  case P_EXPAND_DIMS: case P_BROADCAST_IN_DIM: case P_COPY: case P_SLICE: case P_REV:
  case P_CUMSUM: case P_DIV:
    return mask == 1;
  case P_CONVERT_ELEMENT_TYPE: {
    AVal a;
    plan_atom_aval(pp->p, &e->in[0], &a);
    return mask == 1 && dt_is_float(a.dtype) && dt_is_float(pp->p->vars[e->out[0]].dtype);
  }
  case P_MUL: case P_DOT_GENERAL:
    return mask == 1 || mask == 2;
  case P_ADD: case P_SUB:
    return mask == 3;
  default:
    return false;
  }
}

/* Notes the completion of operand [i]'s partial sum before equation [k]. */
static void note_complete(Part *pt, StrBuf *b, const Sharding *have, int v) {
  const PartPlan *pp = pt->pp;
  const PlanEqn *o = &pp->p->eqns[pp->origin[v]];
  sbuf_printf(b, "# line %d: %s over ", o->loc.line, have->partial_coll);
  put_axes(b, pp->mesh, have->partial);
  sbuf_printf(b, ": %s %s a dimension split by ", prim_table[o->prim].name,
              strcmp(have->partial_coll, "psum") ? "reduces over" : "sums over");
  put_axes(b, pp->mesh, have->partial);
  sbuf_puts(b, "\n");
}

static PartPlan *plan_layouts(Plan *p, Mesh *mesh, const Sharding *in, const Sharding *want,
                              const bool *wanted, const char *why);

/* [s] with dimension 0 dropped (a scan's slice of its xs), or prepended
 * unsplit (its stacked ys). */
static void drop_dim0(const Sharding *s, Sharding *out) {
  *out = *s;
  out->ndim = s->ndim - 1;
  for (int d = 0; d < out->ndim; d++) {
    out->nsplit[d] = s->nsplit[d + 1];
    memcpy(out->split[d], s->split[d + 1], sizeof s->split[0]);
  }
}

static void add_dim0(const Sharding *s, Sharding *out) {
  *out = *s;
  out->ndim = s->ndim + 1;
  out->nsplit[0] = 0;
  for (int d = 0; d < s->ndim; d++) {
    out->nsplit[d + 1] = s->nsplit[d];
    memcpy(out->split[d + 1], s->split[d], sizeof s->split[0]);
  }
}

/* Sub-plan [sub] of equation [k] partitioned from the layouts [in],
 * its results resharded to [want] where [wanted] (NULL: all); appended
 * to the equation's. */
static int part_sub(Part *pt, int k, Value *sub, const Sharding *in, const Sharding *want,
                    const bool *wanted, const char *why) {
  PartEqn *pe = &pt->pp->eqns[k];
  if (!IS_PLAN(sub)) {
    err_set(ERR_VALUE, "control-flow equation without its sub-plan");
    return -1;
  }
  PartPlan *s = plan_layouts(AS_PLAN(sub), pt->pp->mesh, in, want, wanted, why);
  if (!s) return -1;
  pe->subs[pe->nsubs++] = s;
  return 0;
}

static bool same_splits(const Sharding *a, const Sharding *b, int n) {
  for (int i = 0; i < n; i++) {
    if (a[i].ndim != b[i].ndim) return false;
    for (int d = 0; d < a[i].ndim; d++)
      if (a[i].nsplit[d] != b[i].nsplit[d] ||
          memcmp(a[i].split[d], b[i].split[d], (size_t)a[i].nsplit[d]) != 0)
        return false;
  }
  return true;
}

/* A loop's carry layouts [carry] ([n] of them, at [at] among [body]'s
 * inputs [in] and from its output 0): the layouts the body gives them
 * back, from the ones they enter with, until they settle (as eager
 * iterations settle: a replicated accumulator of sharded rows becomes
 * sharded), at most a few rounds; then the body is made to give back
 * exactly those. */
static int settle_carry(Part *pt, Value *body, Sharding *in, int at, Sharding *carry, int n) {
  if (!IS_PLAN(body)) return err_set(ERR_VALUE, "loop equation without its body"), -1;
  for (int round = 0; round < 4; round++) {
    memcpy(in + at, carry, sizeof(Sharding) * (size_t)n);
    PartPlan *s = plan_layouts(AS_PLAN(body), pt->pp->mesh, in, NULL, NULL, NULL);
    if (!s) return -1;
    bool same = same_splits(s->outs, carry, n);
    if (!same) memcpy(carry, s->outs, sizeof(Sharding) * (size_t)n);
    val_decref(&s->base.hdr);
    if (same) break;
  }
  memcpy(in + at, carry, sizeof(Sharding) * (size_t)n);
  return 0;
}

/* Sub-plan [sub] partitioned alone from the layouts [in] and dropped:
 * its rules' errors raised in the order JAX traced the sub-functions (a
 * cond's true_fun before false_fun, a loop's cond_fun before body_fun)
 * before the partitioning proper.  0, or -1. */
static int check_alone(Part *pt, Value *sub, const Sharding *in) {
  if (!IS_PLAN(sub)) return err_set(ERR_VALUE, "control-flow equation without its sub-plan"), -1;
  PartPlan *s = plan_layouts(AS_PLAN(sub), pt->pp->mesh, in, NULL, NULL, NULL);
  if (!s) return -1;
  val_decref(&s->base.hdr);
  return 0;
}

/* cond, while, scan and pjit (control flow carrying shardings): the
 * operands complete, their sub-plans partitioned from the operands'
 * layouts; a cond's branches give the first branch's result layouts, a
 * loop's carries take the layouts its body settles on (settle_carry), a
 * scan's xs are unsplit along the scanned dimension and its ys stacked
 * unsplit along it, a jit's results are laid out as its body gives them.
 * 0, or -1. */
static int part_control(Part *pt, int k, const AVal *av) {
  PartPlan *pp = pt->pp;
  PlanEqn *e = &pp->p->eqns[k];
  PartEqn *pe = &pp->eqns[k];
  const Params *ps = &e->params;
  int nin = e->nin, nout = e->nout;
  Sharding *in = shm_calloc((size_t)nin + 1, sizeof(Sharding));
  Sharding *want = shm_calloc((size_t)(nin + nout) + 1, sizeof(Sharding));
  bool *wanted = shm_calloc((size_t)(nin + nout) + 1, sizeof(bool));
  pe->subs = shm_calloc(8, sizeof(PartPlan *));
  int rc = in && want && wanted && pe->subs ? 0 : (err_nomem(), -1);
  int64_t a = 0, b = 0, c = 0;
  if (rc == 0 && e->prim == P_COND) {
    Value *br = params_get(ps, "branches");
    size_t nb = br && br->type == V_TUPLE ? tuple_len(br) : 0;
    replicated(pp->mesh, av[0].ndim, &pe->want[0]);
    if (nb == 0 || nb > 8) {
      err_set(ERR_VALUE, "cond equation without its branches (or more than 8)");
      rc = -1;
    }
    if (rc == 0 && e->true_first && nb == 2)   /* JAX traced true_fun first */
      rc = check_alone(pt, tuple_get(br, 1), pe->want + 1);
    for (size_t i = 0; rc == 0 && i < nb; i++)
      rc = part_sub(pt, k, tuple_get(br, i), pe->want + 1, i ? pe->subs[0]->outs : NULL, NULL,
                    "cond's branches give the first branch's layouts");
    for (int j = 0; rc == 0 && j < nout; j++) pp->vars[e->out[j]] = pe->subs[0]->outs[j];
  } else if (rc == 0 && e->prim == P_WHILE) {
    rc = params_int(ps, "cond_nconsts", &a) < 0 || params_int(ps, "body_nconsts", &b) < 0 ? -1 : 0;
    int nc = nin - (int)a - (int)b;
    Sharding *carry = pe->want + a + b;
    memcpy(in, pe->want + a, sizeof(Sharding) * (size_t)(b + nc));
    /* JAX traces cond_fun first, on the carry as it enters */
    Sharding *cin0 = shm_calloc((size_t)(a + nc) + 1, sizeof(Sharding));
    if (rc == 0 && !cin0) rc = (err_nomem(), -1);
    if (rc == 0) {
      memcpy(cin0, pe->want, sizeof(Sharding) * (size_t)a);
      memcpy(cin0 + a, carry, sizeof(Sharding) * (size_t)nc);
      rc = check_alone(pt, params_get(ps, "cond_jaxpr"), cin0);
    }
    shm_free(cin0);
    if (rc == 0) rc = settle_carry(pt, params_get(ps, "body_jaxpr"), in, (int)b, carry, nc);
    /* cond (subs[0]): its consts and the carry, to a replicated predicate */
    Sharding *cin = shm_calloc((size_t)(a + nc) + 1, sizeof(Sharding));
    if (rc == 0 && !cin) rc = (err_nomem(), -1);
    if (rc == 0) {
      memcpy(cin, pe->want, sizeof(Sharding) * (size_t)a);
      memcpy(cin + a, carry, sizeof(Sharding) * (size_t)nc);
      replicated(pp->mesh, 0, &want[0]);
      rc = part_sub(pt, k, params_get(ps, "cond_jaxpr"), cin, want, NULL, "the predicate");
    }
    shm_free(cin);
    /* body (subs[1]): its consts and the carry, to the carry's layouts */
    if (rc == 0)
      rc = part_sub(pt, k, params_get(ps, "body_jaxpr"), in, carry, NULL, "a loop's carry keeps its layout");
    for (int j = 0; rc == 0 && j < nout; j++) pp->vars[e->out[j]] = carry[j];
  } else if (rc == 0 && e->prim == P_PJIT) {
    /* a jit inside: its body partitioned from the operands' layouts, run
     * in place (as JAX propagates through the inner jaxpr), so a
     * sharding constraint in it lays the results out as eagerly */
    rc = part_sub(pt, k, params_get(ps, "jaxpr"), pe->want, NULL, NULL, NULL);
    for (int j = 0; rc == 0 && j < nout; j++) pp->vars[e->out[j]] = pe->subs[0]->outs[j];
  } else if (rc == 0 && e->prim == P_SCAN) {
    rc = params_int(ps, "num_consts", &a) < 0 || params_int(ps, "num_carry", &c) < 0 ? -1 : 0;
    int nx = nin - (int)a - (int)c;
    for (int i = (int)(a + c); rc == 0 && i < nin; i++) pe->want[i].nsplit[0] = 0;
    memcpy(in, pe->want, sizeof(Sharding) * (size_t)(a + c));
    for (int i = 0; rc == 0 && i < nx; i++) drop_dim0(&pe->want[a + c + i], &in[a + c + i]);
    if (rc == 0) rc = settle_carry(pt, params_get(ps, "jaxpr"), in, (int)a, pe->want + a, (int)c);
    for (int j = 0; j < nout; j++) wanted[j] = j < c;
    if (rc == 0)
      rc = part_sub(pt, k, params_get(ps, "jaxpr"), in, pe->want + a, wanted,
                    "a loop's carry keeps its layout");
    for (int j = 0; rc == 0 && j < nout; j++) {
      if (j < c) pp->vars[e->out[j]] = pe->want[a + j];
      else add_dim0(&pe->subs[0]->outs[j], &pp->vars[e->out[j]]);
    }
  }
  shm_free(in);
  shm_free(want);
  shm_free(wanted);
  return rc;
}

/* One equation: its operands' layouts, its results', its notes. */
/* Broadcast-of-a-scalar equation [k] made directly in the layout
 * free_hints chose for it: each device fills its block (the shape
 * parameter the block's), no communication.  0, or -1 on out of
 * memory. */
static int hinted_broadcast(Part *pt, int k) {
  PartPlan *pp = pt->pp;
  PlanEqn *e = &pp->p->eqns[k];
  PartEqn *pe = &pp->eqns[k];
  int v = e->out[0];
  const Sharding *h = &pt->hint[v];
  int64_t blk[SHM_MAXDIM];
  const AVal *o = &pp->p->vars[v];
  for (int d = 0; d < o->ndim; d++) {
    int64_t n = 1;
    for (int q = 0; q < h->nsplit[d]; q++) n *= h->axis_sizes[h->split[d][q]];
    blk[d] = o->shape[d] / n;
  }
  replicated(pp->mesh, 0, &pe->want[0]);
  pe->out = *h;
  params_init(&pe->params);
  for (int i = 0; i < e->params.n; i++) {
    const char *n = e->params.p[i].name;
    params_add(&pe->params, n, !strcmp(n, "shape") ? val_int_tuple(o->ndim, blk)
                                                   : val_incref(e->params.p[i].value));
  }
  if (pe->params.nomem) return err_nomem(), -1;
  pe->local = true;
  pp->vars[v] = *h;
  pp->origin[v] = k;
  return 0;
}

static int part_eqn(Part *pt, int k) {
  PartPlan *pp = pt->pp;
  PlanEqn *e = &pp->p->eqns[k];
  PartEqn *pe = &pp->eqns[k];
  const PrimInfo *pi = &prim_table[e->prim];
  int nin = e->nin;
  char where_ctl[32];
  Sharding *have = shm_calloc((size_t)nin + 1, sizeof(Sharding));
  AVal *av = shm_calloc((size_t)nin + 1, sizeof(AVal));
  pe->want = shm_calloc((size_t)nin + 1, sizeof(Sharding));
  if (!have || !av || !pe->want) {
    shm_free(have);
    shm_free(av);
    err_nomem();
    return -1;
  }
  uint32_t pmask = 0, pbits = 0;
  const char *pcoll = NULL;
  bool carry = true;
  for (int i = 0; i < nin; i++) {
    plan_atom_aval(pp->p, &e->in[i], &av[i]);
    atom_sharding(pp, &e->in[i], &have[i]);
    pe->want[i] = have[i];
    pe->want[i].partial = 0;
    pe->want[i].partial_coll = NULL;
    if (!have[i].partial) continue;
    carry &= !pmask || (have[i].partial == pbits && !strcmp(have[i].partial_coll, pcoll));
    pmask |= 1u << i;
    pbits = have[i].partial;
    pcoll = have[i].partial_coll;
  }
  carry = carry && pmask && !strcmp(pcoll, "psum") && e->nout == 1 && carries_partial(pp, e, pmask);
  if (e->prim == P_SHARD_MAP || e->prim == P_COND || e->prim == P_WHILE || e->prim == P_SCAN ||
      (e->prim == P_PJIT && IS_PLAN(params_get(&e->params, "jaxpr")))) {
    int rc = e->prim == P_SHARD_MAP ? part_manual(pt, k, have) : part_control(pt, k, av);
    snprintf(where_ctl, sizeof where_ctl, "line %d", e->loc.line);
    for (int i = 0; rc == 0 && e->prim != P_SHARD_MAP && i < nin; i++) {
      if (have[i].partial) note_complete(pt, &pt->notes[k], &have[i], e->in[i].var);
      note_reshard(pt, &pt->notes[k], where_ctl, &have[i], &pe->want[i], "control flow's operand");
    }
    shm_free(have);
    shm_free(av);
    return rc;
  }
  if (e->prim == P_BROADCAST_IN_DIM && e->nout == 1 && pt->hinted && pt->hinted[e->out[0]] &&
      av[0].ndim == 0 && !have[0].partial) {
    int rc = hinted_broadcast(pt, k);
    shm_free(have);
    shm_free(av);
    return rc;
  }
  int ruled = 0;
  replicated(pp->mesh, e->nout ? pp->p->vars[e->out[0]].ndim : 0, &pe->out);
  for (int i = 0; i < nin; i++) pe->want[i].explicit_axes &= ~e->auto_axes;   /* auto_axes' */
  params_init(&pe->params);
  Sharding outs[PRIM_MAX_OUTS];   /* each result's (several: the factorisations) */
  AVal oav[PRIM_MAX_OUTS];
  if (e->nout >= 1 && e->nout <= PRIM_MAX_OUTS) {
    for (int j = 0; j < e->nout; j++) {
      oav[j] = pp->p->vars[e->out[j]];
      replicated(pp->mesh, oav[j].ndim, &outs[j]);
    }
    ruled = prim_sharding(e->prim, av, pe->want, nin, &e->params, oav, e->nout, outs, &pe->params,
                          &pe->local);
    pe->out = outs[0];
  }
  if (ruled < 0) {   /* a rule's error (Explicit mode's) points at the equation's source */
    if (e->loc.src) err_locate(e->loc);
    shm_free(have);
    shm_free(av);
    return -1;
  }
  if (!ruled)
    for (int i = 0; i < nin; i++) replicated(pp->mesh, av[i].ndim, &pe->want[i]);
  /* a partial sum passes through a linear equation that computes on the
   * blocks, and is completed before any other use */
  carry = carry && ruled && (!pe->out.partial || !strcmp(pe->out.partial_coll, "psum"));
  /* ... only where no operand nor the result is split along the axes it
   * is partial over: the blocks there differ from device to device, so
   * the sum of the products is not the product of the sum (a partial
   * sum times a value split along its axis) */
  uint32_t split_axes = pe->out.partial;
  for (int d = 0; d < pe->out.ndim; d++) split_axes |= axes_bits(&pe->out, d, 0);
  for (int i = 0; i < nin; i++)
    for (int d = 0; d < pe->want[i].ndim; d++) split_axes |= axes_bits(&pe->want[i], d, 0);
  carry = carry && !(split_axes & pbits);
  int from = -1;
  for (int i = 0; carry && i < nin; i++)
    if (pmask >> i & 1) {
      pe->want[i].partial = have[i].partial;
      pe->want[i].partial_coll = have[i].partial_coll;
      if (from < 0 && e->in[i].var >= 0) from = pp->origin[e->in[i].var];
    }
  char what[160], where[32];
  snprintf(where, sizeof where, "line %d", e->loc.line);
  for (int i = 0; i < nin; i++) {
    if (have[i].partial && !pe->want[i].partial) note_complete(pt, &pt->notes[k], &have[i], e->in[i].var);
    if (ruled) snprintf(what, sizeof what, "%s's operand %d laid out as its rule needs", pi->name, i);
    else snprintf(what, sizeof what, "%s %s: its operands are replicated", pi->name,
                  pi->rules.sharding && pi->kind != PK_HIGHER ? "cannot compute on these blocks"
                                                                : "has no sharding rule");
    note_reshard(pt, &pt->notes[k], where, &have[i], &pe->want[i], what);
  }
  if (carry) {
    pe->out.partial |= pbits;
    pe->out.partial_coll = "psum";
  }
  /* not computed on the blocks, the whole result is sliced to its type */
  for (int d = 0; !ruled && e->nout == 1 && d < pe->out.ndim; d++) pe->sliced |= pe->out.nsplit[d] != 0;
  for (int j = 0; j < e->nout; j++) {
    Sharding *v = &pp->vars[e->out[j]];
    if (ruled && e->nout > 1) *v = outs[j];
    else if (ruled || pe->sliced) *v = pe->out;
    else replicated(pp->mesh, pp->p->vars[e->out[j]].ndim, v);
    pp->origin[e->out[j]] = carry && from >= 0 && !(pe->out.partial & ~pbits) ? from : k;
  }
  shm_free(have);
  shm_free(av);
  return 0;
}

/* Output [i]'s layout, resharded to [want] (NULL: as it is), for [why]. */
static void part_out(Part *pt, int i, const Sharding *want, const char *why) {
  PartPlan *pp = pt->pp;
  Sharding s;
  atom_sharding(pp, &pp->p->outs[i], &s);
  if (s.partial) note_complete(pt, &pt->notes[pp->p->neqn], &s, pp->p->outs[i].var);
  pp->outs[i] = s;
  pp->outs[i].partial = 0;
  pp->outs[i].partial_coll = NULL;
  if (!want) return;
  char where[32];
  snprintf(where, sizeof where, "output %d", i);
  pp->outs[i] = *want;
  pp->outs[i].partial = 0;
  pp->outs[i].partial_coll = NULL;
  note_reshard(pt, &pt->notes[pp->p->neqn], where, &s, &pp->outs[i], why);
}

/* The text of each of [n] notes, NULL where empty. */
static char **keep_notes(const StrBuf *b, int n) {
  char **r = shm_calloc((size_t)n + 1, sizeof(char *));
  if (!r) return err_nomem();
  for (int i = 0; i < n; i++) {
    if (!b[i].len) continue;
    if (!(r[i] = shm_malloc(b[i].len + 1))) {
      err_nomem();
      continue;
    }
    memcpy(r[i], sbuf_text(&b[i]), b[i].len + 1);
  }
  return r;
}

/* Frees what equation decision [pe] owns and zeroes it. */
static void part_eqn_clear(PartEqn *pe) {
  shm_free(pe->want);
  if (pe->local) params_clear(&pe->params);
  for (int j = 0; j < pe->nsubs; j++) val_decref(&pe->subs[j]->base.hdr);
  shm_free(pe->subs);
  memset(pe, 0, sizeof *pe);
}

static void part_plan_free(Value *self) {
  PartPlan *pp = (PartPlan *)self;
  for (int k = 0; pp->eqns && k < pp->p->neqn; k++) part_eqn_clear(&pp->eqns[k]);
  for (int i = 0; pp->notes && i <= pp->p->neqn; i++) shm_free(pp->notes[i]);
  shm_free(pp->notes);
  shm_free(pp->origin);
  shm_free(pp->eqns);
  shm_free(pp->vars);
  shm_free(pp->outs);
  val_decref(&pp->p->hdr);
  val_decref(&pp->mesh->hdr);
}

static Value *part_plan_repr(Value *self) {
  return str_from(((PartPlan *)self)->p->name ? ((PartPlan *)self)->p->name : "<partitioned plan>");
}

static const OpaqueType part_plan_type = {"PartitionedPlan", part_plan_free, part_plan_repr,
                                          NULL, NULL, NULL, NULL};

static PartPlan *part_plan_alloc(Plan *p, Mesh *mesh) {
  PartPlan *pp = shm_calloc(1, sizeof *pp);
  if (!pp) return err_nomem();
  val_init(&pp->base.hdr, V_OPAQUE);
  pp->base.ot = &part_plan_type;
  pp->p = (Plan *)val_incref(&p->hdr);
  pp->mesh = (Mesh *)val_incref(&mesh->hdr);
  pp->vars = shm_calloc((size_t)p->nvars + 1, sizeof(Sharding));
  pp->eqns = shm_calloc((size_t)p->neqn + 1, sizeof(PartEqn));
  pp->outs = shm_calloc((size_t)p->nout + 1, sizeof(Sharding));
  pp->origin = shm_calloc((size_t)p->nvars + 1, sizeof(int));
  if (!pp->vars || !pp->eqns || !pp->outs || !pp->origin) {
    val_decref(&pp->base.hdr);
    return err_nomem();
  }
  return pp;
}

/* part_plan from layouts: [in] (p->nin), [want] (p->nout, or NULL) with
 * [wanted] (which of them apply, or NULL: all). */
/* ==== layouts chosen backward: a broadcast scalar made as its use wants ==== */

enum { HINT_DEPTH = 16 };

/* What free_hints reads of the first pass: each variable's producing
 * equation (-1: an input or constant) and number of uses. */
typedef struct Uses {
  const PartPlan *pp;
  int *prod, *uses;
  Sharding *hint;
  bool *hinted;
  int found;
} Uses;

static bool unsplit(const Sharding *s) {
  for (int d = 0; d < s->ndim; d++)
    if (s->nsplit[d]) return false;
  return !s->partial;
}

/* Walks back from variable [v] (computed whole on every device, used
 * once) to a broadcast of a scalar that could be made laid out as [w]
 * instead, through element-wise steps of its shape, the operand a
 * scatter or dynamic_update_slice updates (which keep their operand's
 * split over Auto axes), each variable used once so no other use's
 * layout changes. */
static void hint_back(Uses *u, int v, const Sharding *w, int depth) {
  const PartPlan *pp = u->pp;
  if (depth > HINT_DEPTH || v < 0 || u->uses[v] != 1 || u->prod[v] < 0 || !unsplit(&pp->vars[v]))
    return;
  const PlanEqn *e = &pp->p->eqns[u->prod[v]];
  const AVal *o = &pp->p->vars[v];
  AVal a;
  if (e->prim == P_BROADCAST_IN_DIM && e->nin == 1) {
    plan_atom_aval(pp->p, &e->in[0], &a);
    for (int d = 0; d < o->ndim; d++) {
      int64_t n = 1;
      for (int q = 0; q < w->nsplit[d]; q++) n *= w->axis_sizes[w->split[d][q]];
      if (o->shape[d] % n) return;
    }
    if (a.ndim == 0 && !u->hinted[v]) {
      u->hint[v] = *w;
      u->hint[v].partial = 0;
      u->hint[v].partial_coll = NULL;
      u->hinted[v] = true;
      u->found++;
    }
    return;
  }
  if (e->prim == P_SCATTER) {   /* kept split along its axis only over axes the indices do not use */
    int64_t ax;
    Sharding ix;
    if (params_int(&e->params, "axis", &ax) < 0 || e->nin != 3) {
      err_clear();
      return;
    }
    int d = ax < 0 ? (int)ax + o->ndim : (int)ax;
    atom_sharding(pp, &e->in[1], &ix);
    uint32_t iu = 0;
    for (int q = 0; q < ix.ndim; q++) iu |= axes_bits(&ix, q, 0);
    if (d < 0 || d >= o->ndim || (axes_bits(w, d, 0) & iu)) return;
  }
  if (e->prim == P_SCATTER || e->prim == P_DYNAMIC_UPDATE_SLICE) {
    hint_back(u, e->in[0].var, w, depth + 1);
    return;
  }
  PrimKind kind = prim_table[e->prim].kind;
  if ((kind != PK_UNARY && kind != PK_BINARY) || e->nout != 1) return;
  bool same[16] = {0};
  for (int i = 0; i < e->nin && i < 16; i++) {   /* operands of its shape: all computed whole */
    plan_atom_aval(pp->p, &e->in[i], &a);
    same[i] = a.ndim == o->ndim && !memcmp(a.shape, o->shape, sizeof(int64_t) * (size_t)o->ndim);
    if (same[i] && e->in[i].var >= 0 && !unsplit(&pp->vars[e->in[i].var])) return;
  }
  for (int i = 0; i < e->nin && i < 16; i++)
    if (same[i]) hint_back(u, e->in[i].var, w, depth + 1);
}

/* After a first pass over [pp]: the broadcasts of a scalar whose value,
 * computed whole on every device, is only sliced to a split layout
 * further on (a local reshard), to be made in that layout instead (the
 * zeros a gradient scatters into, laid out as the table it updates, as
 * GSPMD's propagation lays them out).  Fills [hint] and [hinted]
 * (p->nvars each); the number found, or -1 on out of memory. */
static int free_hints(const PartPlan *pp, Sharding *hint, bool *hinted) {
  const Plan *p = pp->p;
  Uses u = {pp, shm_calloc((size_t)p->nvars + 1, sizeof(int)),
            shm_calloc((size_t)p->nvars + 1, sizeof(int)), hint, hinted, 0};
  if (!u.prod || !u.uses) {
    shm_free(u.prod);
    shm_free(u.uses);
    return err_nomem(), -1;
  }
  for (int v = 0; v < p->nvars; v++) u.prod[v] = -1;
  for (int k = 0; k < p->neqn; k++) {
    for (int j = 0; j < p->eqns[k].nout; j++) u.prod[p->eqns[k].out[j]] = k;
    for (int i = 0; i < p->eqns[k].nin; i++)
      if (p->eqns[k].in[i].var >= 0) u.uses[p->eqns[k].in[i].var]++;
  }
  for (int i = 0; i < p->nout; i++)
    if (p->outs[i].var >= 0) u.uses[p->outs[i].var]++;
  for (int k = 0; k < p->neqn; k++) {
    const PlanEqn *e = &p->eqns[k];
    const PartEqn *pe = &pp->eqns[k];
    if (pe->manual || pe->nsubs || !pe->want) continue;
    for (int i = 0; i < e->nin; i++) {
      const Sharding *w = &pe->want[i];
      uint32_t used = 0;
      for (int d = 0; d < w->ndim; d++) used |= axes_bits(w, d, 0);
      if (e->in[i].var >= 0 && used && !w->partial && !(used & w->explicit_axes))
        hint_back(&u, e->in[i].var, w, 0);
    }
  }
  shm_free(u.prod);
  shm_free(u.uses);
  return u.found;
}

static PartPlan *layouts_pass(Plan *p, Mesh *mesh, const Sharding *in, const Sharding *want,
                              const bool *wanted, const char *why, const Sharding *hint,
                              const bool *hinted);

/* The layouts pass, run again when free_hints finds broadcasts to lay
 * out as their uses want. */
static PartPlan *plan_layouts(Plan *p, Mesh *mesh, const Sharding *in, const Sharding *want,
                              const bool *wanted, const char *why) {
  PartPlan *pp = layouts_pass(p, mesh, in, want, wanted, why, NULL, NULL);
  if (!pp) return NULL;
  Sharding *hint = shm_calloc((size_t)p->nvars + 1, sizeof(Sharding));
  bool *hinted = hint ? shm_calloc((size_t)p->nvars + 1, sizeof(bool)) : NULL;
  int found = hinted ? free_hints(pp, hint, hinted) : (err_nomem(), -1);
  if (found != 0) {
    val_decref(&pp->base.hdr);
    pp = found > 0 ? layouts_pass(p, mesh, in, want, wanted, why, hint, hinted) : NULL;
  }
  shm_free(hint);
  shm_free(hinted);
  return pp;
}

static PartPlan *layouts_pass(Plan *p, Mesh *mesh, const Sharding *in, const Sharding *want,
                              const bool *wanted, const char *why, const Sharding *hint,
                              const bool *hinted) {
  PartPlan *pp = part_plan_alloc(p, mesh);
  if (!pp) return NULL;
  Part pt = {pp, shm_calloc((size_t)p->neqn + 1, sizeof(StrBuf)), hint, hinted};
  int rc = pt.notes ? 0 : (err_nomem(), -1);
  for (int v = 0; rc == 0 && v < p->nvars; v++) replicated(mesh, p->vars[v].ndim, &pp->vars[v]);
  for (int i = 0; rc == 0 && i < p->nin; i++) {
    pp->vars[p->invars[i]] = in[i];
    pp->vars[p->invars[i]].partial = 0;
    pp->vars[p->invars[i]].partial_coll = NULL;
  }
  for (int k = 0; rc == 0 && k < p->neqn; k++) rc = part_eqn(&pt, k);
  for (int i = 0; rc == 0 && i < p->nout; i++)
    part_out(&pt, i, want && (!wanted || wanted[i]) ? &want[i] : NULL, why);
  if (rc == 0 && !(pp->notes = keep_notes(pt.notes, p->neqn + 1))) rc = -1;
  for (int i = 0; pt.notes && i <= p->neqn; i++) sbuf_free(&pt.notes[i]);
  shm_free(pt.notes);
  if (rc < 0) {
    val_decref(&pp->base.hdr);
    return NULL;
  }
  return pp;
}

/* [s] (a NamedSharding, a SingleDeviceSharding, or NULL: replicated) as
 * a layout of rank [ndim] over [mesh]. */
static void layout_of(Mesh *mesh, Value *s, int ndim, Sharding *out) {
  replicated(mesh, ndim, out);
  if (s && ((NamedSharding *)s)->mesh) sharding_to_rule((NamedSharding *)s, ndim, out);
}

PartPlan *part_plan(Plan *p, Mesh *mesh, Value *const *in, Value *const *want) {
  Sharding *li = shm_calloc((size_t)p->nin + 1, sizeof(Sharding));
  Sharding *lo = shm_calloc((size_t)p->nout + 1, sizeof(Sharding));
  bool *wanted = shm_calloc((size_t)p->nout + 1, sizeof(bool));
  PartPlan *pp = NULL;
  if (li && lo && wanted) {
    for (int i = 0; i < p->nin; i++) layout_of(mesh, in[i], p->vars[p->invars[i]].ndim, &li[i]);
    for (int i = 0; want && i < p->nout; i++) {
      AVal a;
      plan_atom_aval(p, &p->outs[i], &a);
      layout_of(mesh, want[i], a.ndim, &lo[i]);
      wanted[i] = want[i] != NULL;
    }
    pp = plan_layouts(p, mesh, li, want ? lo : NULL, wanted, "out_shardings asks for it");
  } else {
    err_nomem();
  }
  shm_free(li);
  shm_free(lo);
  shm_free(wanted);
  return pp;
}

void part_plan_set_annotate(PartPlan *pp) {
  pp->annotate = true;
  for (int k = 0; k < pp->p->neqn; k++)
    for (int j = 0; j < pp->eqns[k].nsubs; j++) part_plan_set_annotate(pp->eqns[k].subs[j]);
}

Value *part_out_sharding(const PartPlan *pp, int i) {
  return sharding_from_rule(pp->mesh, &pp->outs[i]);
}

/* The NamedSharding of leaf [v] (borrowed; an array, or a
 * ShapeDtypeStruct being lowered), or NULL when unsharded. */
static Value *leaf_sharding(Value *v) {
  Value *s = IS_ARRAY(v) ? AS_ARRAY(v)->sharding : aot_is_sds(v) ? aot_sds_sharding(v) : NULL;
  return s && sharding_is(s) && ((NamedSharding *)s)->mesh ? s : NULL;
}

/* The [i]th of out_shardings [o]: itself when one sharding, else its
 * [i]th entry (NULL past its end or for a non-sharding). */
static Value *want_at(Value *o, int i) {
  size_t n;
  Value *const *items;
  if (!o) return NULL;
  if (sharding_is(o)) return o;
  if (val_seq(o, &n, &items) && (size_t)i < n && sharding_is(items[i])) return items[i];
  return NULL;
}

/* [v]'s layout (leaf_sharding) for a plan over [m]: NULL, unsharded,
 * when replicated over another mesh of m's devices (sharding.h,
 * sharding_unsharded_over); one over another mesh otherwise stays, for
 * the partitioner's error of mixed meshes. */
static Value *leaf_sharding_over(Value *v, const Mesh *m) {
  Value *s = leaf_sharding(v);
  return s && sharding_unsharded_over((NamedSharding *)s, m) ? NULL : s;
}

Mesh *part_mesh(Value *const *leaves, int n, Value *out_shardings) {
  Mesh *first = NULL;
  for (int i = 0; i < n; i++) {
    NamedSharding *s = (NamedSharding *)leaf_sharding(leaves[i]);
    if (!s) continue;
    for (int d = 0; d < s->spec->n; d++)
      if (s->spec->e[d].nnames) return s->mesh;
    if (!first) first = s->mesh;
  }
  if (first) return first;
  Value *w = want_at(out_shardings, 0);
  return w ? ((NamedSharding *)w)->mesh : NULL;
}

/* The mesh of the first sharding_constraint among [p]'s equations, those
 * in a partial-manual shard_map's body included, or NULL. */
static Mesh *constraint_mesh(const Plan *p) {
  for (int k = 0; k < p->neqn; k++) {
    const PlanEqn *e = &p->eqns[k];
    if (e->prim == P_SHARD_MAP && params_get(&e->params, "manual_axes")) {
      /* one in a partial-manual shard_map's body: partitioned along its
       * automatic axes */
      Value *b = params_get(&e->params, "jaxpr");
      Mesh *m = IS_PLAN(b) ? constraint_mesh(AS_PLAN(b)) : NULL;
      if (m) return m;
    }
    if (p->eqns[k].prim != P_SHARDING_CONSTRAINT) continue;
    NamedSharding *s = (NamedSharding *)params_get(&p->eqns[k].params, "sharding");
    if (s && s->mesh) return s->mesh;
  }
  return NULL;
}

/* The one real mesh of the shard_maps among [p]'s equations and its
 * nested jits' into *m (left NULL when none); false when two differ. */
static bool manual_mesh(const Plan *p, Mesh **m) {
  for (int k = 0; k < p->neqn; k++) {
    const PlanEqn *e = &p->eqns[k];
    Value *v = e->prim == P_SHARD_MAP ? params_get(&e->params, "mesh") : NULL;
    if (e->prim == P_PJIT) {
      Value *b = params_get(&e->params, "jaxpr");
      if (IS_PLAN(b) && !manual_mesh(AS_PLAN(b), m)) return false;
    }
    if (!v || v->type != V_MESH || ((Mesh *)v)->abstract) continue;
    if (*m && !mesh_same(*m, (Mesh *)v)) return false;
    *m = (Mesh *)v;
  }
  return true;
}

bool part_meshes_differ(const Plan *p, Value *const *leaves, int n, Value *out_shardings) {
  Mesh *m = part_mesh(leaves, n, out_shardings);
  if (!m) m = constraint_mesh(p);
  return !manual_mesh(p, &m);
}

Value *part_want_at(Value *out_shardings, int i) { return want_at(out_shardings, i); }

Mesh *part_constraint_mesh(const Plan *p) {
  Mesh *m = constraint_mesh(p);
  if (m) return m;
  return manual_mesh(p, &m) ? m : NULL;
}

/* element-wise steps followed to a shard_map, and equations visited in
 * all (a plan whose values fan out and meet again is not searched
 * further: its argument stays replicated, which is correct) */
enum { USE_DEPTH = 16, USE_BUDGET = 1 << 16 };

/* Whether [p]'s variables [a] and [b] have one shape. */
static bool same_shape(const Plan *p, int a, int b) {
  const AVal *x = &p->vars[a], *y = &p->vars[b];
  return x->ndim == y->ndim && !memcmp(x->shape, y->shape, sizeof(int64_t) * (size_t)x->ndim);
}

/* The spec of a transpose's operand (rank [n]) whose result [out] laid
 * out so gives each device the same block: entry perm[d] is out's d. */
static PSpec *spec_before_transpose(const PSpec *out, const PlanEqn *e, int n) {
  int64_t perm[SHM_MAXDIM];
  int np = 0;
  if (params_ints(&e->params, "permutation", &np, perm, SHM_MAXDIM) < 0 || np != n) {
    err_clear();
    return NULL;
  }
  PSpec *t = pspec_none(n);
  for (int d = 0; t && d < out->n && d < n; d++) t->e[perm[d]] = out->e[d];
  return t;
}

/* The spec of a reshape's operand of aval [a] whose result of aval [r]
 * laid out as [out] gives each device the same elements, or NULL: each
 * split result dimension starts where an operand dimension does (equal
 * products of the dimensions before) that its split divides, so the
 * blocks are the same runs of the flat array. */
static PSpec *spec_before_reshape(const PSpec *out, const AVal *a, const AVal *r, const Mesh *m) {
  PSpec *t = pspec_none(a->ndim);
  for (int d = 0; t && d < out->n && d < r->ndim; d++) {
    if (!out->e[d].nnames) continue;
    int64_t before = 1, in_before = 1;
    for (int q = 0; q < d; q++) before *= r->shape[q];
    int i = 0;
    while (i < a->ndim && in_before < before) in_before *= a->shape[i++];
    while (i < a->ndim && a->shape[i] == 1 && r->shape[d] != 1) i++;   /* unit dimensions between */
    if (i >= a->ndim || in_before != before || a->shape[i] % pspec_entry_size(out, m, d) ||
        t->e[i].nnames) {
      val_decref(&t->hdr);
      return NULL;
    }
    t->e[i] = out->e[d];
  }
  return t;
}

/* The in_spec every use of [p]'s variable [v] reaches when each is an
 * operand of a shard_map over [m] with that one spec, or of an
 * element-wise equation of v's shape, a transpose or a reshape that
 * keeps the blocks whole (spec_before_reshape) whose result's uses do so
 * in turn, the spec carried back through them; else NULL (any other use,
 * or v a result of the plan).  A new reference. */
static PSpec *use_spec(const Plan *p, int v, const Mesh *m, int depth, long *budget) {
  PSpec *spec = NULL;
  if ((*budget -= p->neqn + 1) < 0) return NULL;
  for (int o = 0; o < p->nout; o++)
    if (!p->outs[o].lit && p->outs[o].var == v) return NULL;
  for (int k = 0; k < p->neqn; k++) {
    const PlanEqn *e = &p->eqns[k];
    PSpec *through = NULL;   /* a step's answer, asked once */
    bool asked = false;
    for (int j = 0; j < e->nin; j++) {
      if (e->in[j].lit || e->in[j].var != v) continue;
      PSpec *sj = NULL;
      PrimKind kind = prim_table[e->prim].kind;
      bool step = e->nout == 1 && depth < USE_DEPTH &&
                  (e->prim == P_TRANSPOSE || e->prim == P_RESHAPE ||
                   ((kind == PK_UNARY || kind == PK_BINARY) && same_shape(p, e->out[0], v)));
      if (asked) {
        sj = through ? (PSpec *)val_incref(&through->hdr) : NULL;
      } else if (e->prim == P_SHARD_MAP) {
        Value *em = params_get(&e->params, "mesh"), *is = params_get(&e->params, "in_specs");
        if (em && em->type == V_MESH && mesh_same((Mesh *)em, m) && is && is->type == V_TUPLE &&
            (size_t)j < tuple_len(is) && tuple_get(is, (size_t)j)->type == V_PSPEC)
          sj = (PSpec *)val_incref(tuple_get(is, (size_t)j));
      } else if (step) {
        /* the same bits whatever the layout: x * 2. or x.T before the call */
        PSpec *after = use_spec(p, e->out[0], m, depth + 1, budget);
        if (!after || e->prim == P_TRANSPOSE || e->prim == P_RESHAPE) {
          if (after && e->prim == P_TRANSPOSE) through = spec_before_transpose(after, e, p->vars[v].ndim);
          else if (after) through = spec_before_reshape(after, &p->vars[v], &p->vars[e->out[0]], m);
          if (after) val_decref(&after->hdr);
        } else {
          through = after;
        }
        asked = true;
        sj = through ? (PSpec *)val_incref(&through->hdr) : NULL;
      }
      if (!sj || (spec && !pspec_same(spec, sj))) {
        if (sj) val_decref(&sj->hdr);
        if (spec) val_decref(&spec->hdr);
        if (through) val_decref(&through->hdr);
        return NULL;
      }
      if (spec) val_decref(&spec->hdr);
      spec = sj;
    }
    if (through) val_decref(&through->hdr);
  }
  return spec;
}

/* The layout of unsharded leaf [i] in a call partitioned over [m] (a new
 * reference; NULL: replicated): JAX's jit leaves an uncommitted
 * argument's layout to propagation, which gives one that only shard_maps
 * read (directly or through element-wise steps, transposes and reshapes
 * that keep the blocks whole) their in_specs' layout carried back,
 * so each device is handed its block (a compiled argument of the
 * block's size: AOT's memory analysis) and computes the steps on it, not
 * on the whole.  Any other use keeps it replicated, as eager code reads
 * it, so eager and jit agree bit for bit. */
static Value *unsharded_leaf_layout(const Plan *p, int i, Value *leaf, Mesh *m) {
  if (leaf_sharding(leaf) || (IS_ARRAY(leaf) && AS_ARRAY(leaf)->device1)) return NULL;
  long budget = USE_BUDGET;
  PSpec *spec = use_spec(p, p->invars[i], m, 0, &budget);
  err_clear();   /* out of memory while searching: replicated, which is correct */
  Value *r = spec ? sharding_new(m, spec) : NULL;
  if (spec) val_decref(&spec->hdr);
  return r;
}

PartPlan *part_plan_call(Plan *p, Value *const *leaves, Value *out_shardings) {
  Mesh *m = part_mesh(leaves, p->nin, out_shardings);
  if (!m) m = part_constraint_mesh(p);
  if (!m) return NULL;
  Value **in = shm_calloc((size_t)p->nin + 1, sizeof(Value *));
  Value **want = shm_calloc((size_t)p->nout + 1, sizeof(Value *));
  bool *made = shm_calloc((size_t)p->nin + 1, sizeof(bool));
  PartPlan *pp = NULL;
  if (in && want && made) {
    int i = 0;
    for (; i < p->nin; i++) {
      in[i] = leaf_sharding_over(leaves[i], m);
      if (in[i] || m->abstract) continue;
      in[i] = unsharded_leaf_layout(p, i, leaves[i], m);
      made[i] = in[i] != NULL;
      if (!made[i] && err_kind()) break;
    }
    for (int o = 0; o < p->nout; o++) want[o] = want_at(out_shardings, o);
    if (i == p->nin) pp = part_plan(p, m, in, out_shardings ? want : NULL);
  } else {
    err_nomem();
  }
  for (int i = 0; made && i < p->nin; i++)
    if (made[i]) val_decref(in[i]);
  shm_free(made);
  shm_free(in);
  shm_free(want);
  return pp;
}

static _Thread_local PartTraced *traced_scope;

void part_trace_enter(PartTraced *scope, Trace *t, Value *const *leaves, int n) {
  *scope = (PartTraced){t, leaves, n, traced_scope, NULL, NULL, 0, 0, 0, 0, false};
  traced_scope = scope;
}

void part_trace_leave(PartTraced *scope) {
  traced_scope = scope->prev;
  PartPlan *pp = scope->pp;
  if (!pp) return;
  for (int k = 0; k < scope->done; k++) part_eqn_clear(&pp->eqns[k]);
  for (int k = 0; k < scope->capeqn; k++) sbuf_free(&scope->notes[k]);
  shm_free(scope->notes);
  shm_free(pp->vars);
  shm_free(pp->origin);
  shm_free(pp->eqns);
  val_decref(&pp->p->hdr);
  val_decref(&pp->mesh->hdr);
  shm_free(pp);
  scope->pp = NULL;
}

/* Grows [*a] (of [*cap] elements of [size] bytes, zeroed) to hold [n]. */
static int grow_zeroed(void **a, int *cap, int n, size_t size) {
  if (n <= *cap) return 0;
  int c = *cap ? *cap : 16;
  while (c < n) c *= 2;
  void *b = shm_realloc(*a, (size_t)c * size);
  if (!b) return err_nomem(), -1;
  memset((char *)b + (size_t)*cap * size, 0, (size_t)(c - *cap) * size);
  *a = b;
  *cap = c;
  return 0;
}

/* The scope's propagation started: its mesh and arguments' layouts, or
 * [off] when the mesh has no Explicit axis.  With no argument laid out
 * over a mesh it starts at the first sharding constraint (a reshard)
 * over one with Explicit axes, the arguments replicated there, as JAX
 * types the values after it; until then it is not started.  0, or -1. */
static int traced_start(PartTraced *sc, Plan *p) {
  Mesh *m = p->nin == sc->n ? part_mesh(sc->leaves, sc->n, NULL) : NULL;
  if (!m && p->nin == sc->n && p->neqn > 0) {
    const PlanEqn *e = &p->eqns[p->neqn - 1];
    NamedSharding *s = e->prim == P_SHARDING_CONSTRAINT
                           ? (NamedSharding *)params_get(&e->params, "sharding") : NULL;
    if (!s || !s->mesh) return 0;
    m = s->mesh;
  }
  bool explicit_mesh = false;
  for (int a = 0; m && a < m->naxes; a++) explicit_mesh |= m->axis_types[a] == MESH_EXPLICIT;
  if (!explicit_mesh) {
    sc->off = true;
    return 0;
  }
  PartPlan *pp = shm_calloc(1, sizeof *pp);
  if (!pp) return err_nomem(), -1;
  pp->p = (Plan *)val_incref(&p->hdr);
  pp->mesh = (Mesh *)val_incref(&m->hdr);
  sc->pp = pp;
  return 0;
}

int part_traced_check(Trace *t) {
  PartTraced *sc = traced_scope;
  if (!sc || sc->t != t || sc->off) return 0;
  Plan *p = trace_plan(t);
  if (!sc->pp) {
    if (traced_start(sc, p) < 0) return -1;
    if (sc->off || !sc->pp) return 0;
  }
  PartPlan *pp = sc->pp;
  int capv = sc->capvars, cape = sc->capeqn;
  if (grow_zeroed((void **)&pp->vars, &sc->capvars, p->nvars + 1, sizeof(Sharding)) < 0 ||
      grow_zeroed((void **)&pp->origin, &capv, p->nvars + 1, sizeof(int)) < 0 ||
      grow_zeroed((void **)&pp->eqns, &sc->capeqn, p->neqn + 1, sizeof(PartEqn)) < 0 ||
      grow_zeroed((void **)&sc->notes, &cape, p->neqn + 1, sizeof(StrBuf)) < 0)
    return -1;
  for (int v = sc->nvars; v < p->nvars; v++) {
    replicated(pp->mesh, p->vars[v].ndim, &pp->vars[v]);
    for (int i = 0; i < sc->n; i++)
      if (p->invars[i] == v)
        layout_of(pp->mesh, leaf_sharding_over(sc->leaves[i], pp->mesh), p->vars[v].ndim,
                  &pp->vars[v]);
  }
  sc->nvars = p->nvars;
  Part pt = {pp, sc->notes, NULL, NULL};   /* while tracing: forward only */
  for (; sc->done < p->neqn; sc->done++) {
    if (part_eqn(&pt, sc->done) == 0) continue;
    part_eqn_clear(&pp->eqns[sc->done]);   /* with the sub-plans a loop or branch made */
    sbuf_free(&sc->notes[sc->done]);
    if (sc->done == p->neqn - 1) plan_eqn_clear(&p->eqns[--p->neqn]);
    return -1;
  }
  return 0;
}

int part_check_sub(Plan *p, Value *const *in) {
  Value **sh = shm_calloc((size_t)p->nin + 1, sizeof(Value *));
  if (!sh) return err_nomem(), -1;
  Mesh *m = NULL;
  bool known = true, explicit_mesh = false;
  for (int i = 0; i < p->nin && known; i++) {
    if (in[i] == VAL_NONE) {
      sh[i] = NULL;
    } else if (sharding_is(in[i])) {
      sh[i] = ((NamedSharding *)in[i])->mesh ? val_incref(in[i]) : NULL;
    } else if (IS_ARRAY(in[i])) {
      sh[i] = leaf_sharding(in[i]);
      if (sh[i]) val_incref(sh[i]);
    } else {   /* another trace's value (none Explicit): its layout unknown here */
      sh[i] = part_traced_explicit() ? part_traced_sharding(in[i]) : NULL;
      known = sh[i] != NULL;
    }
    if (sh[i] && !m) m = ((NamedSharding *)sh[i])->mesh;
  }
  for (int a = 0; m && a < m->naxes; a++) explicit_mesh |= m->axis_types[a] == MESH_EXPLICIT;
  int rc = 0;
  if (known && explicit_mesh) {
    PartPlan *pp = part_plan(p, m, sh, NULL);
    if (pp) val_decref(&pp->base.hdr);
    else if (err_kind() == ERR_TYPE && !strncmp(err_message(), "ShardingTypeError: ", 19)) rc = -1;
    else err_clear();
  }
  for (int i = 0; i < p->nin; i++) val_decref(sh[i]);
  shm_free(sh);
  return rc;
}

bool part_traced_explicit(void) {
  PartTraced *sc = traced_scope;
  if (!sc || sc->off || trace_current() != sc->t) return false;
  if (sc->pp) return true;
  Mesh *m = part_mesh(sc->leaves, sc->n, NULL);
  for (int a = 0; m && a < m->naxes; a++)
    if (m->axis_types[a] == MESH_EXPLICIT) return true;
  return false;
}

/* [v]'s NamedSharding (a new reference) whether an array or traced;
 * NULL, no error set, when it has none. */
static Value *any_sharding(Value *v) {
  Value *s = IS_ARRAY(v) ? (AS_ARRAY(v)->sharding ? val_incref(AS_ARRAY(v)->sharding) : NULL)
             : IS_TRACER(v) ? part_traced_sharding(v) : NULL;
  if (s && (!sharding_is(s) || !((NamedSharding *)s)->mesh)) {
    val_decref(s);
    s = NULL;
  }
  return s;
}

/* A batch tracer's type: its batched value's, the batch axis dropped
 * (JAX's BatchTracer aval: vmap over a split dimension leaves the rest
 * of the spec). */
static Value *batched_sharding(Tracer *t) {
  Value *s = any_sharding(t->batched);
  if (!s || t->bdim < 0 || t->bdim > t->aval.ndim) {
    if (s) val_decref(s);
    return NULL;
  }
  Sharding r;
  sharding_to_rule((NamedSharding *)s, t->aval.ndim + 1, &r);
  for (int d = t->bdim; d < t->aval.ndim; d++) {
    r.nsplit[d] = r.nsplit[d + 1];
    memcpy(r.split[d], r.split[d + 1], sizeof r.split[d]);
  }
  r.ndim = t->aval.ndim;
  Value *o = sharding_from_rule(((NamedSharding *)s)->mesh, &r);
  val_decref(s);
  return o;
}

Value *part_typed_like(Value *ct, Value *primal, int ndim) {
  Value *ps = any_sharding(primal);
  Mesh *m = ps ? ((NamedSharding *)ps)->mesh : NULL;
  bool expl = false;
  for (int a = 0; m && a < m->naxes; a++) expl |= m->axis_types[a] == MESH_EXPLICIT;
  if (!expl || !builtins_out_sharding_hook) {
    if (ps) val_decref(ps);
    return val_incref(ct);
  }
  Value *cs = any_sharding(ct);
  Sharding want, got;
  sharding_to_rule((NamedSharding *)ps, ndim, &want);
  if (cs && mesh_same(((NamedSharding *)cs)->mesh, m)) {
    sharding_to_rule((NamedSharding *)cs, ndim, &got);
  } else {
    memset(&got, 0, sizeof got);
    got.ndim = ndim;
  }
  bool same = true;
  for (int d = 0; d < ndim; d++)
    same &= want.nsplit[d] == got.nsplit[d] &&
            !memcmp(want.split[d], got.split[d], sizeof(want.split[d][0]) * want.nsplit[d]);
  if (cs) val_decref(cs);
  Value *r = same ? val_incref(ct) : builtins_out_sharding_hook(ct, ps);
  val_decref(ps);
  return r;
}

Value *part_traced_sharding(Value *x) {
  PartTraced *sc = traced_scope;
  /* a value being differentiated has its primal's type, one batched its
   * batched value's without the batch axis (JAX's JVPTracer and
   * BatchTracer avals carry the sharding) */
  if (IS_JVP_TRACER(x)) return any_sharding(((Tracer *)x)->primal);
  if (IS_BATCH_TRACER(x)) return batched_sharding((Tracer *)x);
  if (!sc || trace_current() != sc->t || !IS_STAGE_TRACER(x) ||
      ((Tracer *)x)->trace_id != trace_id_of(sc->t))
    return NULL;
  Plan *p = trace_plan(sc->t);
  int var = ((Tracer *)x)->var;
  if (sc->pp && var >= 0 && var < sc->nvars) {   /* laid out while tracing */
    Sharding s = sc->pp->vars[var];
    s.partial = 0;
    return sharding_from_rule(sc->pp->mesh, &s);
  }
  Mesh *m = p->nin == sc->n ? part_mesh(sc->leaves, sc->n, NULL) : NULL;
  if (!m || var < 0 || var >= p->nvars) return NULL;
  Value **in = shm_calloc((size_t)sc->n + 1, sizeof(Value *));
  if (!in) return NULL;
  for (int i = 0; i < sc->n; i++) in[i] = leaf_sharding_over(sc->leaves[i], m);
  PartPlan *pp = part_plan(p, m, in, NULL);
  shm_free(in);
  Value *r = NULL;
  if (pp) {
    Sharding s = pp->vars[var];
    s.partial = 0;
    r = sharding_from_rule(m, &s);
    val_decref(&pp->base.hdr);
  }
  if (!r) err_clear();
  return r;
}
