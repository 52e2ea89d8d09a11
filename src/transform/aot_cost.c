/*
 * aot_cost.c - the cost and memory analyses of a lowered plan (aot.h):
 * each equation's flops and transcendentals from its row's cost rule,
 * its bytes accessed (operands read, results written, as XLA counts
 * them), each collective's traffic from its row's CollRules.traffic with
 * the group size from the mesh of the shard_map around it; memory from
 * the slots compile.c's buffer planner gave the plan.
 */
#include <stdlib.h>
#include <string.h>

#include "array/array.h"
#include "base/intern.h"
#include "base/mem.h"
#include "spmd/collective.h"
#include "spmd/mesh.h"
#include "transform/aot.h"
#include "transform/compile_impl.h"

/* ==== the walk ===================================================================== */

static AotItem *push(AotCost *c) {
  if (c->n == c->cap) {
    int cap = c->cap ? 2 * c->cap : 64;
    AotItem *it = shm_realloc(c->items, sizeof *it * (size_t)cap);
    if (!it) return err_nomem();
    c->items = it;
    c->cap = cap;
  }
  AotItem *it = &c->items[c->n++];
  memset(it, 0, sizeof *it);
  return it;
}

static double aval_bytes(const AVal *a) {
  return (double)shape_size(a->ndim, a->shape) * (double)dt_size(a->dtype);
}

/* The mesh axes a collective's parameters name (`axes` or `axis_name`:
 * a name or a tuple of names), and the size of one group: the product of
 * their sizes, or one group's length when axis_index_groups is given. */
static void coll_group(const PlanEqn *q, const Mesh *m, AotItem *it) {
  Value *v = params_get(&q->params, "axes");
  if (!v) v = params_get(&q->params, "axis_name");
  size_t n = 1;
  Value *const *names = &v;
  if (v && (v->type == V_TUPLE || v->type == V_LIST)) val_seq(v, &n, &names);
  it->group = 1;
  for (size_t i = 0; v && i < n && it->naxes < AOT_MAX_AXES; i++) {
    if (names[i]->type != V_STR) continue;
    const char *nm = intern_cstr(str_cstr(names[i]));
    it->axes[it->naxes++] = nm;
    int ax = m ? mesh_axis(m, nm) : -1;
    if (ax >= 0) it->group *= m->axis_sizes[ax];
  }
  Value *g = params_get(&q->params, "axis_index_groups");
  size_t ng;
  Value *const *groups;
  if (g && g != VAL_NONE && val_seq(g, &ng, &groups) && ng > 0) {
    size_t len;
    Value *const *first;
    if (val_seq(groups[0], &len, &first)) it->group = (int64_t)len;
  }
}

static int walk(const Plan *p, const Mesh *m, double mult, AotCost *c);

/* A sub-plan parameter's cost: a plan walked [mult] times; a tuple of
 * plans (cond's branches) as its costliest one, since one runs. */
static int walk_param(Value *v, const Mesh *m, double mult, AotCost *c) {
  if (IS_PLAN(v)) return walk(AS_PLAN(v), m, mult, c);
  if (v->type != V_TUPLE) return 0;
  AotCost best = {0};
  double best_w = -1;
  for (size_t i = 0; i < tuple_len(v); i++) {
    Value *b = tuple_get(v, i);
    if (!IS_PLAN(b)) continue;
    AotCost one = {0};
    if (walk(AS_PLAN(b), m, mult, &one) < 0) {
      aot_cost_free(&one);
      aot_cost_free(&best);
      return -1;
    }
    double w = 0;
    for (int k = 0; k < one.n; k++) w += one.items[k].flops + one.items[k].bytes;
    if (w > best_w) {
      aot_cost_free(&best);
      best = one;
      best_w = w;
    } else {
      aot_cost_free(&one);
    }
  }
  for (int k = 0; k < best.n; k++) {
    AotItem *it = push(c);
    if (!it) break;
    *it = best.items[k];
  }
  if (best.devices > c->devices) c->devices = best.devices;
  aot_cost_free(&best);
  return err_occurred() ? -1 : 0;
}

/* The equation of [p] defining variable [v], or NULL. */
static const PlanEqn *defining(const Plan *p, int v) {
  for (int i = 0; i < p->neqn; i++)
    for (int k = 0; k < p->eqns[i].nout; k++)
      if (p->eqns[i].out[k] == v) return &p->eqns[i];
  return NULL;
}

