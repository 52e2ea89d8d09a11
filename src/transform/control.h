/*
 * control.h - structured control flow: cond, switch, while_loop,
 * fori_loop and scan (LANGUAGE.md §6; semantics: jax.lax and seed 004).
 *
 * Each is usable eagerly and under jit:
 *   - eagerly (no trace active on this thread) the functions are simply
 *     called: cond/switch pick a branch by the concrete predicate or index
 *     (switch clamps it), the loops loop in the evaluator.  Inside an
 *     eager shard_map body every device follows its own path.
 *   - while tracing, every function is traced once into a sub-plan
 *     (trace.h) and one equation is recorded:
 *       cond[branches=(false, true)]     index (convert_element_type of
 *                                        the predicate), captures, operands
 *       cond[branches=(...)]             for switch: clamp 0 index n-1
 *       while[body_jaxpr body_nconsts cond_jaxpr cond_nconsts]
 *       scan[jaxpr length linear num_carry num_consts reverse unroll]
 *     fori_loop(lo, hi, f, x) is a while over the carry (i, hi, x), as
 *     seed 004's func10 shows.  What a function closes over becomes its
 *     sub-plan's leading inputs (constants), passed as operands; cond
 *     branches all take the union of the captures, in order.
 *
 * Operands and carries are pytrees: arrays and numbers as leaves inside
 * tuples and lists.  Errors (ERR_TYPE / ERR_VALUE): branches returning
 * different types ("cond branches must return the same types: ..."), a
 * loop body changing the carry's types, a predicate that is not a scalar,
 * xs of different lengths.  A weakly typed carry that the body makes
 * strongly typed (a 0. carry accumulating f32 arrays) is retraced with a
 * strong type, as JAX does.  Replication types (vma) are JAX's, eagerly
 * and under jit alike: a loop body must return each carry varying over
 * the mesh axes it came in with (under check_rep), and a cond's results
 * vary over what its branches' vary over, not over its predicate's axes.
 */
#ifndef SHMAP_CONTROL_H
#define SHMAP_CONTROL_H

#include "lang/eval.h"

/* switch(index, branches, *operands), while_loop(cond_fun, body_fun,
 * init_val) and scan(f, init, xs, length=None, reverse=False) as the
 * language calls them (eagerly, staged, or batched), for a lowered xmap
 * body whose sub-plans are the functions (xmap.h). */
Value *ctl_switch(const CallArgs *a);
Value *ctl_while_loop(const CallArgs *a);
Value *ctl_scan(const CallArgs *a);

/* Registers cond, switch, while_loop, fori_loop, scan at the top level
 * and in `lax` (so jax.lax.cond resolves), and the rows of cond, while
 * and scan (ctl_register_rules).  0 or -1 with the error set. */
int ctl_register(Env *builtins);

/* Registers the rows of cond, while and scan in the primitive table
 * (control_rules.c, higher.h): their compiled steps, their evaluation in
 * an xmap body, while's forward-mode and batching rules.  Not
 * thread-safe: at start-up. */
void ctl_register_rules(void);

#endif
