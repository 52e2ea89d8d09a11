/*
 * control_rules.c - the rules of the control-flow primitives, cond,
 * while and scan (higher.h), side by side for each: how the compiled
 * executor prepares and runs its equation (jit), how xmap's plan
 * interpreter evaluates it, whether xmap's lowering can and what named
 * shapes its results carry in an xmap body (xmap under jit), and, for
 * while, the forward-mode and batching rules of a staged while_loop
 * whose carry is being transformed (grad, vmap).  control.c stages the
 * equations; the built-ins are there.
 *
 * Semantics: jax.lax.cond/switch, while_loop, scan and their rules in
 * jax/_src/lax/control_flow (conditionals.py, loops.py): a cond runs the
 * branch its clamped index picks; a while runs its body while its
 * predicate on the carry holds; a scan runs its body over the leading
 * axis of its xs, reversed when asked, stacking the ys.
 *
 * In the executor a loop keeps its carries in two sets of scratch arrays
 * that the iterations alternate between, so an iteration allocates
 * nothing; a body whose steps are all row loops runs from tapes
 * (compile_impl.h).
 */
#include "lang/ops.h"
#include "lang/pytree.h"
#include "transform/ad.h"
#include "transform/batch.h"
#include "transform/compile_impl.h"
#include "transform/control.h"
#include "transform/higher.h"
#include "transform/trace.h"
#include "transform/xmap.h"
#include "base/timeline.h"

/* ==== named shapes in a staged xmap body ============================================= */

/* Adds the names of [in] to each of [ns]'s [n] named shapes. */
static int named_add_all(NamedShape *ns, int n, const NamedShape *in) {
  for (int i = 0; in && i < n; i++)
    for (int k = 0; k < in->n; k++)
      if (plan_named_add(&ns[i], in->name[k], in->size[k]) < 0) return -1;
  return 0;
}

/* Adds the names of sub-plan [pv]'s results to [ns]'s [n] named shapes,
 * result by result (nothing when [pv] is not a plan). */
static int named_add_plan(NamedShape *ns, int n, Value *pv) {
  Plan *sp = pv && IS_PLAN(pv) ? AS_PLAN(pv) : NULL;
  for (int i = 0; sp && i < n && i < sp->nout; i++)
    if (named_add_all(ns + i, 1, plan_var_named(sp, sp->outs[i].var)) < 0) return -1;
  return 0;
}

/* ==== cond ====================================================================== */

/* A cond's results vary along what its index ([ops][0]) varies along and
 * what any branch's results do. */
static int named_cond(const Params *p, int nops, Value **ops, int nout, NamedShape *out) {
  Value *br = params_get(p, "branches");
  if (named_add_all(out, nout, nops ? trace_named(ops[0]) : NULL) < 0) return -1;
  for (size_t b = 0; br && b < tuple_len(br); b++)
    if (named_add_plan(out, nout, tuple_get(br, b)) < 0) return -1;
  return 0;
}

static int prepare_cond(Exec *e, Step *s, const Plan *p) {
  (void)e, (void)p;
  Value *br = params_get(&s->eqn->params, "branches");
  if (!br) return err_set(ERR_VALUE, "cond without branches"), -1;
  for (size_t i = 0; i < tuple_len(br); i++)
    if (cmp_compile(AS_PLAN(tuple_get(br, i))) < 0) return -1;
  return 0;
}

static int run_cond(Step *s, Workspace *w) {
  Value *br = params_get(&s->eqn->params, "branches");
  int64_t n = (int64_t)tuple_len(br), i = arr_get_i64(w->slot[s->in[0]], 0);
  i = i < 0 ? 0 : i >= n ? n - 1 : i;
  Array **outs = cmp_step_outs(s, w);
  return cmp_run_into(AS_PLAN(tuple_get(br, (size_t)i)), cmp_step_ins(s, w, 1), outs);
}

/* In xmap's interpreter, cond, while and scan equations go through the
 * language's control flow, their sub-plans as the functions (xmap.h,
 * xmap_sub_fn): batched, staged or eager as an eager xmap body's would
 * be.  Each gives a tuple of the results. */

/* The new references in [v] released (NULL entries skipped). */
static void release(Value **v, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (v[i]) val_decref(v[i]);
}

/* xmap's interpreter: switch(index, branches, *operands), each branch
 * its sub-plan evaluated.  A tuple of the results. */
static Value *eval_cond(const PlanEqn *e, Value **in) {
  Value *br = params_get(&e->params, "branches");
  size_t nb = tuple_len(br);
  Value *fns = tuple_new(nb), **args = shm_calloc((size_t)e->nin + 2, sizeof(Value *)), *r = NULL;
  bool ok = fns && args;
  for (size_t i = 0; fns && i < nb; i++) {
    Value *f = ok ? xmap_sub_fn("branch", xmap_branch_call, tuple_get(br, i), 0, NULL, 0) : NULL;
    ok = ok && f;
    tuple_set_steal(fns, i, f ? f : val_incref(VAL_NONE));
  }
  if (ok) {
    args[0] = in[0], args[1] = fns;
    shm_memcpy(args + 2, in + 1, sizeof(Value *) * (size_t)(e->nin - 1));
    CallArgs c = {.nargs = e->nin + 1, .args = args};
    r = ctl_switch(&c);
  } else if (!err_occurred()) {
    err_nomem();
  }
  shm_free(args);
  if (fns) val_decref(fns);
  return r;
}

static bool lowerable_cond(const PlanEqn *e) {
  return xmap_subs_lowerable(params_get(&e->params, "branches"));
}