static bool is_literal(const PlanAtom *a, int64_t *x) {
  if (a->var >= 0 || !a->lit || !IS_ARRAY(a->lit) || AS_ARRAY(a->lit)->size != 1) return false;
  *x = arr_get_i64(AS_ARRAY(a->lit), 0);
  return true;
}

/* The trip count of while equation [q] when it is a fori_loop over
 * literal bounds, which JAX lowers to a scan of that length: its cond is
 * `lt` of its first two carries, its body adds 1 to the first and passes
 * the second through, and both start as literals.  -1 for any other
 * while, whose trip count is data. */
static double fori_trips(const PlanEqn *q) {
  Plan *cond = cmp_param_plan(q, "cond_jaxpr"), *body = cmp_param_plan(q, "body_jaxpr");
  int64_t cn, bn, lo, hi, one;
  if (!cond || !body || params_int(&q->params, "cond_nconsts", &cn) < 0 ||
      params_int(&q->params, "body_nconsts", &bn) < 0) {
    err_clear();
    return -1;
  }
  if (q->nin < cn + bn + 2 || cond->nin < cn + 2 || body->nin < bn + 2 || body->nout < 2 ||
      !is_literal(&q->in[cn + bn], &lo) || !is_literal(&q->in[cn + bn + 1], &hi))
    return -1;
  const PlanEqn *lt = cond->neqn == 1 && cond->nout == 1 ? &cond->eqns[0] : NULL;
  if (!lt || lt->prim != P_LT || lt->in[0].var != cond->invars[cn] ||
      lt->in[1].var != cond->invars[cn + 1] || cond->outs[0].var != lt->out[0])
    return -1;
  const PlanEqn *inc = body->outs[0].var >= 0 ? defining(body, body->outs[0].var) : NULL;
  if (!inc || inc->prim != P_ADD || inc->in[0].var != body->invars[bn] ||
      !is_literal(&inc->in[1], &one) || one != 1 || body->outs[1].var != body->invars[bn + 1])
    return -1;
  return hi > lo ? (double)(hi - lo) : 0;
}

/* A higher-order equation: its sub-plans, on the mesh it names (a
 * shard_map's), repeated `length` times when it has one (scan), or its
 * trip count when it is a fori_loop over literal bounds. */
static int walk_higher(const PlanEqn *q, const Mesh *m, double mult, AotCost *c) {
  Value *mv = params_get(&q->params, "mesh");
  if (mv && mv->type == V_MESH) {
    m = (const Mesh *)mv;
    if (m->size > c->devices) c->devices = m->size;
  }
  int64_t len;
  if (params_get(&q->params, "length") && params_int(&q->params, "length", &len) == 0)
    mult *= (double)len;
  err_clear();
  double trips = q->prim == P_WHILE ? fori_trips(q) : -1;
  if (trips >= 0) mult *= trips;
  for (int i = 0; i < q->params.n; i++)
    if (walk_param(q->params.p[i].value, m, mult, c) < 0) return -1;
  return 0;
}

static bool has_plan_param(const PlanEqn *q) {
  for (int i = 0; i < q->params.n; i++) {
    Value *v = q->params.p[i].value;
    if (IS_PLAN(v) || (v->type == V_TUPLE && tuple_len(v) && IS_PLAN(tuple_get(v, 0)))) return true;
  }
  return false;
}

/* For a compiled plan, the bytes each equation moves as the compiled
 * code runs it: a fused loop reads its operands and writes its results
 * once (its first equation carries them, the others none), so its
 * intermediates never reach memory (XLA's compiled cost analysis counts
 * fusions so).  NULL when [p] is not compiled: every equation's own. */
static double *fused_bytes(const Plan *p, int **group, AotCost *c) {
  const Exec *e = p->exec;
  *group = NULL;
  if (!e) return NULL;
  double *b = shm_malloc(sizeof(double) * (size_t)(p->neqn + 1));
  int *g = shm_calloc((size_t)(p->neqn + 1), sizeof(int));
  if (!b || !g) {
    shm_free(b), shm_free(g);
    return NULL;
  }
  *group = g;
  for (int i = 0; i < p->neqn; i++) b[i] = -1;   /* -1: its own */
  for (int i = 0; i < e->nsteps; i++) {
    const Step *s = &e->steps[i];
    if (s->kind != ST_FUSED) continue;
    double ext = 0;
    for (int k = 0; k < s->nin; k++) ext += aval_bytes(&e->slots[s->in[k]].aval);
    for (int k = 0; k < s->nout; k++) ext += aval_bytes(&e->slots[s->out[k]].aval);
    int id = ++c->nfusions;
    for (int m = 0; m < s->fused->neqns; m++) {
      int k = (int)(s->fused->eqns[m] - p->eqns);
      if (k >= 0 && k < p->neqn) b[k] = m == 0 ? ext : 0, g[k] = id;
    }
  }
  return b;
}

