/*
 * jit_rules.c - the rules of the call primitives pjit and debug_callback
 * (higher.h), side by side for each: how the compiled executor prepares
 * and runs its equation (jit), whether dead code elimination must keep
 * it, how xmap's plan interpreter evaluates it and whether xmap's
 * lowering can.  jit.c stages pjit equations, cli/debug.c
 * debug_callback's (debug_print, breakpoint under jit).  shard_map's
 * rules are shardmap_rules.c's.
 *
 * Semantics: JAX's pjit_p (a nested jit call runs its sub-plan) and
 * debug_callback_p (an effect: the callback on the operands' values).
 */
#include "transform/compile_impl.h"
#include "transform/higher.h"
#include "transform/jit.h"
#include "transform/trace.h"
#include "transform/xmap.h"

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

/* An interpreter's (xmap's, the partitioner's): the callback on the
 * operands' values, or, under a trace, the equation staged again. */
static Value *eval_callback(const PlanEqn *e, Value **in) {
  bool traced = prim_tracing();
  for (int i = 0; !traced && i < e->nin; i++) traced = prim_value_is_staged(in[i]);
  if (traced) {
    Params q;
    params_init(&q);
    for (int i = 0; i < e->params.n; i++) params_add(&q, e->params.p[i].name, val_incref(e->params.p[i].value));
    return trace_emit(P_DEBUG_CALLBACK, &q, e->nin, in, 0, NULL);
  }
  Value *r = val_call_n(params_get(&e->params, "callback"), e->nin, in);
  if (!r) return NULL;
  val_decref(r);
  return tuple_new(0);
}

static const HigherRules callback_rules = {
    .prepare = prepare_callback,
    .run = run_callback,
    .eval = eval_callback,
    .eval_tuple = true,
    .effectful = true,
};

/* ==== registration ================================================================== */

void jit_register_rules(void) {
  higher_register(P_PJIT, &pjit_rules);
  higher_register(P_DEBUG_CALLBACK, &callback_rules);
}