static const HigherRules cond_rules = {
    .prepare = prepare_cond,
    .run = run_cond,
    .named = named_cond,
    .eval = eval_cond,
    .eval_tuple = true,
    .lowerable = lowerable_cond,
};

/* ==== the loops' scratch ============================================================ */

/* Scratch of avals of [body]'s outputs [from, to). */
static int scratch_outs(Exec *e, Plan *body, int from, int to) {
  for (int i = from; i < to; i++) {
    AVal a;
    plan_atom_aval(body, &body->outs[i], &a);
    if (cmp_add_scratch(e, &a) < 0) return -1;
  }
  return 0;
}

/* The two carry sets of a loop of [ncarry] carries over [body]. */
static int carry_sets(Exec *e, Plan *body, int ncarry) {
  return scratch_outs(e, body, 0, ncarry) < 0 || scratch_outs(e, body, 0, ncarry) < 0 ? -1 : 0;
}

/* Most carries whose in-place updates a loop follows (loop_dest); a loop
 * with more copies the rest, as before. */
#define LOOP_IN_PLACE_MAX 16

/* The carry arrays one iteration of a loop over [body] (its carry k its
 * input nconsts + k and output k) writes: [set], except that a carry the
 * body updates in place (cmp_out_in_place) is written over its current
 * array [cur], once that is the loop's own ([own]: not the step's
 * operands, which the caller holds): the carry buffer then changes in
 * place across iterations, as XLA's while does, instead of being copied
 * whole each time.  Built in [buf] (LOOP_IN_PLACE_MAX entries) when any
 * carry is. */
static Array **loop_dest(const Exec *body, int nconsts, int ncarry, Array **set, Array **cur,
                         bool own, Array **buf) {
  if (!own || ncarry > LOOP_IN_PLACE_MAX) return set;
  bool any = false;
  for (int k = 0; k < ncarry; k++) {
    bool here = cmp_out_in_place(body, k, nconsts + k);
    buf[k] = here ? cur[k] : set[k];
    any |= here;
  }
  return any ? buf : set;
}

/* ==== while ======================================================================= */

/* ---- while: the compiled step ---- */

/* while: the predicate, then two carry sets. */
static int prepare_while(Exec *e, Step *s, const Plan *p) {
  (void)p;
  Plan *body = cmp_param_plan(s->eqn, "body_jaxpr"), *cond = cmp_param_plan(s->eqn, "cond_jaxpr");
  AVal pred;
  if (!body || cmp_compile(body) < 0 || !cond || cmp_compile(cond) < 0) return -1;
  plan_atom_aval(cond, &cond->outs[0], &pred);
  if (cmp_add_scratch(e, &pred) < 0) return -1;
  return carry_sets(e, body, s->nout);
}

/* Whether the 0-d predicate [pred] is true; [data] is its bool element,
 * found once per loop (NULL: read it through its dtype). */
static bool pred_true(const Array *pred, const uint8_t *data) {
  return data ? *data != 0 : arr_get_i64(pred, 0) != 0;
}

/* The arrays a loop plan reads: [consts] then [carry], gathered in [ins]. */
static Array **loop_ins(Array **ins, Array **consts, int64_t nconsts, Array **carry, int ncarry) {
  shm_memcpy(ins, consts, sizeof(Array *) * (size_t)nconsts);
  shm_memcpy(ins + nconsts, carry, sizeof(Array *) * (size_t)ncarry);
  return ins;
}

/* Tapes of a while loop's cond and body for each of the two carry sets:
 * tc[j] reads set j, tb[j] reads set j and writes set j ^ 1. */
static bool while_tapes(Step *s, Workspace *w, Held *cond, Held *body, int64_t cn, int64_t bn,
                        Tape *tc, Tape *tb) {
  if (!cond->e->tapeable || !body->e->tapeable || tl_recording()) return false;
  Array **cconst = cmp_step_ins(s, w, 0), *pred = w->scratch[s->scratch];
  Array **bins = cmp_body_ins(s, w);
  Array **set[2] = {w->scratch + s->scratch + 1, w->scratch + s->scratch + 1 + s->nout};
  for (int j = 0; j < 2; j++)
    if (!cmp_tape_build(cond->e, cond->w, loop_ins(bins, cconst, cn, set[j], s->nout), &pred,
                        &tc[j]) ||
        !cmp_tape_build(body->e, body->w, loop_ins(bins, cconst + cn, bn, set[j], s->nout),
                        set[j ^ 1], &tb[j]))
      return false;
  return true;
}

/* The iterations of run_while from tapes: the carries start in set 1. */
static int while_run_tapes(Step *s, Workspace *w, const Tape *tc, const Tape *tb) {
  Array **cur = cmp_step_ins(s, w, 0) + (s->nin - s->nout), *pred = w->scratch[s->scratch];
  Array **set[2] = {w->scratch + s->scratch + 1, w->scratch + s->scratch + 1 + s->nout};
  const uint8_t *pdata = pred->dtype == DT_BOOL ? arr_data(pred) : NULL;
  for (int k = 0; k < s->nout; k++) cmp_copy_into(set[1][k], cur[k]);
  int j = 1;
  for (;;) {
    cmp_tape_run(&tc[j]);
    if (!pred_true(pred, pdata)) break;
    cmp_tape_run(&tb[j]);
    if (cmp_interrupted() < 0) return -1;
    j ^= 1;
  }
  for (int k = 0; k < s->nout; k++) cmp_copy_into(w->slot[s->out[k]], set[j][k]);
  return 0;
}