/* A first-order equation: its row's cost, its bytes ([fb]: a fused
 * loop's share, -1 for its own), its traffic. */
static int walk_eqn(const Plan *p, const PlanEqn *q, const Mesh *m, double mult, double fb,
                    int fusion, AotCost *c) {
  AVal in[16], out[16];
  int nin = q->nin < 16 ? q->nin : 16, nout = q->nout < 16 ? q->nout : 16;
  AotItem *it = push(c);
  if (!it) return -1;
  it->line = q->loc.line;
  it->prim = q->prim;
  it->count = mult;
  it->running = m ? m->size : 0;
  double bytes = 0;
  for (int k = 0; k < nin; k++) plan_atom_aval(p, &q->in[k], &in[k]), bytes += aval_bytes(&in[k]);
  for (int k = 0; k < nout; k++) out[k] = p->vars[q->out[k]], bytes += aval_bytes(&out[k]);
  it->dtype = nout ? out[0].dtype : DT_F32;
  const PrimRules *r = &prim_table[q->prim].rules;
  PrimCost pc = {0};
  if (r->cost) r->cost(&q->params, nin, in, nout, out, &pc);
  it->flops = pc.flops * mult;
  it->transcendentals = pc.transcendentals * mult;
  it->bytes = (fb >= 0 ? fb : bytes) * mult;
  it->fusion = fusion;
  const CollRules *cr = r->coll;
  if (!cr || !cr->traffic) return 0;
  coll_group(q, m, it);
  it->kind = cr->api_name;
  double ob = 0;
  for (int k = 0; k < nin; k++) ob += aval_bytes(&in[k]);
  it->operand_bytes = ob;
  CollTraffic t = {0};
  if (it->group > 1) cr->traffic(ob, (int)it->group, &t);
  it->algorithm = t.algorithm ? t.algorithm : "none (a group of one)";
  it->sent = t.sent;
  it->received = t.received;
  it->steps = t.steps;
  return 0;
}

/* The plan a compiled step of [p] runs in place of higher-order equation
 * [q] when its row's prepare rule made one (xmap's: the body lowered to
 * positional equations over its resources, which is what runs), or NULL. */
static Plan *lowered_plan(const Plan *p, const PlanEqn *q) {
  const Exec *e = p->exec;
  for (int i = 0; e && i < e->nsteps; i++)
    if (e->steps[i].eqn == q && e->steps[i].own && IS_PLAN(e->steps[i].own))
      return AS_PLAN(e->steps[i].own);
  return NULL;
}

/* A shard_map call: an item of no flops or bytes that stands for
 * starting its body on every device, per call (the profile's
 * call_overhead). */
static int note_call(const PlanEqn *q, double mult, AotCost *c) {
  Value *mv = params_get(&q->params, "mesh");
  if (!mv || mv->type != V_MESH) return 0;
  AotItem *it = push(c);
  if (!it) return -1;
  it->line = q->loc.line;
  it->prim = q->prim;
  it->count = mult;
  it->call = true;
  it->running = ((const Mesh *)mv)->size;
  return 0;
}

static int walk(const Plan *p, const Mesh *m, double mult, AotCost *c) {
  int *group;
  double *fb = fused_bytes(p, &group, c);
  /* a compiled plan does not run its dead equations (compile.c's dce):
   * they cost nothing, as in XLA's compiled cost analysis */
  bool *live = p->exec ? cmp_live_eqns(p) : NULL;
  int rc = p->exec && !live ? -1 : 0;
  for (int i = 0; i < p->neqn && rc == 0; i++) {
    const PlanEqn *q = &p->eqns[i];
    if (live && !live[i]) continue;
    Plan *low = has_plan_param(q) ? lowered_plan(p, q) : NULL;
    if (low) rc = walk(low, m, mult, c);
    else if (has_plan_param(q)) rc = note_call(q, mult, c) < 0 ? -1 : walk_higher(q, m, mult, c);
    else rc = walk_eqn(p, q, m, mult, fb ? fb[i] : -1, fb ? group[i] : 0, c);
  }
  shm_free(live);
  shm_free(fb);
  shm_free(group);
  return rc;
}

int aot_cost(const Plan *p, const Mesh *within, AotCost *c) {
  c->devices = within ? within->size : 1;
  return walk(p, within, 1, c);
}

