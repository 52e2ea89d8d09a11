/*
 * trace.c - the tracer (trace.h).
 *
 * A trace remembers each outside value it resolved (a constvar at top
 * level, a capture below) by pointer, so a closure used ten times is one
 * constvar, as JAX hoists it once.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "array/array.h"
#include "lang/eval.h"
#include "base/mem.h"
#include "lang/ops.h"
#include "array/print.h"
#include "base/intern.h"
#include "spmd/collective.h"
#include "spmd/device.h"
#include "spmd/shardmap.h"
#include "spmd/sharding.h"
#include "transform/partition.h"
#include "transform/trace.h"

struct Trace {
  unsigned id;
  bool top;
  Plan *plan;          /* owned */
  Trace *parent;       /* the enclosing trace of this thread */
  int next;            /* number of outside values resolved */
  int cap;
  Value **ext;         /* owned: the outside values */
  int *ext_var;        /* their variables */
  int ncapture;        /* captures (non-top), in order, are ext entries */
  bool linear;         /* trace_begin_linear: not the current trace */
  NamedShape *axes;    /* an xmap body's named axes in scope (owned), or NULL */
  Value *resources;    /* their axis_resources (a dict, owned), or NULL */
  Trace *next_linear;  /* the thread's open linear traces */
};

static _Thread_local Trace *cur_trace;
static _Thread_local Trace *linear_traces;
static _Thread_local bool transformed_operand;
static _Thread_local TracerKind transformed_kind;
static _Thread_local unsigned transformed_id;
static _Thread_local bool true_first;   /* trace_set_true_first */

bool trace_transformed_operand(void) {
  bool b = transformed_operand;
  transformed_operand = false;
  return b;
}

TracerKind trace_transformed_kind(void) { return transformed_kind; }
unsigned trace_transformed_id(void) { return transformed_id; }
static atomic_uint next_trace_id = 1;

unsigned trace_next_id(void) { return atomic_fetch_add(&next_trace_id, 1); }

Tracer *tracer_alloc(TracerKind kind, unsigned id, const AVal *a) {
  /* zeroed but for the aval's unused dimensions (most of its bytes): a
   * tracer is made for every operation a transformation sees */
  Tracer *x = shm_malloc(sizeof *x);
  if (!x) return err_nomem();
  memset(x, 0, offsetof(Tracer, aval));
  memset(&x->aval + 1, 0, sizeof *x - offsetof(Tracer, aval) - sizeof x->aval);
  val_init(&x->hdr, V_TRACER);
  x->kind = kind;
  x->trace_id = id;
  x->var = -1;
  aval_copy(&x->aval, a);
  x->line = eval_current_loc().line;
  return x;
}

Trace *trace_current(void) { return cur_trace; }
Plan *trace_plan(Trace *t) { return t->plan; }

unsigned trace_id_of(const Trace *t) { return t->id; }

Trace *trace_begin(const char *fname, bool top) {
  Trace *t = shm_calloc(1, sizeof *t);
  if (!t) return err_nomem();
  if (!(t->plan = plan_new(fname))) {
    shm_free(t);
    return NULL;
  }
  t->id = trace_next_id();
  t->top = top;
  t->parent = cur_trace;
  cur_trace = t;
  return t;
}

Trace *trace_begin_linear(const char *fname) {
  Trace *t = trace_begin(fname, false);
  if (!t) return NULL;
  cur_trace = t->parent;
  t->linear = true;
  t->next_linear = linear_traces;
  linear_traces = t;
  return t;
}

/* The open linear trace of this thread with [id], or NULL. */
static Trace *linear_find(unsigned id) {
  for (Trace *t = linear_traces; t; t = t->next_linear)
    if (t->id == id) return t;
  return NULL;
}

/* [x]'s named shape set to [ns] (copied; NULL or empty: none).  0 or -1. */
static int tracer_set_named(Tracer *x, const NamedShape *ns) {
  if (!ns || !ns->n) return 0;
  if (!(x->named = shm_malloc(sizeof *x->named))) return err_nomem(), -1;
  *x->named = *ns;
  return 0;
}

static Value *tracer_new(Trace *t, int var, const char *name) {
  Tracer *x = tracer_alloc(TR_STAGE, t->id, &t->plan->vars[var]);
  if (!x) return NULL;
  if (tracer_set_named(x, plan_var_named(t->plan, var)) < 0) {
    shm_free(x);
    return NULL;
  }
  x->var = var;
  x->name = name;
  return &x->hdr;
}