/* The iterations of run_while with both plans held. */
static int while_iterate(Step *s, Workspace *w, Held *cond, Held *body, int64_t cn, int64_t bn) {
  Array **cconst = cmp_step_ins(s, w, 0), *pred = w->scratch[s->scratch];
  Array **bins = cmp_body_ins(s, w);
  Array **cur = cconst + cn + bn, **set[2] = {w->scratch + s->scratch + 1,
                                              w->scratch + s->scratch + 1 + s->nout};
  const uint8_t *pdata = pred->dtype == DT_BOOL ? arr_data(pred) : NULL;
  Array *dest[2][LOOP_IN_PLACE_MAX];
  int which = 0;
  for (bool own = false;; own = true) {
    if (cmp_run_body(cond, cconst, (int)cn, cur, s->nout, NULL, 0, &pred, bins) < 0) return -1;
    if (!pred_true(pred, pdata)) break;
    Array **to = loop_dest(body->e, (int)bn, s->nout, set[which], cur, own, dest[which]);
    if (cmp_run_body(body, cconst + cn, (int)bn, cur, s->nout, NULL, 0, to, bins) < 0 ||
        cmp_interrupted() < 0)
      return -1;
    cur = to;
    which ^= 1;
  }
  for (int k = 0; k < s->nout; k++) cmp_copy_into(w->slot[s->out[k]], cur[k]);
  return 0;
}

static int run_while(Step *s, Workspace *w) {
  const Params *ps = &s->eqn->params;
  Plan *cond = AS_PLAN(params_get(ps, "cond_jaxpr")), *body = AS_PLAN(params_get(ps, "body_jaxpr"));
  int64_t cn, bn;
  if (params_int(ps, "cond_nconsts", &cn) < 0 || params_int(ps, "body_nconsts", &bn) < 0) return -1;
  Held hc, hb = {NULL, NULL};
  int rc = -1;
  if (cmp_held_take(cond, &hc) == 0 && cmp_held_take(body, &hb) == 0) {
    Tape tapes[4];
    rc = while_tapes(s, w, &hc, &hb, cn, bn, tapes, tapes + 2)
             ? while_run_tapes(s, w, tapes, tapes + 2)
             : while_iterate(s, w, &hc, &hb, cn, bn);
  }
  cmp_held_give(&hb);
  cmp_held_give(&hc);
  return rc;
}

/* ---- while: the batching rule (vmap) ---- */

/*
 * A staged while_loop whose carry is batched runs one staged loop on the
 * whole batch, as JAX's batching rule of while does with a batched
 * predicate: the loop goes on while any example's condition holds, the
 * body runs for every example, and the examples whose condition is false
 * keep their carry.  The cond and body run in the vmap's own batch trace
 * (the loop is staged inside it), so values they close over that the vmap
 * batches, and collectives over its axis name, work as eagerly.
 */
typedef struct WhileBatch {
  Opaque base;
  Value *cf, *bf, *tree;
  unsigned id;        /* the vmap's batch trace */
  int64_t size;
} WhileBatch;

static void whilebatch_free(Value *v) {
  WhileBatch *w = (WhileBatch *)v;
  val_decref(w->cf);
  val_decref(w->bf);
  val_decref(w->tree);
}

static const OpaqueType whilebatch_type = {"while_loop batching", whilebatch_free, NULL, NULL,
                                           NULL, NULL, NULL};

static bool is_array_leaf(Value *v) { return ops_is_array(v); }

/* [tree]'s leaves each through [fn](id, leaf): a new tree, or NULL. */
static Value *map_batch(Value *tree, unsigned id, int64_t size, bool wrap) {
  PyLeaves l = {0};
  if (pytree_flatten(tree, is_array_leaf, &l) < 0) return NULL;
  Value **vals = shm_calloc((size_t)l.n + 1, sizeof(Value *)), *r = NULL;
  int k = 0;
  for (; vals && k < l.n; k++)
    if (!(vals[k] = wrap ? batch_wrap(id, l.v[k], 0) : batch_unwrap_front(id, l.v[k], size))) break;
  int pos = 0;
  if (vals && k == l.n) r = pytree_replace(tree, is_array_leaf, vals, &pos);
  for (int i = 0; i < k; i++) val_decref(vals[i]);
  shm_free(vals);
  pytree_leaves_free(&l);
  return r;
}

/* The batched condition of the (unbatched) carry [c], inside a batch
 * trace opened for it: a batch tracer of bool examples, or NULL. */
static Value *wb_pred(WhileBatch *w, unsigned id, Value *c, Value **wrapped) {
  *wrapped = map_batch(c, id, w->size, true);
  return *wrapped ? val_call_n(w->cf, 1, wrapped) : NULL;
}

static Value *wb_cond(Value *self, const CallArgs *a) {
  WhileBatch *w = (WhileBatch *)self;
  unsigned id = w->id;
  TraceReentry prev = trace_reenter(id);
  Value *wrapped = NULL, *pred = wb_pred(w, id, a->args[0], &wrapped);
  Value *each = pred ? batch_unwrap_front(id, pred, w->size) : NULL;
  trace_reenter_end(prev);
  Value *r = NULL;
  if (each) {   /* any example's condition */
    Params p;
    params_init(&p);
    params_add(&p, "axes", val_int_tuple(1, (int64_t[]){0}));
    r = ops_apply(P_REDUCE_OR, 1, &each, &p);
    params_clear(&p);
    val_decref(each);
  }
  if (pred) val_decref(pred);
  if (wrapped) val_decref(wrapped);
  return r;
}