void aot_cost_free(AotCost *c) {
  shm_free(c->items);
  memset(c, 0, sizeof *c);
}

/* ==== the dict ===================================================================== */

static int set_num(Value *d, const char *key, double x) {
  Value *v = arr_python_float(x);
  int rc = v ? dict_set_str(d, key, v) : -1;
  val_decref(v);
  return rc;
}

static int set_steal(Value *d, const char *key, Value *v) {
  int rc = v ? dict_set_str(d, key, v) : -1;
  val_decref(v);
  return rc;
}

static Value *axes_tuple(const AotItem *it) {
  Value *t = tuple_new((size_t)it->naxes);
  for (int i = 0; t && i < it->naxes; i++) {
    Value *s = str_from(it->axes[i]);
    if (!s) {
      for (int k = i; k < it->naxes; k++) tuple_set_steal(t, (size_t)k, val_incref(VAL_NONE));
      val_decref(t);
      return NULL;
    }
    tuple_set_steal(t, (size_t)i, s);
  }
  return t;
}

static Value *coll_dict(const AotItem *it) {
  Value *d = dict_new();
  if (!d) return NULL;
  int rc = set_steal(d, "kind", str_from(it->kind)) | set_steal(d, "axes", axes_tuple(it)) |
           set_steal(d, "group_size", val_int(it->group)) |
           set_steal(d, "algorithm", str_from(it->algorithm)) |
           set_num(d, "bytes_sent", it->sent) | set_num(d, "bytes_received", it->received) |
           set_num(d, "operand_bytes", it->operand_bytes) | set_num(d, "count", it->count) |
           set_steal(d, "line", val_int(it->line));
  if (rc < 0) {
    val_decref(d);
    return NULL;
  }
  return d;
}

/* The sums over the items of [line] ([all]: every line); a line's dict
 * adds the bytes its collectives send per device. */
static Value *sums(const AotCost *c, int line, bool all) {
  double f = 0, b = 0, t = 0, sent = 0;
  for (int i = 0; i < c->n; i++) {
    const AotItem *it = &c->items[i];
    if (!all && it->line != line) continue;
    f += it->flops, b += it->bytes, t += it->transcendentals, sent += it->sent * it->count;
  }
  Value *d = dict_new();
  if (!d) return NULL;
  if ((set_num(d, "flops", f) | set_num(d, "bytes accessed", b) | set_num(d, "transcendentals", t) |
       (all ? 0 : set_num(d, "bytes sent", sent))) < 0) {
    val_decref(d);
    return NULL;
  }
  return d;
}