Value *trace_new_arg(Trace *t, const AVal *a, const char *name) {
  return trace_new_arg_named(t, a, NULL, name);
}

Value *trace_new_arg_named(Trace *t, const AVal *a, const NamedShape *ns, const char *name) {
  int v = plan_add_var(t->plan, a);
  if (v < 0 || plan_add_invar(t->plan, v) < 0 || plan_set_named(t->plan, v, ns) < 0) return NULL;
  return tracer_new(t, v, name);
}

const NamedShape *trace_named(Value *v) {
  return IS_STAGE_TRACER(v) ? ((Tracer *)v)->named : NULL;
}

int trace_set_axes(Trace *t, const NamedShape *axes, Value *resources) {
  if (!t->axes && !(t->axes = shm_malloc(sizeof *t->axes))) return err_nomem(), -1;
  *t->axes = *axes;
  if (t->resources) val_decref(t->resources);
  t->resources = resources && resources->type == V_DICT ? val_incref(resources) : NULL;
  return 0;
}

/* The mesh axes named axis [name] is mapped to by the innermost body
 * trace that has it in scope (a borrowed str or tuple), or NULL. */
static Value *axis_resources_of(const Trace *from, const char *name) {
  for (const Trace *t = from; t; t = t->parent)
    if (t->axes && plan_named_find(t->axes, name) >= 0)
      return t->resources ? dict_get_str(t->resources, name) : NULL;
  return NULL;
}

/* The mesh axis [a] and [b] (each a str or tuple of them) share, or NULL. */
static const char *shared_mesh_axis(Value *a, Value *b) {
  size_t na = 1, nb = 1;
  Value *const *ia = &a, *const *ib = &b;
  if ((a->type != V_STR && !val_seq(a, &na, &ia)) || (b->type != V_STR && !val_seq(b, &nb, &ib)))
    return NULL;
  for (size_t i = 0; i < na; i++)
    for (size_t k = 0; k < nb; k++)
      if (ia[i]->type == V_STR && ib[k]->type == V_STR && !strcmp(str_cstr(ia[i]), str_cstr(ib[k])))
        return str_cstr(ia[i]);
  return NULL;
}

/* Two names of [un] (the operands' named shapes, in order) mapped to a
 * common mesh axis: the eager call's error (batch.c), the later name
 * first.  0 or -1. */
static int axes_clash(const Trace *t, const NamedShape *un) {
  for (int j = un->n - 1; j > 0; j--) {
    Value *rj = axis_resources_of(t, un->name[j]);
    for (int i = j - 1; rj && i >= 0; i--) {
      Value *ri = axis_resources_of(t, un->name[i]);
      const char *ax = ri ? shared_mesh_axis(rj, ri) : NULL;
      if (ax)
        return err_set(ERR_VALUE, "xmap: the named axes '%s' and '%s' are both mapped to mesh axis "
                                  "'%s', so they cannot meet in one value (line %d); reduce one of "
                                  "them first, or map them to different mesh axes",
                       un->name[j], un->name[i], ax, eval_current_loc().line), -1;
    }
  }
  return 0;
}

bool trace_axis_size(const char *name, int64_t *size) {
  for (Trace *t = cur_trace; t; t = t->parent) {
    for (int i = 0; t->axes && i < t->axes->n; i++)
      if (!strcmp(t->axes->name[i], name)) {
        *size = t->axes->size[i];
        return true;
      }
  }
  return false;
}

/* Where [name] came into scope: the outermost body's names first, each
 * body's in its xmap's order (the order named shapes print in). */
static int axis_rank(const Trace *from, const char *name) {
  int depth = 0, rank = -1;
  for (const Trace *t = from; t; t = t->parent, depth++)
    for (int i = 0; t->axes && i < t->axes->n; i++)
      if (t->axes->name[i] == name) rank = depth * PLAN_MAXNAMES + (PLAN_MAXNAMES - 1 - i);
  return rank;   /* larger: further out, earlier */
}

/* The effect of [prim] on named shapes: its row's (CollRules.named, a
 * collective's or pdot's); none for a primitive that names no axis. */
static CollNamed named_effect(PrimId prim) {
  const CollRules *c = prim_table[prim].rules.coll;
  return c ? c->named : COLL_NAMED_KEEPS;
}