static Value *wb_body(Value *self, const CallArgs *a) {
  WhileBatch *w = (WhileBatch *)self;
  unsigned id = w->id;
  TraceReentry prev = trace_reenter(id);
  Value *wrapped = NULL, *pred = wb_pred(w, id, a->args[0], &wrapped), *r = NULL;
  Value *next = pred ? val_call_n(w->bf, 1, &wrapped) : NULL;
  PyLeaves ln = {0}, lo = {0};
  if (next && pytree_flatten(next, is_array_leaf, &ln) == 0 &&
      pytree_flatten(wrapped, is_array_leaf, &lo) == 0) {
    if (ln.n != lo.n) {
      err_set(ERR_TYPE, "while_loop body_fun must return a carry of the init's structure");
    } else {   /* each example keeps its carry once its condition fails */
      Value **vals = shm_calloc((size_t)ln.n + 1, sizeof(Value *));
      int k = 0;
      for (; vals && k < ln.n; k++) {
        Value *sel = ops_select(pred, ln.v[k], lo.v[k]);
        vals[k] = sel ? batch_unwrap_front(id, sel, w->size) : NULL;
        if (sel) val_decref(sel);
        if (!vals[k]) break;
      }
      int pos = 0;
      if (vals && k == ln.n) r = pytree_replace(w->tree, is_array_leaf, vals, &pos);
      for (int i = 0; i < k; i++) val_decref(vals[i]);
      shm_free(vals);
    }
  }
  pytree_leaves_free(&ln);
  pytree_leaves_free(&lo);
  trace_reenter_end(prev);
  if (next) val_decref(next);
  if (pred) val_decref(pred);
  if (wrapped) val_decref(wrapped);
  return r;
}

/* while's batching rule (HigherLoopRule): a while_loop under jit whose
 * carry [init] is batched by vmap trace [id] (0: the innermost in init),
 * or whose body closes over a value batched by it: one staged loop, run
 * by [loop], over the whole batch.  The result has init's structure,
 * batched along the vmap's axis.  NULL with the error set. */
static Value *while_batch(Value *cf, Value *bf, Value *init, unsigned id,
                          Value *(*loop)(Value *cf, Value *bf, Value *init)) {
  PyLeaves l = {0};
  if (pytree_flatten(init, is_array_leaf, &l) < 0) return NULL;
  bool innermost = id == 0;
  for (int i = 0; innermost && i < l.n; i++)
    if (IS_BATCH_TRACER(l.v[i]) && ((Tracer *)l.v[i])->trace_id > id)
      id = ((Tracer *)l.v[i])->trace_id;
  pytree_leaves_free(&l);
  int64_t size;
  if (!batch_trace_open(id, &size))
    return err_set(ERR_VALUE, "while_loop: a batched value of a finished vmap");
  WhileBatch *w = shm_calloc(1, sizeof *w);
  if (!w) return err_nomem();
  val_init(&w->base.hdr, V_OPAQUE);
  w->base.ot = &whilebatch_type;
  w->cf = val_incref(cf);
  w->bf = val_incref(bf);
  w->tree = val_incref(init);
  w->id = id;
  w->size = size;
  Value *carry = map_batch(init, id, size, false), *r = NULL;
  Value *cfn = carry ? bound_new("cond_fun", wb_cond, &w->base.hdr) : NULL;
  Value *bfn = cfn ? bound_new("body_fun", wb_body, &w->base.hdr) : NULL;
  Value *out = bfn ? loop(cfn, bfn, carry) : NULL;
  if (out) r = map_batch(out, id, size, true);
  Value *tmp[] = {carry, cfn, bfn, out};
  for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
    if (tmp[i]) val_decref(tmp[i]);
  val_decref(&w->base.hdr);
  return r;
}

/* ---- while: the forward-mode rule (jvp, grad) ---- */

/*
 * A staged while_loop whose carry is being differentiated (forward mode,
 * under jit) runs one staged loop on the carry's primals and tangents
 * together, as JAX's while JVP rule does: the condition sees the primals,
 * the body is the JVP of the user's body.  The leaves with tangents are
 * found as JAX's rule finds its nonzero tangents, by a fixpoint: those
 * with one in init, then each the body gives one (a staging of the body
 * that finds a new one stops at once, and the loop is staged again with
 * it; its tangent starts as zeros, weakly typed when the leaf is, as the
 * eager loop's first tangent for it is whatever the body computed).  The
 * body runs with the jvp trace re-entered above the loop's staging trace
 * (trace_reenter), so a value of that trace it closes over is
 * differentiated with the carry: its primal and tangent are the staged
 * body's captures, as the rule's consts are in JAX.
 */
/* Whether [v] is a JVP tracer of trace [id]. */
static bool is_jvp_of(Value *v, unsigned id) {
  return IS_JVP_TRACER(v) && ((Tracer *)v)->trace_id == id;
}

typedef struct WhileJvp {
  Opaque base;
  Value *cf, *bf, *tree;   /* the user's functions and init (its structure) */
  unsigned id;             /* the jvp trace */
  int n, k;                /* leaves, and those with tangents */
  bool *diff;              /* leaf i has a tangent */
  bool *grow;              /* leaf i got one from the body, without diff[i] */
  bool grew;               /* some grow[i] was set: stage again */
} WhileJvp;