static int by_line(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

static Value *lines_dict(const AotCost *c) {
  int *ls = shm_malloc(sizeof(int) * (size_t)(c->n + 1));
  Value *d = ls ? dict_new() : NULL;
  if (!d) {
    shm_free(ls);
    return ls ? NULL : err_nomem();
  }
  int n = 0;
  for (int i = 0; i < c->n; i++)
    if (!c->items[i].call) ls[n++] = c->items[i].line;
  qsort(ls, (size_t)n, sizeof *ls, by_line);
  for (int i = 0; i < n; i++) {
    if (i && ls[i] == ls[i - 1]) continue;
    Value *k = val_int(ls[i]), *v = sums(c, ls[i], false);
    int rc = k && v ? dict_set(d, k, v) : -1;
    val_decref(k);
    val_decref(v);
    if (rc < 0) {
      val_decref(d);
      d = NULL;
      break;
    }
  }
  shm_free(ls);
  return d;
}

Value *aot_cost_dict(const AotCost *c) {
  Value *d = sums(c, 0, true), *colls = list_new(4);
  if (!d || !colls) {
    val_decref(d);
    val_decref(colls);
    return NULL;
  }
  for (int i = 0; i < c->n; i++)
    if (c->items[i].kind && list_append_steal(colls, coll_dict(&c->items[i])) < 0) {
      val_decref(colls);
      val_decref(d);
      return NULL;
    }
  if (set_steal(d, "collectives", colls) < 0 ||
      set_steal(d, "lines", lines_dict(c)) < 0 || set_steal(d, "devices", val_int(c->devices)) < 0) {
    val_decref(d);
    return NULL;
  }
  return d;
}

/* ==== memory ======================================================================= */

static double temp_bytes(const Exec *e);

/* The temporaries of the sub-plans a step runs (each compiled apart). */
static double sub_temp(const Step *s) {
  double t = 0;
  for (int i = 0; i < s->eqn->params.n; i++) {
    Value *v = s->eqn->params.p[i].value;
    if (IS_PLAN(v) && AS_PLAN(v)->exec) t += temp_bytes(AS_PLAN(v)->exec);
    for (size_t k = 0; v->type == V_TUPLE && k < tuple_len(v); k++)
      if (IS_PLAN(tuple_get(v, k)) && AS_PLAN(tuple_get(v, k))->exec)
        t += temp_bytes(AS_PLAN(tuple_get(v, k))->exec);
  }
  return t;
}

/* What one workspace of [e] holds: its TEMP slots (shared by values of
 * one aval whose lives do not overlap: the planner's liveness) and its
 * scratch arrays, and the sub-plans' workspaces. */
static double temp_bytes(const Exec *e) {
  double t = 0;
  for (int i = 0; i < e->nslots; i++)
    if (e->slots[i].kind == SL_TEMP) t += aval_bytes(&e->slots[i].aval);
  for (int i = 0; i < e->nscratch; i++) t += aval_bytes(&e->scratch[i]);
  for (int i = 0; i < e->nsteps; i++)
    if (e->steps[i].kind == ST_HIGHER) t += sub_temp(&e->steps[i]);
  return t;
}

static void exec_memory(const Exec *e, AotMemory *m) {
  for (int i = 0; i < e->nslots; i++) {
    double b = aval_bytes(&e->slots[i].aval);
    switch (e->slots[i].kind) {
    case SL_INPUT: m->argument += b; break;
    case SL_OUTPUT: m->output += b; break;
    case SL_CONST: m->constant += b; break;
    case SL_TEMP: case SL_VIEW: break;
    }
  }
  /* an output copied from a temporary is a new buffer; one that passes
   * an input or a constant through is that buffer (compile.c's
   * copy_results takes a reference, as JAX forwards such an input) */
  for (int i = 0; i < e->nout; i++)
    if (e->out_copy[i] && (e->slots[e->out_slot[i]].kind == SL_TEMP ||
                           e->slots[e->out_slot[i]].kind == SL_VIEW))
      m->output += aval_bytes(&e->slots[e->out_slot[i]].aval);
  m->temp += temp_bytes(e);
}

/* Whether a block of shape [block] cut from a C-contiguous [global] is
 * itself contiguous: below its first dimension longer than one, every
 * dimension is whole. */
static bool block_contiguous(const AVal *global, const AVal *block) {
  int d = 0;
  while (d < block->ndim && block->shape[d] <= 1) d++;
  for (int k = d + 1; k < block->ndim; k++)
    if (block->shape[k] != global->shape[k]) return false;
  return true;
}

/* The copies a run of shard_map step [s]'s body makes of its argument
 * blocks: a block the body reads in place (a fused loop, a scan) must be
 * contiguous (compile.c's bind_args), and a device's block of a global
 * array split along a later dimension is a strided view. */
static double block_copies(const Plan *outer, const Step *s, const Plan *body) {
  const Exec *e = body->exec;
  double t = 0;
  for (int i = 0; i < e->nin && i < s->eqn->nin; i++) {
    if (!e->in_contig[i]) continue;
    AVal global;
    plan_atom_aval(outer, &s->eqn->in[i], &global);
    const AVal *block = &e->slots[e->in_slot[i]].aval;
    if (!block_contiguous(&global, block)) t += aval_bytes(block);
  }
  return t;
}

/* The shard_map body a step runs on every device, or NULL. */
static Plan *device_body(const Step *s) {
  Value *mv = params_get(&s->eqn->params, "mesh");
  return mv && mv->type == V_MESH ? cmp_param_plan(s->eqn, "jaxpr") : NULL;
}

int aot_memory(Plan *p, AotMemory *m) {
  memset(m, 0, sizeof *m);
  if (cmp_compile(p) < 0) return -1;
  const Exec *e = p->exec;
  bool all_sm = e->nsteps > 0;
  for (int i = 0; i < e->nsteps && all_sm; i++) all_sm = device_body(&e->steps[i]) != NULL;
  if (!all_sm) {
    exec_memory(e, m);
    return 0;
  }
  /* a shard_map call: each device holds its blocks and its body's
   * workspace, the calls one after another (the largest workspace) */
  double temp = 0;
  for (int i = 0; i < e->nsteps; i++) {
    AotMemory b = {0};
    Plan *body = device_body(&e->steps[i]);
    exec_memory(body->exec, &b);
    b.temp += block_copies(p, &e->steps[i], body);
    m->argument += b.argument;
    m->output += b.output;
    m->constant += b.constant;
    if (b.temp > temp) temp = b.temp;
  }
  m->temp = temp;
  return 0;
}