/* The named shape of the outputs of [prim] over [in] in [t]: the union
 * of the operands', then the names the equation removes or adds (those
 * its `axes`, else `axis_name`, parameter lists). */
static int out_named(Trace *t, PrimId prim, const Params *p, int nin, Value **in, NamedShape *ns) {
  ns->n = 0;
  for (int i = 0; i < nin; i++) {
    const NamedShape *o = IS_TRACER(in[i]) ? ((Tracer *)in[i])->named : NULL;
    for (int k = 0; o && k < o->n; k++)
      if (plan_named_add(ns, o->name[k], o->size[k]) < 0) return -1;
  }
  if (axes_clash(t, ns) < 0) return -1;
  CollNamed effect = named_effect(prim);
  Value *axes = p && effect != COLL_NAMED_KEEPS ? params_get(p, "axes") : NULL;
  if (p && effect != COLL_NAMED_KEEPS && !axes) axes = params_get(p, "axis_name");
  size_t n = 1;
  Value *const *items = &axes;
  if (axes && axes->type != V_STR && !val_seq(axes, &n, &items)) axes = NULL;
  for (size_t i = 0; axes && i < n; i++) {
    if (items[i]->type != V_STR) continue;
    const char *nm = intern_cstr(str_cstr(items[i]));
    int64_t size;
    if (effect == COLL_NAMED_REMOVES)
      plan_named_remove(ns, nm);
    else if (trace_axis_size(nm, &size) && plan_named_add(ns, nm, size) < 0)
      return -1;
  }
  for (int i = 1; i < ns->n; i++)   /* in the order the names came in */
    for (int j = i; j > 0 && axis_rank(t, ns->name[j - 1]) < axis_rank(t, ns->name[j]); j--) {
      const char *nm = ns->name[j];
      int64_t sz = ns->size[j];
      ns->name[j] = ns->name[j - 1], ns->size[j] = ns->size[j - 1];
      ns->name[j - 1] = nm, ns->size[j - 1] = sz;
    }
  return 0;
}

/* ==== resolving operands ================================================== */

static int ext_find(Trace *t, Value *v) {
  for (int i = 0; i < t->next; i++)
    if (t->ext[i] == v) return t->ext_var[i];
  return -1;
}

static int ext_push(Trace *t, Value *v, int var) {
  if (t->next == t->cap) {
    int n = t->cap ? t->cap * 2 : 8;
    Value **e = shm_realloc(t->ext, sizeof(Value *) * (size_t)n);
    if (e) t->ext = e;
    int *ev = e ? shm_realloc(t->ext_var, sizeof(int) * (size_t)n) : NULL;
    if (!ev) {
      err_nomem();
      return -1;
    }
    t->ext_var = ev;
    t->cap = n;
  }
  t->ext[t->next] = val_incref(v);
  t->ext_var[t->next++] = var;
  return var;
}

/* True when the trace with [id] encloses (or is) [t]. */
static bool trace_encloses(const Trace *t, unsigned id) {
  for (; t; t = t->parent)
    if (t->id == id) return true;
  return false;
}

/* An outside value of [t]: a constvar (top) or a capture (nested). */
static int trace_outside(Trace *t, Value *v, const AVal *a) {
  int var = ext_find(t, v);
  if (var >= 0) return var;
  if (t->top && IS_ARRAY(v)) {
    var = plan_add_const(t->plan, v);
  } else {
    AVal av = *a;
    var = plan_add_var(t->plan, &av);
    if (var >= 0 && IS_TRACER(v) && plan_set_named(t->plan, var, ((Tracer *)v)->named) < 0) return -1;
    t->ncapture++;
  }
  return var < 0 ? -1 : ext_push(t, v, var);
}

