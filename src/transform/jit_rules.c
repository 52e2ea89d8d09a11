/*
 * jit_rules.c - the rules of the call primitives, pjit, shard_map and
 * debug_callback (higher.h), side by side for each: how the compiled
 * executor prepares and runs its equation (jit), whether dead code
 * elimination must keep it, how xmap's plan interpreter evaluates it and
 * whether xmap's lowering can, and shard_map's transpose (grad).  jit.c
 * stages pjit and shard_map equations, ad.c a linearized shard_map's,
 * cli/debug.c debug_callback's (debug_print, breakpoint under jit).
 *
 * Semantics: JAX's pjit_p (a nested jit call runs its sub-plan), its
 * shard_map_p (the body on every device of the mesh, operands split by
 * in_specs and results assembled by out_specs, an effect the compiler
 * keeps since every device must meet every collective) and
 * debug_callback_p (an effect: the callback on the operands' values).
 */
#include "transform/ad.h"
#include "transform/compile_impl.h"
#include "transform/higher.h"
#include "transform/jit.h"
#include "transform/xmap.h"
#include "spmd/shardmap.h"

/* ==== pjit ======================================================================== */

static int prepare_pjit(Exec *e, Step *s, const Plan *p) {
  (void)e, (void)p;
  return cmp_compile(cmp_param_plan(s->eqn, "jaxpr"));
}

static int run_pjit(Step *s, Workspace *w) {
  Array **outs = cmp_step_outs(s, w);
  return cmp_run_into(AS_PLAN(params_get(&s->eqn->params, "jaxpr")), cmp_step_ins(s, w, 0), outs);
}

/* xmap's interpreter: the sub-plan, equation by equation. */
static Value *eval_pjit(const PlanEqn *e, Value **in) {
  return xmap_eval_plan(AS_PLAN(params_get(&e->params, "jaxpr")), in);
}

static bool lowerable_pjit(const PlanEqn *e) {
  return xmap_subs_lowerable(params_get(&e->params, "jaxpr"));
}

static const HigherRules pjit_rules = {
    .prepare = prepare_pjit,
    .run = run_pjit,
    .eval = eval_pjit,
    .eval_tuple = true,
    .lowerable = lowerable_pjit,
};

/* ==== shard_map ==================================================================== */

/* A ShardFn running the compiled body, kept as the step's own:
 * shardmap.c's call machinery then runs one plan on every device. */
static int prepare_shard_map(Exec *e, Step *s, const Plan *p) {
  (void)e;
  const PlanEqn *q = s->eqn;
  Plan *body = cmp_param_plan(q, "jaxpr");
  Value *mesh = params_get(&q->params, "mesh"), *ins = params_get(&q->params, "in_specs");
  Value *outs = params_get(&q->params, "out_specs"), *cr = params_get(&q->params, "check_rep");
  if (!body || !mesh || !ins || !outs || cmp_compile(body) < 0) return -1;
  bool check = cr && IS_ARRAY(cr) && arr_get_i64(AS_ARRAY(cr), 0);
  /* the printed out_specs is a tuple; one result is one array */
  if (outs->type == V_TUPLE && tuple_len(outs) == 1 && body->nout == 1) outs = tuple_get(outs, 0);
  s->own = shardmap_new(p->name ? p->name : "shard_map", &body->hdr, mesh, ins, outs, check);
  return s->own ? 0 : -1;
}

static int run_shard_map(Step *s, Workspace *w) {
  CallArgs a = {.nargs = s->nin, .args = cmp_step_values(s, w)};
  Value *r = shardmap_call(s->own, &a);
  if (!r) return -1;
  for (int k = 0; k < s->nout; k++) {
    Value *x = r->type == V_TUPLE ? tuple_get(r, (size_t)k) : r;
    cmp_copy_into(w->slot[s->out[k]], AS_ARRAY(x));
  }
  val_decref(r);
  return 0;
}

/* Its errors (specs, replication) belong to the call; not lowerable in
 * an xmap body (the body takes the batching path). */
static const HigherRules shard_map_rules = {
    .prepare = prepare_shard_map,
    .run = run_shard_map,
    .effectful = true,
    .own_errors = true,
};

/* ==== debug_callback ================================================================ */

static int prepare_callback(Exec *e, Step *s, const Plan *p) {
  (void)e, (void)p;
  if (params_get(&s->eqn->params, "callback")) return 0;
  return err_set(ERR_VALUE, "debug_callback without a callback"), -1;
}

/* Calls the staged callback with the operands' values. */
static int run_callback(Step *s, Workspace *w) {
  Value *r = val_call_n(params_get(&s->eqn->params, "callback"), s->nin, cmp_step_values(s, w));
  val_decref(r);
  return r ? 0 : -1;
}

static const HigherRules callback_rules = {
    .prepare = prepare_callback,
    .run = run_callback,
    .effectful = true,
};

/* ==== registration ================================================================== */

void jit_register_rules(void) {
  higher_register(P_PJIT, &pjit_rules);
  higher_register(P_DEBUG_CALLBACK, &callback_rules);
  PrimRules sm = {.transpose = ad_shard_map_transpose, .higher = &shard_map_rules};
  prim_register(P_SHARD_MAP, &sm);
}
