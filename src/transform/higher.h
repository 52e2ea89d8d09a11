/*
 * higher.h - the rules of the higher-order primitives (cond, while, scan,
 * pjit, shard_map, debug_callback, xmap, pdot): what the transformations
 * of this layer need of a primitive that takes sub-plans, beside the
 * PrimRules every primitive has (array/prim.h, whose row points here
 * through PrimRules.higher).
 *
 * Each family file fills the rows of its primitives at start-up with
 * prim_register, the rules of each primitive side by side:
 * control_rules.c (cond, while, scan), jit_rules.c (pjit,
 * debug_callback), shardmap_rules.c (shard_map), xmap.c (xmap, pdot).
 * The machinery (compile.c's executor, xmap.c's plan interpreter and
 * lowering, control.c's staged while_loop, ad.c's shard_map call on
 * transformed values) dispatches on the slots and names no rule; an
 * empty slot is the error the machinery gave before for that primitive ("jit:
 * pdot cannot be compiled"), or prim_rule_missing.  Semantics: JAX's
 * lax.control_flow, pjit and shard_map modules, which hold each of these
 * primitives' lowering, batching and differentiation rules beside it.
 */
#ifndef SHMAP_HIGHER_H
#define SHMAP_HIGHER_H

#include "array/prim.h"
#include "transform/plan.h"

struct CmpExec;
struct CmpStep;
struct CmpWorkspace;

/* A while_loop(cf, bf, init) under a trace whose carry, or a value its
 * functions close over, is being transformed: the loop (a new reference,
 * or NULL with the error set) that the transformation's rule makes of the
 * language's [loop], for the transformation of trace [id] (0: the
 * innermost one the carry holds).  Semantics: JAX's while_loop JVP and
 * batching rules (lax/control_flow/loops.py). */
typedef Value *(*HigherLoopRule)(Value *cf, Value *bf, Value *init, unsigned id,
                                 Value *(*loop)(Value *cf, Value *bf, Value *init));

/* A call of the higher-order function [f] (a shard_map function) on [a],
 * among whose arguments the innermost tracer is one of the trace the rule
 * is for: the transformation's rule runs the call (a new reference, or
 * NULL with the error set).  Semantics: JAX's shard_map JVP, partial
 * evaluation and batching rules (experimental/shard_map.py). */
typedef Value *(*HigherCallRule)(Value *f, const CallArgs *a);

typedef struct HigherRules {
  /* ---- jit: the compiled executor (compile.c, compile_impl.h) ---- */
  /* Compiles the step's sub-plans and reserves its scratch (from
   * step->scratch on); may keep what it makes in step->own.  0, or -1
   * with the error set.  NULL: nothing to prepare. */
  int (*prepare)(struct CmpExec *e, struct CmpStep *step, const Plan *p);
  /* Runs the step on its operands into its results' slots.  0, or -1
   * with the error set.  NULL: the primitive is not compiled ("jit: pdot
   * cannot be compiled"). */
  int (*run)(struct CmpStep *step, struct CmpWorkspace *w);
  bool effectful;       /* never dropped as dead code (a callback, devices' collectives) */
  bool reads_in_place;  /* its plan inputs are read in place: made contiguous */
  bool own_errors;      /* its errors belong to the call, not to the equation's line */
  bool adopts_results;  /* its run makes new arrays for its results and hands them to
                           cmp_adopt where a result's slot is empty (SL_VIEW): a
                           result that feeds another step is not copied */
  /* ---- xmap under jit: staging and the plan interpreter (xmap.c) ---- */
  /* The named shapes of the [nout] results of the equation of [p] over
   * [ops] staged in an xmap body, added to [out] (zeroed by the caller):
   * what its sub-plans' results carry, not the operands' union.  0, or
   * -1 with the error set.  NULL: the operands' union (trace.h). */
  int (*named)(const Params *p, int nops, Value **ops, int nout, NamedShape *out);
  /* Evaluates the equation on [in] (borrowed) under the xmap's batch
   * traces: a new reference, a tuple of its results when [eval_tuple],
   * else its one result.  NULL: left to prim_bind. */
  Value *(*eval)(const PlanEqn *e, Value **in);
  bool eval_tuple;
  /* Whether xmap's lowering can evaluate the equation (its sub-plans'
   * equations all lowerable).  NULL: not lowerable, the body goes the
   * batching path. */
  bool (*lowerable)(const PlanEqn *e);
  /* ---- grad and vmap of the staged language-level loop (control.c) ---- */
  HigherLoopRule jvp_loop;     /* forward mode over the carry; NULL: not implemented */
  HigherLoopRule batch_loop;   /* vmap over the carry; NULL: not implemented */
  /* ---- grad and vmap of a language-level call (shardmap.c's
   * shardmap_set_differentiator hook, filled by ad.c) ---- */
  HigherCallRule jvp_call;     /* on JVP tracers (forward or reverse mode); NULL: not implemented */
  HigherCallRule batch_call;   /* on batch tracers; NULL: not implemented */
} HigherRules;

/* The higher-order rules of primitive [id], or NULL (a first-order
 * primitive, or a row not registered). */
static inline const HigherRules *higher_rules(PrimId id) { return prim_table[id].rules.higher; }

/* Registers [h] as the rules of higher-order primitive [id]: a row with
 * no shape rule or kernel, which the tracer and the executor leave to
 * the higher-order rules. */
static inline void higher_register(PrimId id, const HigherRules *h) {
  PrimRules r = {0};
  r.higher = h;
  prim_register(id, &r);
}

#endif