int trace_atom(Trace *t, Value *v, PlanAtom *out) {
  out->lit = NULL;
  out->var = -1;
  if (IS_TRACER(v) && !IS_STAGE_TRACER(v)) {
    /* a linear plan keeps an outer differentiation's value as a residual;
     * a jit plan cannot stage one (its rules would be lost) */
    if (t->linear) {
      out->var = trace_outside(t, v, &((Tracer *)v)->aval);
      return out->var < 0 ? -1 : 0;
    }
    transformed_operand = true;
    transformed_kind = ((Tracer *)v)->kind;
    transformed_id = ((Tracer *)v)->trace_id;
    err_set(ERR_NOT_IMPLEMENTED, "a value being %s reached staged code (cond, while_loop, "
                                 "fori_loop, scan or shard_map under jit); transforming staged "
                                 "code is not implemented yet: pass it as an argument, or "
                                 "transform outside jit",
            IS_JVP_TRACER(v) ? "differentiated" : "batched (vmap)");
    return -1;
  }
  if (IS_TRACER(v)) {
    Tracer *x = (Tracer *)v;
    if (x->trace_id == t->id) {
      out->var = x->var;
      return 0;
    }
    if (!trace_encloses(t->parent, x->trace_id) && !linear_find(x->trace_id)) {
      err_set(ERR_VALUE, "a traced value (%s) escaped from the jit function that made it; "
                         "return it instead of keeping it in a variable", dt_short(x->aval.dtype));
      return -1;
    }
    out->var = trace_outside(t, v, &x->aval);
    return out->var < 0 ? -1 : 0;
  }
  if (!IS_ARRAY(v)) {
    err_set(ERR_TYPE, "expected an array, got '%s'", val_type_name(v));
    return -1;
  }
  Array *a = AS_ARRAY(v);
  if (a->buf->part && a->ndim > 0 && dev_ctx() && arr_partial_holds(a)) {
    /* on a device, its block of an array this process holds in part (a
     * residual of its own linearization, read by its own plan only): a
     * copy, as making the array whole is the host's collective */
    Array *c = arr_copy(a);
    if (!c) return -1;
    AVal av;
    aval_of(c, &av);
    av.vma = 0;
    out->var = trace_outside(t, &c->hdr, &av);
    val_decref(&c->hdr);
    return out->var < 0 ? -1 : 0;
  }
  /* a captured constant is read whole, on every device of a partitioned plan */
  if (a->buf->part && arr_make_whole(a) < 0) return -1;
  if (a->ndim == 0) {
    out->lit = v;
    return 0;
  }
  AVal av;
  aval_of(a, &av);
  av.vma = 0;
  out->var = trace_outside(t, v, &av);
  return out->var < 0 ? -1 : 0;
}

/* ==== recording ============================================================ */

/* Output tracers for the variables [vars]: a Tuple. */
static Value *tracers_for(Trace *t, int n, const int *vars) {
  Value *tup = tuple_new((size_t)n);
  if (!tup) return NULL;
  for (int i = 0; i < n; i++) {
    Value *x = tracer_new(t, vars[i], NULL);
    if (!x) {
      for (int j = i; j < n; j++) tuple_set_steal(tup, (size_t)j, val_incref(VAL_NONE));
      val_decref(tup);
      return NULL;
    }
    tuple_set_steal(tup, (size_t)i, x);
  }
  return tup;
}

void trace_set_true_first(bool on) { true_first = on; }

/* Resolves the operands and adds the equation and its output variables. */
static int record(Trace *t, PrimId prim, Params *params, int nin, Value **in, int nout,
                  const AVal *outs, const NamedShape *named, int *out_vars) {
  PlanAtom stack_atoms[8];
  NamedShape un;
  PlanAtom *atoms = nin <= 8 ? stack_atoms : shm_calloc((size_t)nin, sizeof *atoms);
  int rc = -1;
  if (!atoms) {
    err_nomem();
    goto out;
  }
  for (int i = 0; i < nin; i++)
    if (trace_atom(t, in[i], &atoms[i]) < 0) goto out;
  if (!named && out_named(t, prim, params, nin, in, &un) < 0) goto out;
  for (int i = 0; i < nout; i++)
    if ((out_vars[i] = plan_add_var(t->plan, &outs[i])) < 0 ||
        plan_set_named(t->plan, out_vars[i], named ? &named[i] : &un) < 0)
      goto out;
  rc = plan_add_eqn(t->plan, prim, params, nin, atoms, nout, out_vars, eval_current_loc());
  if (rc >= 0) t->plan->eqns[rc].auto_axes = sharding_auto_axes();
  if (rc >= 0) t->plan->eqns[rc].true_first = true_first;
  if (rc >= 0 && part_traced_check(t) < 0) rc = -1;   /* Explicit mode's errors, as bound */
out:
  params_clear(params);
  if (atoms != stack_atoms) shm_free(atoms);
  return rc < 0 ? -1 : 0;
}

/* Where an operation on [in] is recorded: the innermost linear trace
 * that owns one of the operands, else the current trace. */