static void whilejvp_free(Value *v) {
  WhileJvp *w = (WhileJvp *)v;
  val_decref(w->cf);
  val_decref(w->bf);
  val_decref(w->tree);
  shm_free(w->diff);
  shm_free(w->grow);
}

static const OpaqueType whilejvp_type = {"while_loop JVP", whilejvp_free, NULL, NULL, NULL, NULL, NULL};

/* The primal tree from the staged carry (primals, tangents). */
static Value *carry_primals(WhileJvp *w, Value *carry, Value *const **items) {
  size_t n;
  Value *ps = tuple_get(carry, 0);
  if (!val_seq(ps, &n, items) || (int)n != w->n)
    return err_set(ERR_TYPE, "while_loop: malformed carry");
  int pos = 0;
  return pytree_replace(w->tree, is_array_leaf, (Value **)*items, &pos);
}

/* The condition on the primals, with the trace re-entered as for the
 * body: it may close over a value being differentiated (its primal
 * decides). */
static Value *wj_cond(Value *self, const CallArgs *a) {
  WhileJvp *w = (WhileJvp *)self;
  Value *const *items;
  Value *t = carry_primals(w, a->args[0], &items);
  TraceReentry prev = trace_reenter(w->id);
  Value *p = t ? val_call_n(w->cf, 1, &t) : NULL;
  trace_reenter_end(prev);
  Value *r = p ? ad_primal_of(p, w->id) : NULL;
  if (p) val_decref(p);
  if (t) val_decref(t);
  return r;
}

/* The staged carry (primals, tangents) of the body's results [l]: NULL,
 * with w->grew set, when a leaf without a tangent got one. */
static Value *wj_results(WhileJvp *w, const PyLeaves *l) {
  if (l->n != w->n)
    return err_set(ERR_TYPE, "while_loop body_fun must return a carry of the init's structure");
  for (int i = 0; i < w->n; i++) {
    AVal a;   /* an integer leaf's tangent is zero (float0): never carried */
    if (!w->diff[i] && is_jvp_of(l->v[i], w->id) && ops_aval(l->v[i], &a) == 0 &&
        dt_is_float(a.dtype))
      w->grow[i] = w->grew = true;
  }
  if (w->grew) return err_set(ERR_VALUE, "while_loop: the carry's tangents grew");
  Value *po = tuple_new((size_t)w->n), *to = tuple_new((size_t)w->k), *r = NULL;
  for (int i = 0, k = 0; po && to && i < w->n; i++) {
    tuple_set_steal(po, (size_t)i, ad_primal_of(l->v[i], w->id));
    if (w->diff[i]) tuple_set_steal(to, (size_t)k++, ad_tangent_of(l->v[i], w->id));
  }
  r = po && to ? tuple_pack(2, (Value *[]){po, to}) : NULL;
  if (po) val_decref(po);
  if (to) val_decref(to);
  return r;
}

/* The body: the user's body on JVP tracers of the re-entered trace, its
 * results split back into primals and tangents. */
static Value *wj_body(Value *self, const CallArgs *a) {
  WhileJvp *w = (WhileJvp *)self;
  Value *const *ps, *const *ts;
  size_t nt;
  if (!val_seq(a->args[0], &nt, &ps) || nt != 2) return err_set(ERR_TYPE, "while_loop: malformed carry");
  Value *tan = tuple_get(a->args[0], 1);
  if (!val_seq(tuple_get(a->args[0], 0), &nt, &ps) || !val_seq(tan, &nt, &ts))
    return err_set(ERR_TYPE, "while_loop: malformed carry");
  unsigned id = w->id;
  TraceReentry prev = trace_reenter(id);
  Value **in = shm_calloc((size_t)w->n + 1, sizeof(Value *)), *res = NULL, *r = NULL;
  int made = 0;
  for (int i = 0, k = 0; in && i < w->n; i++, made++) {
    in[i] = w->diff[i] ? ad_jvp_tracer(id, val_incref(ps[i]), val_incref(ts[k++])) : val_incref(ps[i]);
    if (!in[i]) break;
  }
  int pos = 0;
  Value *arg = in && made == w->n ? pytree_replace(w->tree, is_array_leaf, in, &pos) : NULL;
  if (arg) res = val_call_n(w->bf, 1, &arg);
  trace_reenter_end(prev);
  PyLeaves l = {0};
  if (res && pytree_flatten(res, is_array_leaf, &l) == 0) r = wj_results(w, &l);
  pytree_leaves_free(&l);
  release(in, (size_t)made);
  shm_free(in);
  if (arg) val_decref(arg);
  if (res) val_decref(res);
  return r;
}

/* The staged carry (primals, tangents) of init's leaves [l]. */
static Value *wj_carry(WhileJvp *w, const PyLeaves *l) {
  Value *ps = tuple_new((size_t)l->n), *ts = list_new(4), *carry = NULL;
  bool ok = ps && ts;
  for (int i = 0; ok && i < l->n; i++) {
    tuple_set_steal(ps, (size_t)i, ad_primal_of(l->v[i], w->id));
    if (w->diff[i]) {
      Value *t = ad_tangent_of(l->v[i], w->id);
      ok = t && list_append_steal(ts, t) == 0;
    }
  }
  w->k = ok ? (int)list_len(ts) : 0;
  Value *tt = ok ? tuple_pack(list_len(ts), ((List *)ts)->items) : NULL;
  carry = tt ? tuple_pack(2, (Value *[]){ps, tt}) : NULL;
  if (tt) val_decref(tt);
  if (ps) val_decref(ps);
  if (ts) val_decref(ts);
  if (!carry && !err_occurred()) err_nomem();
  return carry;
}

/* init's tree from the loop's result [out] (primals, tangents). */
static Value *wj_unpack(WhileJvp *w, Value *init, Value *out) {
  Value *const *po, *const *to;
  size_t np, nto;
  if (!val_seq(tuple_get(out, 0), &np, &po) || !val_seq(tuple_get(out, 1), &nto, &to))
    return err_set(ERR_TYPE, "while_loop: malformed carry");
  Value **leaves = shm_calloc((size_t)w->n + 1, sizeof(Value *)), *r = NULL;
  int made = 0;
  for (int i = 0, k = 0; leaves && i < w->n; i++, made++)
    if (!(leaves[i] = w->diff[i] ? ad_jvp_tracer(w->id, val_incref(po[i]), val_incref(to[k++]))
                                 : val_incref(po[i])))
      break;
  int pos = 0;
  if (leaves && made == w->n) r = pytree_replace(init, is_array_leaf, leaves, &pos);
  release(leaves, (size_t)made);
  shm_free(leaves);
  return r;
}

/* while's forward-mode rule (HigherLoopRule): a while_loop under jit
 * whose carry [init] holds JVP tracers of jvp trace [id] (0: the
 * innermost in init), or whose body closes over one: one staged loop,
 * run by [loop], over the carry's primals and tangents.  The result has
 * init's structure, its float leaves JVP tracers of [id].  NULL with the
 * error set. */
static Value *while_jvp(Value *cf, Value *bf, Value *init, unsigned id,
                        Value *(*loop)(Value *cf, Value *bf, Value *init)) {
  PyLeaves l = {0};
  if (pytree_flatten(init, is_array_leaf, &l) < 0) return NULL;
  bool innermost = id == 0;
  for (int i = 0; innermost && i < l.n; i++)
    if (IS_JVP_TRACER(l.v[i]) && ((Tracer *)l.v[i])->trace_id > id) id = ((Tracer *)l.v[i])->trace_id;
  WhileJvp *w = shm_calloc(1, sizeof *w);
  Value *r = NULL, *cfn = NULL, *bfn = NULL;
  if (!w || !(w->diff = shm_calloc((size_t)l.n + 1, sizeof(bool))) ||
      !(w->grow = shm_calloc((size_t)l.n + 1, sizeof(bool)))) {
    err_nomem();
    if (w) shm_free(w->diff);
    shm_free(w);
    pytree_leaves_free(&l);
    return NULL;
  }
  val_init(&w->base.hdr, V_OPAQUE);
  w->base.ot = &whilejvp_type;
  w->cf = val_incref(cf);
  w->bf = val_incref(bf);
  w->tree = val_incref(init);
  w->id = id;
  w->n = l.n;
  for (int i = 0; i < l.n; i++) w->diff[i] = is_jvp_of(l.v[i], id);
  cfn = bound_new("cond_fun", wj_cond, &w->base.hdr);
  bfn = cfn ? bound_new("body_fun", wj_body, &w->base.hdr) : NULL;
  /* each round adds a leaf's tangent, so at most n + 1 of them */
  for (int round = 0; bfn && round <= l.n; round++) {
    Value *carry = wj_carry(w, &l);
    Value *out = carry ? loop(cfn, bfn, carry) : NULL;
    if (carry) val_decref(carry);
    if (out) {
      r = wj_unpack(w, init, out);
      val_decref(out);
      break;
    }
    if (!w->grew) break;
    err_clear();
    w->grew = false;
    for (int i = 0; i < l.n; i++) {
      w->diff[i] = w->diff[i] || w->grow[i];
      w->grow[i] = false;
    }
  }
  pytree_leaves_free(&l);
  if (cfn) val_decref(cfn);
  if (bfn) val_decref(bfn);
  val_decref(&w->base.hdr);
  return r;
}

/* ---- while: in an xmap body ---- */

/* xmap's interpreter: while_loop(cond_fun, body_fun, carry), each fun
 * its sub-plan closing over its constants. */
static Value *eval_while(const PlanEqn *e, Value **in) {
  const Params *ps = &e->params;
  int64_t cn, bn;
  if (params_int(ps, "cond_nconsts", &cn) < 0 || params_int(ps, "body_nconsts", &bn) < 0) return NULL;
  Value *v[3] = {
      xmap_sub_fn("cond_fun", xmap_pred_call, params_get(ps, "cond_jaxpr"), (int)cn, in, 0), NULL,
      NULL};
  v[1] = v[0] ? xmap_sub_fn("body_fun", xmap_branch_call, params_get(ps, "body_jaxpr"), (int)bn,
                            in + cn, 0)
              : NULL;
  v[2] = v[1] ? tuple_pack((size_t)(e->nin - cn - bn), in + cn + bn) : NULL;
  CallArgs c = {.nargs = 3, .args = v};
  Value *r = v[2] ? ctl_while_loop(&c) : NULL;
  release(v, 3);
  return r;
}

/* A while whose carries keep their named shapes (xmap_carries_settle). */
static bool lowerable_while(const PlanEqn *e) {
  const Params *ps = &e->params;
  int64_t nc = 0;
  Value *c = params_get(ps, "cond_jaxpr"), *b = params_get(ps, "body_jaxpr");
  if (!xmap_subs_lowerable(c) || !xmap_subs_lowerable(b) || params_int(ps, "body_nconsts", &nc) < 0)
    return false;
  Plan *cp = AS_PLAN(c);
  return cp->nout == 1 &&
         xmap_carries_settle(AS_PLAN(b), (int)nc, e->nout, plan_var_named(cp, cp->outs[0].var));
}