static Trace *record_target(int nin, Value **in) {
  Trace *best = NULL;
  for (int i = 0; linear_traces && i < nin; i++) {
    if (!IS_STAGE_TRACER(in[i])) continue;
    Trace *l = linear_find(((Tracer *)in[i])->trace_id);
    if (l && (!best || l->id > best->id)) best = l;
  }
  return best && (!cur_trace || best->id > cur_trace->id) ? best : cur_trace;
}

Value *trace_emit(PrimId prim, Params *params, int nin, Value **in, int nout,
                  const AVal *outs) {
  return trace_emit_named(prim, params, nin, in, nout, outs, NULL);
}

Value *trace_emit_named(PrimId prim, Params *params, int nin, Value **in, int nout,
                        const AVal *outs, const NamedShape *named) {
  Trace *t = record_target(nin, in);
  int stack_vars[9] = {0};
  int *vars = nout <= 8 ? stack_vars : shm_calloc((size_t)nout + 1, sizeof(int));
  if (!t || !vars) {
    params_clear(params);
    if (vars != stack_vars) shm_free(vars);
    return t ? err_nomem() : err_set(ERR_VALUE, "%s: not tracing", prim_table[prim].name);
  }
  Value *r = NULL;
  if (record(t, prim, params, nin, in, nout, outs, named, vars) == 0) r = tracers_for(t, nout, vars);
  if (vars != stack_vars) shm_free(vars);
  return r;
}

/* A copy of [p] with new references to its values. */
static void params_copy(Params *dst, const Params *p) {
  params_init(dst);
  for (int i = 0; p && i < p->n; i++) params_add(dst, p->p[i].name, val_incref(p->p[i].value));
}

Value *trace_apply(PrimId id, int nin, Value **in, const Params *p) {
  Trace *t = record_target(nin, in);
  if (!t) return err_set(ERR_VALUE, "a traced value escaped from the jit function that made it; "
                                    "return it instead of keeping it in a variable");
  AVal stack_av[8], outs[8];
  AVal *av = nin <= 8 ? stack_av : shm_calloc((size_t)nin, sizeof(AVal));
  if (!av) return err_nomem();
  Value *r = NULL;
  int nout = prim_table[id].nout;
  for (int i = 0; i < nin; i++)
    if (ops_aval(in[i], &av[i]) < 0) goto out;
  if (nout < 0 || nout > 8 || prim_infer(id, av, nin, p, outs) < 0) goto out;
  Params q;
  params_copy(&q, p);
  Value *tup = NULL;
  int vars[9] = {0};   /* nout <= 8 */
  if (record(t, id, &q, nin, in, nout, outs, NULL, vars) == 0) tup = tracers_for(t, nout, vars);
  if (tup && nout == 1) {
    r = val_incref(tuple_get(tup, 0));
    val_decref(tup);
  } else {
    r = tup;
  }
out:
  if (av != stack_av) shm_free(av);
  return r;
}

/* ==== ending ================================================================= */

static void trace_free(Trace *t) {
  shm_free(t->axes);
  if (t->resources) val_decref(t->resources);
  for (int i = 0; i < t->next; i++) val_decref(t->ext[i]);
  shm_free(t->ext);
  shm_free(t->ext_var);
  val_decref(&t->plan->hdr);
  shm_free(t);
}

static void trace_pop(Trace *t) {
  if (t->linear) {
    for (Trace **l = &linear_traces; *l; l = &(*l)->next_linear)
      if (*l == t) {
        *l = t->next_linear;
        break;
      }
    return;
  }
  if (cur_trace == t) cur_trace = t->parent;
}

void trace_abort(Trace *t) {
  if (!t) return;
  trace_pop(t);
  trace_free(t);
}

void trace_caps_free(Value **caps, int ncap) {
  for (int i = 0; caps && i < ncap; i++) val_decref(caps[i]);
  shm_free(caps);
}

/* Moves the captures to the front of the invars and hands their values out. */
static int take_captures(Trace *t, Value ***caps, int *ncap) {
  *caps = shm_calloc((size_t)t->ncapture + 1, sizeof(Value *));
  *ncap = 0;
  if (!*caps) {
    err_nomem();
    return -1;
  }
  for (int i = 0; i < t->next; i++) {
    if (t->top && IS_ARRAY(t->ext[i])) continue;
    if (plan_insert_invar(t->plan, *ncap, t->ext_var[i]) < 0) return -1;
    (*caps)[(*ncap)++] = val_incref(t->ext[i]);
  }
  return 0;
}

Plan *trace_end(Trace *t, int nout, Value **outs, Value ***caps, int *ncap) {
  PlanAtom stack_atoms[8];
  PlanAtom *atoms = nout <= 8 ? stack_atoms : shm_calloc((size_t)nout, sizeof *atoms);
  Plan *p = NULL;
  *caps = NULL;
  *ncap = 0;
  if (!atoms) {
    err_nomem();
    goto out;
  }
  int i = 0;
  while (i < nout && trace_atom(t, outs[i], &atoms[i]) == 0) i++;
  if (i < nout || plan_set_outs(t->plan, nout, atoms) < 0) goto out;
  if (take_captures(t, caps, ncap) < 0) {
    trace_caps_free(*caps, *ncap);
    *caps = NULL;
    *ncap = 0;
    goto out;
  }
  p = (Plan *)val_incref(&t->plan->hdr);
out:
  if (atoms != stack_atoms) shm_free(atoms);
  trace_pop(t);
  trace_free(t);
  return p;
}

/* ==== the hooks ================================================================ */

int trace_aval(Value *v, AVal *out) {
  aval_copy(out, &((Tracer *)v)->aval);
  return 0;
}

int trace_truth_error(Value *v) {
  Tracer *x = (Tracer *)v;
  char av[256], what[400];
  aval_str(av, sizeof av, x->aval.dtype, x->aval.ndim, x->aval.shape);
  if (x->name)
    snprintf(what, sizeof what, "the traced argument '%s' (%s)", x->name, av);
  else if (x->line > 0)
    snprintf(what, sizeof what, "the traced value %s computed at line %d", av, x->line);
  else
    snprintf(what, sizeof what, "the traced value %s", av);
  err_set(ERR_TYPE, "the truth value of %s is not known while tracing for jit; "
                    "use cond, switch, while_loop, fori_loop or scan for control flow on "
                    "traced values, or mark the argument static", what);
  return -1;
}

static void tracer_free(Value *v) {
  Tracer *x = (Tracer *)v;
  if (x->primal) val_decref(x->primal);
  if (x->tangent) val_decref(x->tangent);
  if (x->batched) val_decref(x->batched);
  shm_free(x->named);
  shm_free(v);
}

/* "f32[5]{batch=20, b=3}": the aval, then the named axes the value
 * carries (LANGUAGE.md §10), into [buf]; false when it carries none. */
static bool named_aval_str(Value *v, const AVal *a, char *buf, size_t cap) {
  Value *ns = ops_named_shape_hook ? ops_named_shape_hook(v) : NULL;
  if (!ns) {
    err_clear();
    return false;
  }
  Dict *d = (Dict *)ns;
  bool named = d->len > 0;
  if (named) {
    aval_str(buf, cap, a->dtype, a->ndim, a->shape);
    size_t o = strlen(buf);
    o += (size_t)snprintf(buf + o, cap - o, "{");
    for (size_t i = d->len; i-- > 0 && o < cap;) {   /* outermost name first */
      int64_t n = 0;
      arr_to_index(d->vals[i], &n);
      o += (size_t)snprintf(buf + o, cap - o, "%s%s=%lld", i + 1 < d->len ? ", " : "",
                            str_cstr(d->keys[i]), (long long)n);
    }
    if (o < cap) snprintf(buf + o, cap - o, "}");
  }
  val_decref(ns);
  return named;
}

static Value *tracer_repr(Value *v) {
  Tracer *x = (Tracer *)v;
  char named[320];
  if (x->kind == TR_BATCH && named_aval_str(v, &x->aval, named, sizeof named))
    return str_printf("Traced<%s>", named);
  if (x->named) {   /* in a staged xmap body: the names it carries, in order */
    aval_str(named, sizeof named, x->aval.dtype, x->aval.ndim, x->aval.shape);
    size_t o = strlen(named);
    for (int i = 0; i < x->named->n && o < sizeof named; i++)
      o += (size_t)snprintf(named + o, sizeof named - o, "%s%s=%lld", i ? ", " : "{",
                            x->named->name[i], (long long)x->named->size[i]);
    return str_printf("Traced<%s}>", named);
  }
  /* a value being differentiated or batched eagerly: its value shows (the
   * primal, the batch), as JAX shows a ConcreteArray, so a debugger stop
   * in a function grad runs prints numbers */
  Value *inner = x->kind == TR_JVP ? x->primal : x->kind == TR_BATCH ? x->batched : NULL;
  while (inner && IS_TRACER(inner) && ((Tracer *)inner)->kind != TR_STAGE)
    inner = ((Tracer *)inner)->kind == TR_JVP ? ((Tracer *)inner)->primal
                                               : ((Tracer *)inner)->batched;
  if (inner && !IS_TRACER(inner)) {
    Value *r = val_repr(inner);
    Value *out = r ? str_printf("Traced<%s>with<%s>", str_cstr(r),
                                x->kind == TR_JVP ? "JVP" : "vmap")
                   : NULL;
    if (r) val_decref(r);
    return out;
  }
  char av[256];
  aval_str(av, sizeof av, x->aval.dtype, x->aval.ndim, x->aval.shape);
  return str_printf("Traced<%s>", av);
}