/* A while's results carry what its body's do. */
static int named_while(const Params *p, int nops, Value **ops, int nout, NamedShape *out) {
  (void)nops, (void)ops;
  return named_add_plan(out, nout, params_get(p, "body_jaxpr"));
}

static const HigherRules while_rules = {
    .prepare = prepare_while,
    .run = run_while,
    .named = named_while,
    .eval = eval_while,
    .eval_tuple = true,
    .lowerable = lowerable_while,
    .jvp_loop = while_jvp,
    .batch_loop = while_batch,
};

/* ==== scan ======================================================================== */

/* scan: two carry sets, the y slices, the x slices. */
static int prepare_scan(Exec *e, Step *s, const Plan *p) {
  (void)p;
  const PlanEqn *q = s->eqn;
  Plan *body = cmp_param_plan(q, "jaxpr");
  int64_t ncarry, nconsts;
  if (!body || cmp_compile(body) < 0 || params_int(&q->params, "num_carry", &ncarry) < 0 ||
      carry_sets(e, body, (int)ncarry) < 0 || scratch_outs(e, body, (int)ncarry, body->nout) < 0 ||
      params_int(&q->params, "num_consts", &nconsts) < 0)
    return -1;
  for (int i = (int)(nconsts + ncarry); i < body->nin; i++)
    if (cmp_add_scratch(e, &body->vars[body->invars[i]]) < 0) return -1;
  return 0;
}

/* Row [i] of the leading axis of contiguous [x], copied to or from [row]. */
static void row_copy(Array *x, int64_t i, Array *row, bool into_row) {
  size_t n = (size_t)row->size * dt_size(row->dtype);
  char *p = (char *)arr_data(x) + (size_t)i * n;
  if (into_row) shm_memcpy(arr_data(row), p, n);
  else shm_memcpy(p, arr_data(row), n);
}

typedef struct ScanShape {
  int64_t length, nconsts, ncarry;
  bool reverse;
  int nxs, nys;
} ScanShape;

static int scan_shape(Step *s, Plan *body, ScanShape *sh) {
  const Params *ps = &s->eqn->params;
  if (params_int(ps, "length", &sh->length) < 0 || params_int(ps, "num_consts", &sh->nconsts) < 0 ||
      params_int(ps, "num_carry", &sh->ncarry) < 0 || params_bool(ps, "reverse", &sh->reverse) < 0)
    return -1;
  sh->nxs = s->nin - (int)(sh->nconsts + sh->ncarry);
  sh->nys = body->nout - (int)sh->ncarry;
  return 0;
}

/* The iterations of run_scan with the body held. */
static int scan_iterate(Step *s, Workspace *w, Held *body, const ScanShape *sh) {
  Array **bout = cmp_body_outs(s, w), **bins = cmp_body_ins(s, w);
  Array **consts = cmp_step_ins(s, w, 0), **cur = consts + sh->nconsts;
  Array **xs = cur + sh->ncarry, **res = cmp_step_outs(s, w);
  Array **sets[2] = {w->scratch + s->scratch, w->scratch + s->scratch + sh->ncarry};
  Array **ys = w->scratch + s->scratch + 2 * sh->ncarry, **xrow = ys + sh->nys;
  Array *dest[2][LOOP_IN_PLACE_MAX];
  int which = 0;
  for (int64_t it = 0; it < sh->length; it++) {
    int64_t i = sh->reverse ? sh->length - 1 - it : it;
    for (int k = 0; k < sh->nxs; k++) row_copy(xs[k], i, xrow[k], true);
    Array **to = loop_dest(body->e, (int)sh->nconsts, (int)sh->ncarry, sets[which], cur, it > 0,
                           dest[which]);
    shm_memcpy(bout, to, sizeof(Array *) * (size_t)sh->ncarry);
    shm_memcpy(bout + sh->ncarry, ys, sizeof(Array *) * (size_t)sh->nys);
    if (cmp_run_body(body, consts, (int)sh->nconsts, cur, (int)sh->ncarry, xrow, sh->nxs, bout,
                     bins) < 0 ||
        cmp_interrupted() < 0)
      return -1;
    for (int k = 0; k < sh->nys; k++) row_copy(res[sh->ncarry + k], i, ys[k], false);
    cur = to;
    which ^= 1;
  }
  for (int k = 0; k < sh->ncarry; k++) cmp_copy_into(res[k], cur[k]);
  return 0;
}

/* Tapes of a scan's body for each of the two carry sets: t[j] reads set
 * j and the row of xs, writes set j ^ 1 and the row of ys. */
static bool scan_tapes(Step *s, Workspace *w, Held *body, const ScanShape *sh, Tape *t) {
  if (!body->e->tapeable || tl_recording()) return false;
  Array **bout = cmp_body_outs(s, w), **bins = cmp_body_ins(s, w), **consts = cmp_step_ins(s, w, 0);
  Array **sets[2] = {w->scratch + s->scratch, w->scratch + s->scratch + sh->ncarry};
  Array **ys = w->scratch + s->scratch + 2 * sh->ncarry, **xrow = ys + sh->nys;
  for (int j = 0; j < 2; j++) {
    loop_ins(bins, consts, sh->nconsts, sets[j], (int)sh->ncarry);
    shm_memcpy(bins + sh->nconsts + sh->ncarry, xrow, sizeof(Array *) * (size_t)sh->nxs);
    shm_memcpy(bout, sets[j ^ 1], sizeof(Array *) * (size_t)sh->ncarry);
    shm_memcpy(bout + sh->ncarry, ys, sizeof(Array *) * (size_t)sh->nys);
    if (!cmp_tape_build(body->e, body->w, bins, bout, &t[j])) return false;
  }
  return true;
}