static KindApply kind_apply[TR_KINDS];
static KindTruth kind_truth[TR_KINDS];

void trace_set_kind(TracerKind kind, KindApply apply, KindTruth truth) {
  kind_apply[kind] = apply;
  kind_truth[kind] = truth;
}

/* The traces re-entered (trace_reenter), innermost last: tracers of
 * reentered[i].id rank as reentered[i].level while it is. */
static _Thread_local struct {
  unsigned id, level;
} reentered[TRACE_REENTRY_MAX];
static _Thread_local int nreentered;

TraceReentry trace_reenter(unsigned id) {
  TraceReentry prev = {nreentered};
  if (nreentered < TRACE_REENTRY_MAX) {
    reentered[nreentered].id = id;
    reentered[nreentered].level = trace_next_id();
    nreentered++;
  }
  return prev;
}

void trace_reenter_end(TraceReentry prev) { nreentered = prev.depth; }

/* The nesting rank of tracer [x]: its trace's id, or the level of its
 * trace's innermost re-entry. */
static unsigned rank_of(const Tracer *x) {
  for (int i = nreentered - 1; i >= 0; i--)
    if (reentered[i].id == x->trace_id) return reentered[i].level;
  return x->trace_id;
}

/* When an operand is a value a shard_map body closes over, which a
 * trace of another thread traces: [in] with this device's blocks of
 * them in their place (shardmap_lifted) applied again into [*r], true. */
static bool apply_lifted(PrimId id, int nin, Value **in, const Params *p, Value **r) {
  int k = 0;
  while (k < nin && !(IS_TRACER(in[k]) && shardmap_lifted(in[k]))) k++;
  if (k == nin) return false;
  Value *mine[16], **v = nin <= 16 ? mine : shm_malloc(sizeof(Value *) * (size_t)nin);
  if (!v) return (*r = err_nomem()), true;
  for (int i = 0; i < nin; i++) {
    Value *b = IS_TRACER(in[i]) ? shardmap_lifted(in[i]) : NULL;
    v[i] = b ? b : in[i];
  }
  *r = prim_apply(id, nin, v, p);
  if (v != mine) shm_free(v);
  return true;
}

Value *trace_dispatch(PrimId id, int nin, Value **in, const Params *p) {
  Value *lifted;
  if (apply_lifted(id, nin, in, p, &lifted)) return lifted;
  Tracer *top = NULL;
  for (int i = 0; i < nin; i++)
    if (IS_TRACER(in[i]) && (!top || rank_of((Tracer *)in[i]) > rank_of(top)))
      top = (Tracer *)in[i];
  if (top && top->kind != TR_STAGE && kind_apply[top->kind])
    return kind_apply[top->kind](top, id, nin, in, p);
  return trace_apply(id, nin, in, p);
}

static int tracer_truth(Value *v) {
  Tracer *x = (Tracer *)v;
  if (x->kind != TR_STAGE && kind_truth[x->kind]) return kind_truth[x->kind](v);
  return trace_truth_error(v);
}

/* prim_tracing_hook: whether this thread has a trace open. */
static bool tracing(void) { return cur_trace != NULL; }

void trace_register(void) {
  val_register_free(V_TRACER, tracer_free);
  val_register_truth(V_TRACER, tracer_truth);
  print_register(V_TRACER, tracer_repr, tracer_repr);
  prim_trace_hook = trace_dispatch;
  prim_tracing_hook = tracing;
  prim_aval_hook = trace_aval;
  prim_staged_hook = IS_STAGE_TRACER;
}