/* The iterations of run_scan from tapes: the carries start in set 1. */
static int scan_run_tapes(Step *s, Workspace *w, const ScanShape *sh, const Tape *t) {
  Array **cur = cmp_step_ins(s, w, 0) + sh->nconsts, **xs = cur + sh->ncarry;
  Array **res = cmp_step_outs(s, w);
  Array **sets[2] = {w->scratch + s->scratch, w->scratch + s->scratch + sh->ncarry};
  Array **ys = w->scratch + s->scratch + 2 * sh->ncarry, **xrow = ys + sh->nys;
  for (int k = 0; k < sh->ncarry; k++) cmp_copy_into(sets[1][k], cur[k]);
  int j = 1;
  for (int64_t it = 0; it < sh->length; it++, j ^= 1) {
    int64_t i = sh->reverse ? sh->length - 1 - it : it;
    for (int k = 0; k < sh->nxs; k++) row_copy(xs[k], i, xrow[k], true);
    cmp_tape_run(&t[j]);
    if (cmp_interrupted() < 0) return -1;
    for (int k = 0; k < sh->nys; k++) row_copy(res[sh->ncarry + k], i, ys[k], false);
  }
  for (int k = 0; k < sh->ncarry; k++) cmp_copy_into(res[k], sets[j][k]);
  return 0;
}

static int run_scan(Step *s, Workspace *w) {
  Plan *body = AS_PLAN(params_get(&s->eqn->params, "jaxpr"));
  ScanShape sh;
  Held hb;
  if (scan_shape(s, body, &sh) < 0 || cmp_held_take(body, &hb) < 0) return -1;
  Tape tapes[2];
  int rc = scan_tapes(s, w, &hb, &sh, tapes) ? scan_run_tapes(s, w, &sh, tapes)
                                             : scan_iterate(s, w, &hb, &sh);
  cmp_held_give(&hb);
  return rc;
}

/* xmap's interpreter: scan(f, carry, xs, length, reverse, unroll), f its
 * sub-plan closing over its constants; its (carry, ys) made one tuple of
 * the equation's results. */
static Value *eval_scan(const PlanEqn *e, Value **in) {
  const Params *ps = &e->params;
  int64_t nc, ncar, len, unroll = 1;
  bool rev;
  if (params_int(ps, "num_consts", &nc) < 0 || params_int(ps, "num_carry", &ncar) < 0 ||
      params_int(ps, "length", &len) < 0 || params_bool(ps, "reverse", &rev) < 0 ||
      (params_get(ps, "unroll") && params_int(ps, "unroll", &unroll) < 0))
    return NULL;
  Value *v[6] = {xmap_sub_fn("f", xmap_scan_call, params_get(ps, "jaxpr"), (int)nc, in, ncar), NULL,
                 NULL, val_int(len), val_incref(val_bool(rev)), val_int(unroll)};
  v[1] = v[0] ? tuple_pack((size_t)ncar, in + nc) : NULL;
  v[2] = v[1] ? tuple_pack((size_t)(e->nin - nc - ncar), in + nc + ncar) : NULL;
  CallArgs c = {.nargs = 6, .args = v};
  Value *r = v[2] && v[3] && v[5] ? ctl_scan(&c) : NULL, *out = NULL;
  release(v, 6);
  if (r && r->type == V_TUPLE && tuple_len(r) == 2) {
    Value *cs = tuple_get(r, 0), *ys = tuple_get(r, 1);
    size_t ncs = tuple_len(cs), nys = tuple_len(ys);
    if ((out = tuple_new(ncs + nys)))
      for (size_t i = 0; i < ncs + nys; i++)
        tuple_set_steal(out, i, val_incref(i < ncs ? tuple_get(cs, i) : tuple_get(ys, i - ncs)));
  } else if (r) {
    err_set(ERR_VALUE, "xmap under jit: scan gave no (carry, ys) pair");
  }
  if (r) val_decref(r);
  return out;
}

/* A scan whose carries keep their named shapes (xmap_carries_settle). */
static bool lowerable_scan(const PlanEqn *e) {
  const Params *ps = &e->params;
  int64_t nc = 0, ncar = 0;
  Value *j = params_get(ps, "jaxpr");
  return xmap_subs_lowerable(j) && params_int(ps, "num_consts", &nc) == 0 &&
         params_int(ps, "num_carry", &ncar) == 0 &&
         xmap_carries_settle(AS_PLAN(j), (int)nc, (int)ncar, NULL);
}

/* A scan's results carry what its body's do. */
static int named_scan(const Params *p, int nops, Value **ops, int nout, NamedShape *out) {
  (void)nops, (void)ops;
  return named_add_plan(out, nout, params_get(p, "jaxpr"));
}

static const HigherRules scan_rules = {
    .prepare = prepare_scan,
    .run = run_scan,
    .named = named_scan,
    .reads_in_place = true,
    .eval = eval_scan,
    .eval_tuple = true,
    .lowerable = lowerable_scan,
};

/* ==== registration ================================================================= */

void ctl_register_rules(void) {
  higher_register(P_COND, &cond_rules);
  higher_register(P_WHILE, &while_rules);
  higher_register(P_SCAN, &scan_rules);
}
